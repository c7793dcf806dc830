"""Linear healing: agentcore's `LinearHealer` (@1e75c535, `history_mode="linear"`), offline.

For an append-only agent the gateway can feed the engine, for every earlier turn, the exact ids
it already served instead of the client's re-rendered history:

    fed(N+1) = served_prefix + close(N) + tail(N+1)      served_prefix = fed(N) + output(N)

`close` is the template's glue after an assistant message (`<|im_end|>\\n` for Qwen), found by
rendering two probe assistants and taking the common suffix; `tail` is the genuinely new messages
plus the generation prompt, rendered from the healer's *own* stored history so the client's
re-serialisation of earlier turns never reaches the engine. Linearity is decided on messages
(dict equality, tools equal), not tokens, so a re-keyed but equal tool call stays healed.

Two ways to get `close` and `tail`:
* the **delta path** (agentcore PR #143, on by default): work in text, slice the tail off the
  rendered text and encode only the small pieces (no BPE merge across the boundary, no full
  re-tokenisation of a long history);
* the **full path**: render the stored history twice in token space and probe the closer there.
  The delta path falls back to it silently when its text checks fail; `delta=False` forces it.

When the history is not an append-only extension, `on_nonlinear` decides: `"reset"` re-anchors
on the plain render (the next commit starts a fresh linear segment), `"error"` raises
`NonlinearHistory` (a RuntimeError), `"passthrough"` stops healing the session until `drop`.

Counters per session (`pop_stats`) and run-cumulative (`counters`): healed_turns,
healed_prefix_tokens, nonlinear, close_unresolved as upstream, plus `resets` (reset jumps;
upstream has none) and the cause of every nonlinear turn, `nonlinear = nonlinear_history +
nonlinear_template`:
* `nonlinear_history`: the request is not an append-only extension of the stored messages (an
  edited or dropped message, a retry, changed tools or template kwargs);
* `nonlinear_template`: it is, but the template does not render the stored history as a prefix
  of the extended render (it rewrites history: Qwen3 drops earlier reasoning after a new user
  message, or renders a last assistant differently once more messages follow), or the closer
  after the last assistant cannot be resolved (also counted in `close_unresolved`).
`paths` counts which path produced each healed turn (diagnostic only).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from trace_tools.errors import ReplayError, UnknownName
from trace_tools.ids import suffix_prefix_overlap
from trace_tools.render.base import RendererLike
from trace_tools.strategies.declarations import HEALER_COUNTERS, ON_NONLINEAR

log = logging.getLogger(__name__)

COUNTER_KEYS = HEALER_COUNTERS  # declared with the strategies that heal (`declarations`)
# Two probe bodies whose last characters differ, so the common suffix of their renders is
# exactly the template glue after an assistant message, never a piece of the body.
PROBE_A = "trace-tools closer probe, first body ends in A"
PROBE_B = "trace-tools closer probe, second body ends in Z"


class NonlinearHistory(ReplayError, RuntimeError):
    """A session broke the append-only assumption under `on_nonlinear="error"`."""


class UnknownNonlinearMode(UnknownName, ValueError):
    """`on_nonlinear` is not one of ON_NONLINEAR (a ValueError, as upstream raises)."""


@dataclass(slots=True)
class _State:
    # The served prefix is `fed + output`, kept as the two lists it is made of: joined only into
    # the next healed prompt, so a turn copies the session's ids once, not twice.
    fed: Sequence[int]
    output: Sequence[int]
    prev_messages: list[dict]
    prev_tools: list[dict] | None
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class HealOutcome:
    """The ids to feed and how they were obtained.

    `event`: "rendered" (first turn of a segment, or a session in passthrough), "healed",
    "reset" (nonlinear jump re-anchored), "passthrough" (the jump that switched healing off).
    `path`: "delta" or "full" for a healed turn, None otherwise.
    """

    ids: list[int]
    event: str
    path: str | None = None


class LinearHealer:
    """Per-session prefix healer over any `RendererLike`.

    Args:
        renderer: renders messages to ids (`render`), to text (`render_text`) and encodes text.
        on_nonlinear: "reset" (default), "error" or "passthrough"; see the module docstring.
        delta: use the text-space delta path first (default True); False always renders in full.
    """

    def __init__(self, renderer: RendererLike, on_nonlinear: str = "reset", *, delta: bool = True):
        if on_nonlinear not in ON_NONLINEAR:
            raise UnknownNonlinearMode("on_nonlinear mode", on_nonlinear, ON_NONLINEAR)
        self.renderer, self.on_nonlinear, self.delta = renderer, on_nonlinear, delta
        self._state: dict[str, _State] = {}
        self._disabled: set[str] = set()
        self._per_sid: dict[str, Counter] = {}
        self.counters: Counter = Counter()
        self.paths: Counter = Counter()

    # -- the two calls a gateway makes per turn ---------------------------------------------
    def heal(
        self, sid: str, messages: list[dict], tools: Sequence[dict] | None = None, **template_kwargs: Any
    ) -> list[int]:
        """The prompt ids to feed the engine for this turn (see `heal_turn`)."""
        return self.heal_turn(sid, messages, tools, **template_kwargs).ids

    def heal_turn(
        self, sid: str, messages: list[dict], tools: Sequence[dict] | None = None, **template_kwargs: Any
    ) -> HealOutcome:
        """Heal one turn: splice the served prefix when the history only grew, else handle the jump."""
        state = self._state.get(sid)
        if state is None or sid in self._disabled:
            return HealOutcome(self._render(messages, tools, True, template_kwargs), "rendered")
        new = linear_delta(state, messages, tools, template_kwargs)
        if new is None:
            return self._handle_nonlinear(sid, self._render(messages, tools, True, template_kwargs), "history")
        if self.delta:
            pieces = self._delta_pieces(state, new)
            if pieces is not None:
                return self._splice(sid, state, *pieces, path="delta")
        return self._heal_full(sid, state, new)

    def commit(
        self,
        sid: str,
        fed_prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        messages: list[dict],
        response_message: dict | None,
        tools: Sequence[dict] | None = None,
        **template_kwargs: Any,
    ) -> None:
        """Advance the session after a turn was recorded: served ids and messages grow by one turn.

        Call it only for turns that are actually recorded, so the healer stays in lockstep with
        the trajectory manager. A no-op for a session in passthrough. The two id lists are kept,
        not copied: the caller must not change them afterwards.
        """
        if sid in self._disabled:
            return
        closing = response_message or {"role": "assistant", "content": ""}
        self._state[sid] = _State(
            fed_prompt_ids,
            output_ids,
            [*messages, closing],
            _normalize_tools(tools),
            dict(template_kwargs),
        )

    # -- stats -------------------------------------------------------------------------------
    def pop_stats(self, sid: str) -> dict[str, int]:
        """This session's counters in a fixed schema (zeros filled in); a second pop is all zeros."""
        counts = self._per_sid.pop(sid, Counter())
        return {key: counts[key] for key in COUNTER_KEYS}

    def drop(self, sid: str) -> None:
        """Forget the session: state, passthrough flag and per-session counters."""
        self._state.pop(sid, None)
        self._disabled.discard(sid)
        self._per_sid.pop(sid, None)

    def _bump(self, sid: str, key: str, n: int = 1) -> None:
        self.counters[key] += n
        self._per_sid.setdefault(sid, Counter())[key] += n

    # -- the paths ---------------------------------------------------------------------------
    def _heal_full(self, sid: str, state: _State, new: list[dict]) -> HealOutcome:
        kwargs = state.template_kwargs
        r_prev = self._render(state.prev_messages, state.prev_tools, False, kwargs)
        r_ext = self._render(state.prev_messages + new, state.prev_tools, True, kwargs)
        if r_ext[: len(r_prev)] != r_prev:  # the template is not prefix-consistent here
            return self._handle_nonlinear(sid, r_ext, "template")
        close = self.assistant_close(state.prev_messages, state.prev_tools, r_prev, kwargs)
        if close is None:
            self._bump(sid, "close_unresolved")
            return self._handle_nonlinear(sid, r_ext, "template")
        return self._splice(sid, state, close, r_ext[len(r_prev) :], path="full")

    def _delta_pieces(self, state: _State, new: list[dict]) -> tuple[list[int], list[int]] | None:
        """(close ids, tail ids) computed in text space, or None to fall back to the full path.

        The tail is sliced off the rendered *text* and encoded alone, so a merge the tokenizer
        would make across the boundary (Qwen encodes "\\n\\n" as one token) cannot shift it.
        """
        prev, tools, kwargs = state.prev_messages, state.prev_tools, state.template_kwargs
        before = self.renderer.render_text(prev, tools, False, **kwargs)
        after = self.renderer.render_text(prev + new, tools, True, **kwargs)
        if not after.startswith(before):
            return None
        probe_a = self.renderer.render_text(prev[:-1] + [_probe(PROBE_A)], tools, False, **kwargs)
        probe_b = self.renderer.render_text(prev[:-1] + [_probe(PROBE_B)], tools, False, **kwargs)
        close_text = probe_a[len(probe_a) - _common_suffix_len(probe_a, probe_b) :]
        if not before.endswith(close_text):
            return None
        return self.renderer.encode(close_text), self.renderer.encode(after[len(before) :])

    def assistant_close(
        self,
        prev_messages: list[dict],
        tools: Sequence[dict] | None,
        r_prev: Sequence[int],
        template_kwargs: dict | None = None,
    ) -> list[int] | None:
        """The template's glue after the last assistant message, in ids; None if it cannot be trusted.

        The glue is the common suffix of two renders that differ only in the last assistant's
        body. If the stored history does not end with that glue (the closer depends on the
        message type, e.g. tool calls), guessing would corrupt the prompt, so None.
        """
        kwargs = template_kwargs or {}
        before = list(prev_messages[:-1])
        probe_a = self._render(before + [_probe(PROBE_A)], tools, False, kwargs)
        probe_b = self._render(before + [_probe(PROBE_B)], tools, False, kwargs)
        n = _common_suffix_len(probe_a, probe_b)
        close = list(probe_a[len(probe_a) - n :])
        if close and list(r_prev[-len(close) :]) != close:
            return None
        return close

    def _splice(self, sid: str, state: _State, close: list[int], tail: list[int], *, path: str) -> HealOutcome:
        # Trimmed against closer + tail, not the closer alone as upstream does: a template without a
        # closer (GLM) renders the served stop token again as the tail's first token. Identical
        # whenever the closer is non-empty (the served stop token is its head).
        pieces = [*close, *tail]
        glue = trim_overlap(_served_tail(state, len(pieces)), pieces)
        self._bump(sid, "healed_turns")
        self._bump(sid, "healed_prefix_tokens", len(state.fed) + len(state.output) + max(len(glue) - len(tail), 0))
        self.paths[path] += 1
        return HealOutcome([*state.fed, *state.output, *glue], "healed", path)

    def _handle_nonlinear(self, sid: str, rendered: list[int], cause: str) -> HealOutcome:
        """A turn that cannot be healed; `cause` is "history" (not an append) or "template" (not a prefix)."""
        self._bump(sid, "nonlinear")
        self._bump(sid, f"nonlinear_{cause}")
        if self.on_nonlinear == "error":
            raise NonlinearHistory(
                f"linear history mode: session {sid!r} broke the append-only assumption (a prior "
                "message was edited or dropped, or the tools changed); use on_nonlinear=reset or "
                "passthrough, or replay it with the tree strategy"
            )
        self._state.pop(sid, None)
        if self.on_nonlinear == "passthrough":
            self._disabled.add(sid)
            log.warning("linear healing switched off for session %s (history not append-only)", sid)
            return HealOutcome(rendered, "passthrough")
        self._bump(sid, "resets")
        log.info("linear healing re-anchored session %s on a fresh render", sid)
        return HealOutcome(rendered, "reset")

    def _render(
        self, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool, template_kwargs: dict
    ) -> list[int]:
        return list(self.renderer.render(list(messages), tools, generation, **template_kwargs))


