"""v1: the linear TITO trajectory with one-step rollback (docs/upstream_session.md#v1-the-linear-trajectory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from trace_tools.data import Sample
from trace_tools.strategies.session_core.assembly import assemble_records
from trace_tools.strategies.session_core.errors import (
    RequestRejected,
)
from trace_tools.strategies.session_core.matchers import (
    Matcher,
    common_prefix_messages,
    remembered,
    strict_match,
)
from trace_tools.strategies.session_core.records import (
    ROLE_GATE_SUFFIX,
    Generation,
    Record,
    SessionRequest,
    TurnOutcome,
    check_prefix,
    gate_roles,
    noting_lenient,
    serve,
)
from trace_tools.strategies.session_core.tito import TitoTokenizer

MAX_ASSISTANT_ROLLBACK_STEPS = 1


@dataclass
class LinearTrajectory:
    """v1 session state: committed messages (stored spellings) and one checkpoint per generation."""

    messages: list[dict] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    checkpoints: list[list[int]] = field(default_factory=list)
    message_ends: list[int] = field(default_factory=list)  # per checkpoint: len(request) + 1

    @property
    def num_assistant(self) -> int:
        return len(self.message_ends)

    @property
    def token_ids(self) -> list[int]:
        return self.checkpoints[-1] if self.checkpoints else []

    def rollback_if_needed(self, request: Sequence[dict], match: Matcher) -> list[Record]:
        """Cut back to the last checkpoint the request still agrees with; return the discarded records.

        Discarding more than MAX_ASSISTANT_ROLLBACK_STEPS generations is a 400 and changes nothing.
        A rollback is applied before every later check and persists even if the request then fails.
        """
        if not self.messages or not self.checkpoints:
            return []
        agreed = common_prefix_messages(self.messages, request, match)
        if agreed >= len(self.messages):
            return []
        keep = max((i for i, end in enumerate(self.message_ends) if end <= agreed), default=-1)
        discard = self.num_assistant - (keep + 1)
        if discard > MAX_ASSISTANT_ROLLBACK_STEPS:
            raise RequestRejected(
                f"rollback failed: discard_count={discard} exceeds max_assistant_rollback_steps="
                f"{MAX_ASSISTANT_ROLLBACK_STEPS} (stored has {len(self.messages)} messages, "
                f"request has {len(request)} messages)"
            )
        dropped = self.records[keep + 1 :]
        self.messages = self.messages[: self.message_ends[keep] if keep >= 0 else 0]
        del self.records[keep + 1 :], self.checkpoints[keep + 1 :], self.message_ends[keep + 1 :]
        return dropped

    def prompt_for(
        self, request: list[dict], tools: list[dict] | None, tito: TitoTokenizer, match: Matcher
    ) -> tuple[list[int], str]:
        """The TITO prompt of a request (after any rollback) and how it was built."""
        if not self.token_ids:
            return tito.full_render(request, tools), "full_render"
        check_append_only(self.messages, request, match, tito.family.allowed_append_roles)
        effective = self.messages + request[len(self.messages) :]  # stored spellings win inside the prefix
        return tito.merge_tokens(self.messages, effective, self.token_ids, tools), "extend"

    def commit(
        self, request: list[dict], prompt_ids: list[int], turn_index: int, generation: Generation, max_trim: int
    ) -> None:
        record = Record(turn_index, prompt_ids, generation)
        check_prefix(self.token_ids, record.all_ids, max_trim)
        self.messages = self.messages + request[len(self.messages) :] + [generation.message]
        self.records.append(record)
        self.checkpoints.append(record.all_ids)
        self.message_ends.append(len(request) + 1)


def check_append_only(
    stored: Sequence[dict], request: Sequence[dict], match: Matcher, allowed_roles: Iterable[str]
) -> None:
    """400 unless `request` extends `stored` under `match` with only allowed roles appended."""
    if len(request) < len(stored):
        raise RequestRejected(
            f"new messages ({len(request)}) are fewer than stored messages ({len(stored)})" + ROLE_GATE_SUFFIX
        )
    agreed = common_prefix_messages(stored, request, match)
    if agreed < len(stored):
        raise RequestRejected(f"message mismatch at index {agreed}" + ROLE_GATE_SUFFIX)
    gate_roles(request, len(stored), allowed_roles)


def serve_v1(state: LinearTrajectory, request: SessionRequest, tito: TitoTokenizer, match: Matcher) -> TurnOutcome:
    """One chat request against a v1 session, with the recorded generation as the engine reply."""
    outcome = TurnOutcome(request.turn_index)

    def run() -> None:
        request_tito = tito.for_request(request.chat_template_kwargs)
        dropped = state.rollback_if_needed(request.messages, match)
        outcome.rolled_back = [r.turn_index for r in dropped]
        outcome.dropped_tokens = sum(len(r.output_ids) for r in dropped)
        outcome.prompt_ids, outcome.placement = state.prompt_for(request.messages, request.tools, request_tito, match)
        state.commit(
            request.messages,
            outcome.prompt_ids,
            request.turn_index,
            request.generation,
            request_tito.family.max_trim_tokens,
        )

    return serve(outcome, run)


def replay_v1(
    requests: Sequence[SessionRequest], tito: TitoTokenizer, match: Matcher = strict_match
) -> tuple[LinearTrajectory, list[TurnOutcome]]:
    """Serve every request in arrival order; a refused request stores nothing and replay goes on."""
    state, match = LinearTrajectory(), remembered(match)
    return state, [noting_lenient(serve_v1(state, request, tito, match), tito) for request in requests]


def assemble_v1(
    state: LinearTrajectory, max_trim: int, max_seq_len: int | None = None, reward: float = 0.0
) -> list[Sample]:
    """The samples op of v1: at most one sample (none for `no_records` / `all_truncated`)."""
    if not state.records:
        return []
    merged = assemble_records(state.records, state.token_ids, max_trim, max_seq_len)
    return [] if merged is None else [merged.to_sample(reward)]
