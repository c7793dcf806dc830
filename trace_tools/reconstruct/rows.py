"""One reconstructed session's turns as rows of the turns table (`TURN_COLUMNS`): each turn's
prompt rendered as the gateway would have, compared with the recorded prompt ids, and where they
differ the first differing token with the text around it."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from trace_tools.data import Session, Turn
from trace_tools.errors import TraceToolsError
from trace_tools.ids import array_prefix, common_prefix_len
from trace_tools.pipeline.prepared import prepare_session
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


class Comparison:
    """Each turn's rendered prompt against its recorded one, a session's turns in order: where
    they first differ.

    Recorded ids that a worker read as int32 arrays (`reconstruct.workers`) are compared without
    becoming lists, which was a tenth of a worker's time. A session's prompts repeat its history,
    so this turn's rendered and recorded prompts each share a prefix with the previous turn's
    (the rendered lists, of shared ints, are compared at memory speed, the arrays by numpy).
    Within the shorter of the two prefixes this turn's prompts agree where the previous turn's
    did: they agree up to that turn's divergence, and differ there if it lies inside. Only the
    rendered ids beyond are converted to an array and compared. Lists are compared as lists."""

    def __init__(self) -> None:
        self._last: tuple[Sequence[int], Any, int] | None = None  # (rendered, recorded, common prefix)

    def forget(self) -> None:
        """The next turn has no previous one to start from (this one was not compared)."""
        self._last = None

    def common_prefix(self, recorded: Sequence[int], rendered: Sequence[int]) -> int:
        """The length of the longest common prefix of the two prompts."""
        if not isinstance(recorded, np.ndarray):
            self._last = None
            return common_prefix_len(recorded, rendered)
        agreed, decided = self._from_last(recorded, rendered)
        end = min(len(recorded), len(rendered))
        if not decided and agreed < end:
            rest = np.fromiter(rendered[agreed:end], dtype=np.int64, count=end - agreed)
            agreed += array_prefix(recorded[agreed:end], rest)
        self._last = (rendered, recorded, agreed)
        return agreed

    def _from_last(self, recorded: Any, rendered: Sequence[int]) -> tuple[int, bool]:
        """(a length over which the prompts agree, whether it is where they first differ)."""
        if self._last is None:
            return 0, False
        last_rendered, last_recorded, last_agreed = self._last
        same = common_prefix_len(rendered, last_rendered)
        same = min(same, len(recorded), len(last_recorded))
        same = array_prefix(recorded[:same], last_recorded[:same])
        # On [0, same) both prompts equal the previous turn's. A previous divergence inside that
        # range lies below both previous lengths, so it is a differing token, and it is this one's.
        return (last_agreed, True) if last_agreed < same else (same, False)


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