def heal_and_commit(healer: LinearHealer, session_id: str, prepared: Any) -> HealOutcome:
    """One gateway step for a prepared turn (see `prepare.PreparedTurn`): heal, then commit its output.

    The recorded `output_ids` are committed as if sampled on the healed prompt (counterfactual).
    """
    kwargs = prepared.turn.chat_template_kwargs or {}
    outcome = healer.heal_turn(session_id, prepared.messages, prepared.tools, **kwargs)
    healer.commit(
        session_id,
        outcome.ids,
        prepared.turn.output_ids,
        prepared.messages,
        prepared.response_message,
        prepared.tools,
        **kwargs,
    )
    return outcome


def heal_session(healer: LinearHealer, session_id: str, prepared_turns: Sequence[Any]) -> list[HealOutcome]:
    """Heal every turn of a session in order, without a trajectory manager (audits, benchmarks)."""
    outcomes = [heal_and_commit(healer, session_id, prepared) for prepared in prepared_turns]
    healer.drop(session_id)
    return outcomes


@dataclass(slots=True)
class PathDifference:
    """A turn where the delta and the full path fed different ids, with the likely cause."""

    session_id: str
    turn_index: int
    delta_event: str
    full_event: str
    position: int  # first id position where the two prompts differ
    cause: str


