"""A session's state (docs/upstream_chains.md#chains-and-chain-selection): token buffers, chains,
trajectories, one request's preparation and outcome; and which chain a request continues (HEAD)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from trace_tools.strategies.chains_core.errors import ServerError

CONTEXT = -1  # provenance of prompt and incremental-context tokens


@dataclass
class TokenBuffer:
    """A chain's tokens: the first full prompt, then generated and context ids with their masks."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    response_source: list[int] = field(default_factory=list)

    def copy(self) -> "TokenBuffer":
        return TokenBuffer(
            list(self.prompt_ids),
            list(self.response_ids),
            list(self.response_mask),
            list(self.response_logprobs),
            list(self.response_source),
        )

    def append(self, ids: Sequence[int], trained: bool, source: int, logprobs: Sequence[float] | None) -> None:
        self.response_ids += ids
        self.response_mask += [1 if trained else 0] * len(ids)
        self.response_source += [source] * len(ids)
        if logprobs is not None:
            self.response_logprobs += logprobs

    def truncate(self, length: int) -> None:
        del self.response_ids[length:], self.response_mask[length:], self.response_source[length:]
        del self.response_logprobs[length:]

    def check_logprob_alignment(self) -> None:
        if len(self.response_logprobs) not in (0, len(self.response_ids)):
            raise ServerError("response_logprobs must be empty or aligned with response_ids")

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True)
class LastAssistantStart:
    """Where a chain's latest generation began: response length then, and its request's tip."""

    response_ids_len: int
    message_history_len: int
    tip_hash: str


@dataclass
class Chain:
    chain_id: int
    message_history: list[dict]
    message_tip_hash: str | None
    tools: list | None
    buffer: TokenBuffer
    last_assistant_start: LastAssistantStart | None
    updated_seq: int


@dataclass
class Trajectory:
    """One materialized chain (uni-agent's Trajectory plus provenance)."""

    chain_id: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    response_source: list[int]
    num_turns: int
    order_seq: int
    reward_info: dict = field(default_factory=dict)
    extra_fields: dict = field(default_factory=dict)


@dataclass
class Preparation:
    """The working copy `prepare` builds; nothing in the session changes until commit or close."""

    buffer: TokenBuffer
    messages: list[dict]
    tools: list | None
    hashes: list[str]
    chain_id: int | None
    rollback: bool = False
    dropped_tokens: int = 0
    dropped_turns: tuple[int, ...] = ()
    rollback_history_len: int = 0
    capacity_exhausted: bool = False
    max_tokens: int | None = None
    new_last_assistant_start: LastAssistantStart | None = None
    created_chain: bool = False
    prompt_tokens: int = 0


@dataclass(frozen=True)
class StepOutcome:
    """What one replayed request did: `kind` is "committed" or "length" (capacity exhausted)."""

    kind: str
    chain_id: int | None
    new_chain: bool
    rollback: bool
    dropped_tokens: int
    rolled_back_turns: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    max_tokens: int | None


@dataclass(frozen=True)
class _Candidate:
    chain: Chain
    service: int
    exact: bool

    def rank(self) -> tuple:
        return self.service, self.exact, self.chain.updated_seq, self.chain.chain_id


# ---------------------------------------------------------------------------------------------
# Chain selection (HEAD; docs/upstream_chains.md#chains-and-chain-selection)
# ---------------------------------------------------------------------------------------------


def is_exact_prefix(chain: Chain, hashes: Sequence[str]) -> bool:
    """The chain's whole history is a prefix of the request (an empty history prefixes anything)."""
    n = len(chain.message_history)
    return n <= len(hashes) and (n == 0 or chain.message_tip_hash == hashes[n - 1])


def select_chain(
    chains: Sequence[Chain], tools: list | None, hashes: Sequence[str], rollback_enabled: bool
) -> tuple[Chain, bool] | None:
    """(chain, rollback?) to continue, or None for a new chain.

    Candidates share the whole prompt of their latest generation with the request. Exact ones
    (the request extends the full history) are valued by history length, rollback ones (only the
    latest assistant differs) by that prompt's length; two equally deep rollback candidates deeper
    than every exact one are ambiguous and start a new chain.
    """
    ranked: list[_Candidate] = []
    deep: list[Chain] = []
    deep_len = -1
    for chain in chains:
        start = chain.last_assistant_start
        if chain.tools != tools or start is None:
            continue
        boundary = start.message_history_len
        if boundary >= len(hashes) or hashes[boundary - 1] != start.tip_hash:
            continue  # a resend of (or edit within) the latest prompt is a sibling, never a rewrite
        if is_exact_prefix(chain, hashes):
            ranked.append(_Candidate(chain, len(chain.message_history), True))
        elif rollback_enabled and start.response_ids_len > 0:
            if boundary > deep_len:
                deep, deep_len = [chain], boundary
            elif boundary == deep_len:
                deep.append(chain)
    if len(deep) == 1:
        ranked.append(_Candidate(deep[0], deep_len, False))
    elif len(deep) > 1 and deep_len > max((c.service for c in ranked), default=-1):
        return None
    if not ranked:
        return None
    best = max(ranked, key=_Candidate.rank)
    return best.chain, not best.exact
