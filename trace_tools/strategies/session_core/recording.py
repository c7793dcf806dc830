"""From a recorded session to requests, and from the server's outcomes to a `ReplayResult`."""

from __future__ import annotations

import copy
from typing import Any, Sequence

from trace_tools.errors import ReplayError
from trace_tools.ids import common_prefix_len
from trace_tools.strategies.session_core.records import (
    Generation,
    SessionRequest,
    TurnOutcome,
)
from trace_tools.strategies.session_core.tito import TitoTokenizer, family_for


def session_requests(prepared: Any) -> list[SessionRequest]:
    """One request per recorded turn of a `PreparedSession`: the RAW messages and tools (miles
    normalizes only through its matchers and template preparation) and the recorded generation
    as the engine's reply."""
    return [request_from_turn(p.turn, p.response_message) for p in prepared.turns]


def request_from_turn(turn: Any, parsed_response: dict | None = None) -> SessionRequest:
    logprobs = list(turn.output_logprobs) if turn.output_logprobs is not None else [0.0] * len(turn.output_ids)
    generation = Generation(
        list(turn.output_ids),
        logprobs,
        turn.finish_reason,
        stored_response(turn.response, parsed_response),
        turn.request_id or "",
    )
    return SessionRequest(
        turn.turn_index, list(turn.messages), turn.tools or None, generation, turn.chat_template_kwargs
    )


def stored_response(recorded: dict | None, parsed: dict | None) -> dict:
    """The assistant message miles stores: the response as returned, content "" when None.

    A dump without `response` falls back to the message parsed from the output ids.
    """
    message = copy.deepcopy(recorded if recorded is not None else parsed) or {"role": "assistant"}
    message.setdefault("role", "assistant")
    if message.get("content") is None:
        message["content"] = ""
    return message


def tito_from_context(ctx: Any, family: str | None = None, renderer: Any = None) -> TitoTokenizer:
    """The TITO tokenizer over `renderer` (default: the context's), family from the context's renderer."""
    if ctx.renderer is None:
        raise ReplayError("session strategies need a renderer; pass --tokenizer (and --chat-template)")
    return TitoTokenizer(renderer or ctx.renderer, family_for(ctx.renderer, family))


def _same_ids(recorded: Sequence[int], ids: Sequence[int] | None) -> bool:
    return (recorded if isinstance(recorded, list) else list(recorded)) == ids  # no copy of a list


def prompt_event(outcome: TurnOutcome, differs_from_recording: bool) -> str:
    """How the turn's prompt was obtained (docs/metrics.md#per-turn vocabulary, plus rejected/failed: none was)."""
    if outcome.rolled_back:
        return "rolled_back"
    if outcome.status != "ok":
        return outcome.status  # "rejected" or "failed": no prompt reached the engine
    if outcome.placement in ("new_root", "sibling"):
        return "new_root" if outcome.placement == "new_root" else "forked"
    return "rendered" if differs_from_recording else "clean"


def record_outcomes(result: Any, outcomes: Sequence[TurnOutcome], recorded: dict[int, Sequence[int] | None]) -> None:
    """Turn events, prompt events, drift positions and the request counters of a replay."""
    for name in ("rejected_requests", "server_errors"):
        result.counters[name] += 0
    drift: int | None = None  # a session's prompts tend to drift at the same position turn after turn
    for outcome in outcomes:
        index = outcome.turn_index
        if outcome.status == "rejected":
            result.turn_events[index] = "rejected"
            result.counters["rejected_requests"] += 1
        elif outcome.status == "failed":
            result.turn_events[index] = "failed"
            result.counters["server_errors"] += 1
        if outcome.status != "ok":
            result.failures[index] = outcome.reason
        if outcome.lenient:
            result.counters["lenient_renders"] += 1
        prompt = recorded.get(index)
        differs = prompt is not None and not _same_ids(prompt, outcome.prompt_ids)
        result.prompt_events[index] = prompt_event(outcome, differs)
        if differs and prompt is not None and outcome.prompt_ids is not None:
            drift = result.drift_positions[index] = common_prefix_len(prompt, outcome.prompt_ids, drift)
