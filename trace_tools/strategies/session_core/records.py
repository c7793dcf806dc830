"""Requests, generations and records, and what serving one request shares between v1 and v2:
the commit-time prefix check, the role gate and the mapping of HTTP errors onto an outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from trace_tools.ids import common_prefix_len
from trace_tools.render.upstream import took_lenient
from trace_tools.strategies.helpers import failure_reason
from trace_tools.strategies.session_core.errors import (
    RequestRejected,
    ServerError,
)
from trace_tools.strategies.session_core.tito import TitoTokenizer


@dataclass(slots=True)
class Generation:
    """What the engine returned for one request; replay takes it from the recording."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    message: dict[str, Any]  # the assistant message miles stores: the response as returned
    response_id: str = ""


@dataclass(slots=True)
class SessionRequest:
    """One recorded chat request as the session server receives it."""

    turn_index: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    generation: Generation
    chat_template_kwargs: dict[str, Any] | None = None


@dataclass(slots=True)
class Record:
    """One committed generation: the prompt miles fed the engine and what came back."""

    turn_index: int
    prompt_ids: list[int]
    generation: Generation
    # producing turn per token of all_ids; filled lazily by chain_provenance
    provenance: list[int] | None = field(default=None, repr=False, compare=False)
    _all_ids: list[int] | None = field(default=None, repr=False, compare=False)

    @property
    def output_ids(self) -> list[int]:
        return self.generation.output_ids

    @property
    def all_ids(self) -> list[int]:
        """Prompt then output: one shared list (callers must not modify it)."""
        if self._all_ids is None:
            self._all_ids = self.prompt_ids + self.generation.output_ids
        return self._all_ids


@dataclass
class TurnOutcome:
    """What the server did with one request.

    `status`: ok | rejected (400/409) | failed (500). `placement` says where the prompt came
    from: v1 `full_render` / `extend`; v2 `root` / `new_root` / `child` / `sibling`.
    `rolled_back` lists the turns whose generations this request's rollback discarded (v1).
    """

    turn_index: int
    status: str = "ok"
    detail: str = ""
    reason: str = ""  # how a rejected or failed request is counted (`strategies.helpers.failure_reason`)
    lenient: bool = False  # rendered in the lenient text form where miles' render fails (`lenient_render`)
    prompt_ids: list[int] | None = None
    placement: str = ""
    rolled_back: list[int] = field(default_factory=list)
    dropped_tokens: int = 0


def check_prefix(previous: Sequence[int], all_ids: Sequence[int], max_trim: int) -> None:
    """Commit-time check that the new snapshot extends the old one (all but `max_trim` tokens)."""
    keep = len(previous) - max_trim
    if keep > 0 and (first := common_prefix_len(all_ids, previous)) < keep:
        raise ServerError(
            f"TokenizationError: pretokenized prefix mismatch at token {first} "
            f"(checkpoint has {len(previous)} tokens, new snapshot {len(all_ids)})"
        )


def serve(outcome: TurnOutcome, action: Callable[[], None]) -> TurnOutcome:
    """Run one request; map the HTTP-shaped exceptions onto the outcome."""
    try:
        action()
    except RequestRejected as exc:
        outcome.status, outcome.detail, outcome.reason = "rejected", str(exc), failure_reason(exc)
    except ServerError as exc:
        outcome.status, outcome.detail, outcome.reason = "failed", str(exc), failure_reason(exc)
    return outcome


ROLE_GATE_SUFFIX = "; the selected TITO fixed template does not support appending this role"


def gate_roles(request: Sequence[dict], stored_count: int, allowed_roles: Iterable[str]) -> None:
    allowed = sorted(allowed_roles)
    for index in range(stored_count, len(request)):
        role = request[index].get("role")
        if role not in allowed:
            raise RequestRejected(
                f"appended message at index {index} has role={role!r}, allowed={allowed}" + ROLE_GATE_SUFFIX
            )


def noting_lenient(outcome: TurnOutcome, tito: TitoTokenizer) -> TurnOutcome:
    outcome.lenient = took_lenient(tito.renderer)
    return outcome