def path_differences(
    session_id: str, prepared_turns: Sequence[Any], delta: Sequence[HealOutcome], full: Sequence[HealOutcome]
) -> list[PathDifference]:
    """Every turn where `heal_session` on the two paths disagreed, explained (never hidden:
    docs/upstream_restore_linear.md#deviations-and-choices).

    Both paths render the same text; they can only disagree where tokenization depends on
    context: the full path encodes the whole history, the delta path encodes closer and tail on
    their own. A merge across that boundary makes the full render not token-prefix-consistent
    (full resets, delta heals), or splits the tail differently (both heal, ids differ).
    """
    differences = []
    for prepared, d, f in zip(prepared_turns, delta, full):
        if d.ids == f.ids and d.event == f.event:
            continue
        position = next((i for i, (a, b) in enumerate(zip(d.ids, f.ids)) if a != b), min(len(d.ids), len(f.ids)))
        differences.append(
            PathDifference(session_id, prepared.turn.turn_index, d.event, f.event, position, _difference_cause(d, f))
        )
    return differences


def _difference_cause(delta: HealOutcome, full: HealOutcome) -> str:
    if delta.event == "healed" and full.event != "healed":
        return (
            "tokenizer boundary: encoding the whole history merges ids across the closer/tail boundary, "
            "so the full render is not token-prefix-consistent while the text is"
        )
    if delta.event == full.event == "healed":
        return "tokenizer boundary: the closer or tail encoded on its own splits differently than in context"
    return "an earlier disagreement left the two healers in different states"


