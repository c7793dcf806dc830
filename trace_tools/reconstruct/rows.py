"""One reconstructed session's turns as rows of the turns table (`TURN_COLUMNS`): each turn's
prompt rendered as the gateway would have, compared with the recorded prompt ids, and where they
differ the first differing token with the text around it."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from trace_tools.data import Session, Turn
from trace_tools.errors import TraceToolsError
from trace_tools.ids import common_prefix_len
from trace_tools.pipeline.prepared import prepare_session
from trace_tools.pipeline.recorded import Comparison
from trace_tools.render.canonical import canonicalize_messages

CONTEXT_TOKENS = 12  # tokens shown on each side of a divergence
TURN_COLUMNS = [
    "session_id",
    "turn_index",
    "rendered_len",
    "recorded_len",
    "exact",
    "first_divergence",
    "context",
    "error",
]


def session_turn_rows(session: Session, pool: Any, canonicalization: str, identities: dict) -> list[dict[str, Any]]:
    """The turns' rows of one session (TURN_COLUMNS), rendered with its renderer from `pool`; its
    renderer's identity is added to `identities`, and its render caches are dropped after it."""
    try:
        renderer = pool.for_session(session)
        prepared = prepare_session(session, renderer, canonicalization, "auto", responses=False)
    except TraceToolsError as exc:
        return [_row(turn, None, error=str(exc)) for turn in session.turns]
    identity = dict(getattr(renderer, "identity", {}) or {})
    identities.setdefault(repr(sorted(identity.items())), identity)
    comparison = Comparison()
    rows = [turn_fidelity(renderer, p, comparison) for p in prepared.turns]
    if hasattr(renderer, "reset_caches"):
        renderer.reset_caches()
    return rows


def turn_fidelity(renderer: Any, prepared: Any, comparison: "Comparison | None" = None) -> dict[str, Any]:
    """One row of the turns table (see TURN_COLUMNS) for a prepared turn; `comparison`: the one of
    its session's turns before it, in order (a fresh one compares this turn alone)."""
    turn = prepared.turn
    comparison = comparison or Comparison()
    try:
        rendered = prepared.rendered_prompt_ids()
    except TraceToolsError as exc:
        comparison.forget()
        return _row(turn, None, error=str(exc))
    return _row(turn, rendered, renderer=renderer, comparison=comparison)


def _ints(ids: Sequence[int]) -> list[int]:
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)


def _row(
    turn: Turn,
    rendered: Sequence[int] | None,
    renderer: Any = None,
    error: str | None = None,
    comparison: "Comparison | None" = None,
) -> dict[str, Any]:
    recorded = turn.prompt_ids
    row: dict[str, Any] = {
        "session_id": turn.session_id,
        "turn_index": turn.turn_index,
        "rendered_len": None if rendered is None else len(rendered),
        "recorded_len": None if recorded is None else len(recorded),
        "exact": None,
        "first_divergence": None,
        "context": None,
        "error": error,
    }
    if recorded is None:
        return row
    if rendered is None:
        row["exact"] = False
        return row
    at = (comparison or Comparison()).common_prefix(recorded, rendered)
    row["exact"] = at == len(recorded) == len(rendered)
    if not row["exact"]:
        row["first_divergence"] = at
        row["context"] = divergence_context(renderer, recorded, rendered, at)
    return row


def render_turn(renderer: Any, turn: Turn, canonicalization: str = "slime") -> list[int]:
    """The prompt ids a gateway with this renderer would have fed for `turn`."""
    messages = canonicalize_messages(turn.messages, canonicalization)
    return renderer.render(messages, turn.tools or None, True, **(turn.chat_template_kwargs or {}))


def first_divergence(recorded: Sequence[int], rendered: Sequence[int]) -> int | None:
    """Index of the first differing token; the shorter length when one is a prefix of the other."""

    at = common_prefix_len(recorded, rendered)
    return None if at == len(recorded) == len(rendered) else at


def divergence_context(
    renderer: Any, recorded: Sequence[int], rendered: Sequence[int], at: int, width: int = CONTEXT_TOKENS
) -> str:
    """`…shared text⟨recorded: '…' | rendered: '…'⟩` around token `at`."""
    shared = renderer.decode(_ints(recorded[max(0, at - width) : at]))
    theirs = renderer.decode(_ints(recorded[at : at + width]))
    ours = renderer.decode(_ints(rendered[at : at + width]))
    return f"…{shared}⟨recorded: {theirs!r} | rendered: {ours!r}⟩"
