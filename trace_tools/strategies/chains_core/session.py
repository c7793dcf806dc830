"""One gateway session driven by recorded turns
(docs/upstream_chains.md#a-request-from-selection-to-commit): select or create a chain, roll back a
rewritten last assistant, commit the recorded generation, materialize trajectories."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from trace_tools.strategies.chains_core.codec import ChainCodec
from trace_tools.strategies.chains_core.errors import ChainsSetupError, ServerError
from trace_tools.strategies.chains_core.normalize import (
    Lowering,
    extend_prefix_hash,
    normalize_assistant,
    prefix_hashes,
)
from trace_tools.strategies.chains_core.state import (
    CONTEXT,
    Chain,
    LastAssistantStart,
    Preparation,
    StepOutcome,
    TokenBuffer,
    Trajectory,
    select_chain,
)

MAX_TRAJECTORY_LENGTH = "max_trajectory_length"


class ChainSession:
    """One gateway session's chains, driven by recorded turns instead of an engine.

    `prompt_length` + `response_length` is the total trajectory capacity; it is enforced only when
    both are set. With `enable_last_assistant_rollback` a request that rewrites only the latest
    assistant of a chain rolls that generation back instead of starting a new chain.
    """

    def __init__(
        self,
        codec: ChainCodec,
        prompt_length: int | None = None,
        response_length: int | None = None,
        enable_last_assistant_rollback: bool = True,
    ):
        _require_positive("response_length", response_length)
        _require_positive("prompt_length", prompt_length)
        self.codec = codec
        self.capacity = prompt_length + response_length if prompt_length and response_length else None
        self.enable_last_assistant_rollback = enable_last_assistant_rollback
        self.active_chains: list[Chain] = []
        self.materialized: list[Trajectory] = []
        self.reward_info: dict = {}
        self.finalized = False
        self._next_chain_id = 1
        self._order_seq = 0
        self.rollback_count = 0
        self.rollback_dropped_tokens = 0
        self.chains_created = 0
        self.chain_forks = 0
        self.capacity_exhausted = 0
        self._lowering = Lowering()

    # -- the request path ---------------------------------------------------------------------
    def step(
        self,
        messages: Any,
        tools: Any,
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None,
        assistant_message: dict,
        *,
        turn_index: int = CONTEXT,
        request_logprobs: bool | None = None,
    ) -> StepOutcome:
        """Replay one request whose engine output is known: prepare, then commit the recorded output.

        `request_logprobs` is the request's `logprobs` flag (default: whether `logprobs` is given);
        logprobs are collected only when it is set. `assistant_message` is the recorded response;
        it is normalized like a request message and stored as the chain's new tip. Raises
        RequestRejected / ServerError where the gateway would answer 400 / 500; the session is then
        unchanged.
        """
        self._require_active()
        messages, tools = self._lowering.request(messages, tools)
        stored = normalize_assistant(assistant_message)
        wants_logprobs = logprobs is not None if request_logprobs is None else request_logprobs
        prep = self.prepare(messages, tools, wants_logprobs)
        if prep.capacity_exhausted:
            self.capacity_exhausted += 1
            if prep.chain_id is not None:
                self.close_chain_for_length(prep)
            return self._outcome("length", prep, completion_tokens=0)
        _check_backend_logprobs(wants_logprobs, logprobs, len(output_ids))
        output_ids, logprobs = _respect_max_tokens(prep.max_tokens, list(output_ids), logprobs)
        prep.buffer.append(output_ids, True, turn_index, logprobs if wants_logprobs else None)
        prep.buffer.check_logprob_alignment()
        self.commit(prep, stored)
        return self._outcome("committed", prep, completion_tokens=len(output_ids))

    def prepare(self, messages: list[dict], tools: list | None, wants_logprobs: bool) -> Preparation:
        """Pick a chain (or none) and build the context ids on a copy."""
        hashes = prefix_hashes(messages, self._lowering.message_hash)
        selected = select_chain(self.active_chains, tools, hashes, self.enable_last_assistant_rollback)
        if selected is None:
            prep = self._prepare_new_chain(messages, tools, hashes)
        else:
            prep = self._prepare_continuation(*selected, messages, tools, hashes, wants_logprobs)
        prep.prompt_tokens = prep.buffer.length  # the context ids' length, without joining them
        if prep.capacity_exhausted:
            return prep
        if self.capacity:
            prep.max_tokens = self.capacity - prep.prompt_tokens
        prep.new_last_assistant_start = LastAssistantStart(len(prep.buffer.response_ids), len(messages), hashes[-1])
        return prep

    def _prepare_new_chain(self, messages: list[dict], tools: list | None, hashes: list[str]) -> Preparation:
        prompt = self.codec.encode_full(messages, tools)
        exhausted = self._reaches_capacity(len(prompt))
        return Preparation(TokenBuffer(prompt), messages, tools, hashes, None, capacity_exhausted=exhausted)

    def _prepare_continuation(
        self,
        chain: Chain,
        rollback: bool,
        messages: list[dict],
        tools: list | None,
        hashes: list[str],
        wants_logprobs: bool,
    ) -> Preparation:
        prep = Preparation(chain.buffer.copy(), messages, tools, hashes, chain.chain_id)
        prep.buffer.check_logprob_alignment()
        start = len(chain.message_history)
        if rollback:
            start = self._roll_back(chain, prep)
        current = prep.buffer.length
        exhausted = self._reaches_capacity(current)
        incremental: list[int] = []
        if messages[start:] and not exhausted:
            incremental = self.codec.encode_incremental(messages[start:])
            exhausted = self._reaches_capacity(current + len(incremental))
        if not exhausted:
            prep.buffer.append(incremental, False, CONTEXT, [0.0] * len(incremental) if wants_logprobs else None)
            prep.buffer.check_logprob_alignment()
        prep.capacity_exhausted = exhausted
        return prep

    def _reaches_capacity(self, tokens: int) -> bool:
        """Whether `tokens` context tokens leave no room to generate (never without a capacity)."""
        return tokens >= self.capacity if self.capacity else False

    def _roll_back(self, chain: Chain, prep: Preparation) -> int:
        """Cut the latest generation and the GP + separator before it; return where new messages start."""
        start = chain.last_assistant_start
        assert start is not None, "select_chain rolls back only a chain with a latest generation"
        buffer = prep.buffer
        abandoned = range(start.response_ids_len, len(buffer.response_ids))
        prep.rollback = True
        prep.dropped_tokens = sum(buffer.response_mask[i] for i in abandoned)
        prep.dropped_turns = tuple(sorted({buffer.response_source[i] for i in abandoned if buffer.response_mask[i]}))
        prep.rollback_history_len = start.message_history_len
        gp = self.codec.generation_prompt
        cut = start.response_ids_len - len(gp)
        if cut < 0 or buffer.response_ids[cut : start.response_ids_len] != gp:
            raise ServerError("Stored response does not end its assistant prefix with the generation prompt")
        # The separator is not checked: the incremental encoding starts with it again.
        buffer.truncate(cut - len(self.codec.turn_separator))
        buffer.check_logprob_alignment()
        return start.message_history_len

    # -- mutations ----------------------------------------------------------------------------
    def commit(self, prep: Preparation, assistant: dict) -> None:
        """The single mutation point: store the chain (new, or replaced in place) with its new tip."""
        history = [*prep.messages, assistant]
        tip = extend_prefix_hash(prep.hashes[-1], assistant)
        start = prep.new_last_assistant_start
        self._record_rollback(prep)
        seq = self._next_order_seq()
        if prep.chain_id is None:
            chain = Chain(self._next_chain_id, history, tip, prep.tools, prep.buffer, start, seq)
            self._next_chain_id += 1
            self.chain_forks += self.chains_created > 0
            self.chains_created += 1
            self.active_chains.append(chain)
            prep.chain_id, prep.created_chain = chain.chain_id, True
        else:
            index = self._active_index(prep.chain_id)
            old = self.active_chains[index]
            self.active_chains[index] = replace(
                old,
                message_history=history,
                message_tip_hash=tip,
                tools=prep.tools,
                buffer=prep.buffer,
                last_assistant_start=start,
                updated_seq=seq,
            )

    def close_chain_for_length(self, prep: Preparation) -> None:
        """Materialize only the selected chain, without the incremental context that was not sent."""
        index = self._active_index(prep.chain_id)
        chain = self.active_chains.pop(index)
        if prep.rollback:
            boundary = prep.rollback_history_len
            chain = replace(
                chain,
                message_history=prep.messages[:boundary],
                message_tip_hash=prep.hashes[boundary - 1],
                buffer=prep.buffer,
            )
        self._record_rollback(prep)
        extra = {"materialization_reason": MAX_TRAJECTORY_LENGTH}
        self.materialized.append(_materialize(chain, self._next_order_seq(), extra))

    def set_reward_info(self, reward_info: dict) -> None:
        self._require_active()
        self.reward_info = dict(reward_info)

    def finalize(self) -> list[Trajectory]:
        """Every chain as a trajectory, ordered by its last accepted outcome, reward copied in."""
        self._require_active()
        for chain in self.active_chains:
            self.materialized.append(_materialize(chain, chain.updated_seq, {}))
        self.active_chains = []
        self.finalized = True
        ordered = sorted(self.materialized, key=lambda t: t.order_seq)
        return [replace(t, reward_info=dict(self.reward_info)) for t in ordered]

    # -- helpers ------------------------------------------------------------------------------
    def _record_rollback(self, prep: Preparation) -> None:
        if prep.rollback:
            self.rollback_count += 1
            self.rollback_dropped_tokens += prep.dropped_tokens

    def _next_order_seq(self) -> int:
        self._order_seq += 1
        return self._order_seq

    def _active_index(self, chain_id: int | None) -> int:
        return next(i for i, chain in enumerate(self.active_chains) if chain.chain_id == chain_id)

    def _require_active(self) -> None:
        if self.finalized:
            raise ServerError("the session is finalized")

    @staticmethod
    def _outcome(kind: str, prep: Preparation, completion_tokens: int) -> StepOutcome:
        return StepOutcome(
            kind,
            prep.chain_id,
            prep.created_chain,
            prep.rollback,
            prep.dropped_tokens,
            prep.dropped_turns,
            prep.prompt_tokens,
            completion_tokens,
            prep.max_tokens,
        )


def _materialize(chain: Chain, order_seq: int, extra_fields: dict) -> Trajectory:
    buffer = chain.buffer
    buffer.check_logprob_alignment()
    turns = sum(1 for m in chain.message_history if m.get("role") in ("user", "assistant")) + 1
    return Trajectory(
        chain.chain_id,
        list(buffer.prompt_ids),
        list(buffer.response_ids),
        list(buffer.response_mask),
        list(buffer.response_logprobs) or None,
        list(buffer.response_source),
        turns,
        order_seq,
        extra_fields=dict(extra_fields),
    )


def _require_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ChainsSetupError(
            f"chains option {name} must be a positive integer (got {value!r}); omit it to disable the capacity check"
        )


def _respect_max_tokens(
    max_tokens: int | None, output_ids: list[int], logprobs: Sequence[float] | None
) -> tuple[list[int], list[float] | None]:
    """The engine would have stopped at `max_tokens`; replay cuts the recorded output there."""
    if max_tokens is None or len(output_ids) <= max_tokens:
        return output_ids, None if logprobs is None else list(logprobs)
    return output_ids[:max_tokens], None if logprobs is None else list(logprobs)[:max_tokens]


def _check_backend_logprobs(wanted: bool, logprobs: Sequence[float] | None, n: int) -> None:
    if not wanted:
        return
    if logprobs is None:
        raise ServerError("logprobs were requested but the generation returned none")
    if len(logprobs) != n:
        raise ServerError(f"logprobs were requested but {len(logprobs)} came back for {n} generated tokens")