def linear_delta(
    state: _State, messages: Sequence[dict], tools: Sequence[dict] | None, template_kwargs: dict | None = None
) -> list[dict] | None:
    """The messages appended since the stored history, or None when it is not a pure append.

    Message lists compare with `==` (key order irrelevant, values exact); tools must be equal
    (empty and None are the same) and so must the template kwargs. A retry that resends the
    prompt without the last assistant is shorter than the stored history, hence nonlinear.
    """
    k = len(state.prev_messages)
    if len(messages) < k or list(messages[:k]) != state.prev_messages:
        return None
    if _normalize_tools(tools) != state.prev_tools or dict(template_kwargs or {}) != state.template_kwargs:
        return None
    return list(messages[k:])


def _served_tail(state: _State, n: int) -> list[int]:
    """The last `n` served ids (all of them when fewer): all that `trim_overlap` reads of them."""
    output = state.output
    if len(output) >= n:
        return list(output[len(output) - n :])
    fed = state.fed
    return [*fed[max(len(fed) - (n - len(output)), 0) :], *output]


def trim_overlap(served: Sequence[int], close: Sequence[int]) -> list[int]:
    """`close` minus its longest head that the served ids already end with.

    The served output usually ends with the stop token that opens the glue (`<|im_end|>` then
    `\n`), which must not appear twice.
    """
    return list(close[suffix_prefix_overlap(served, close) :])


def _normalize_tools(tools: Sequence[dict] | None) -> list[dict] | None:
    return list(tools) if tools else None


def _probe(body: str) -> dict:
    return {"role": "assistant", "content": body}


def _common_suffix_len(a: Sequence, b: Sequence) -> int:
    n = 0
    limit = min(len(a), len(b))
    while n < limit and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n
