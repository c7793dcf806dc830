"""The `chains` strategy: uni-agent's multiple linear chains (see chains_core for the algorithm).

Each recorded turn is replayed as a request to a uni-agent gateway session whose engine answers
with the recorded output: the turn's raw messages and tools go through uni-agent's adapter
normalization (not the run's canonicalization policy, which is another system's), the session
picks or creates a chain, and the recorded `output_ids` (with the recorded response, normalized
the same way, as the stored assistant) are committed to it. Every chain becomes one sample.

Counterfactual: the chains codec renders prompts itself — a new chain's full render, then only
the messages appended after each generation — so the ids a chain feeds are not the recorded
prompt ids (a miles/slime gateway re-rendered differently). Replay reuses the recorded outputs as
if generated on those ids.

Options (`declarations.CHAINS_PARAMS`): `rollback` (default on: roll back a rewritten latest assistant
instead of forking), `prompt_length` and `response_length` (total capacity, enforced only when
both are set; off by default).

Events: a turn's prompt_event is `clean` (first chain, or a continuation of a chain),
`new_chain` (a fork: a new full-encoded chain while another exists), `rolled_back` (continued a
chain after cutting its latest generation), `capacity_exhausted` (no generation: the chain was
full), `rejected` (the adapter refused the request) or `failed` (the gateway would have raised);
a turn whose tokens a later rollback cut gets turn_event `rolled_back`, a refused one `rejected`,
a failed one `failed`.
"""

from __future__ import annotations

from typing import Any

from trace_tools.data import ReplayResult, Sample, Session, Turn
from trace_tools.errors import ReplayError
from trace_tools.pipeline.prepared import PreparedSession, PreparedTurn
from trace_tools.render.upstream import took_lenient
from trace_tools.strategies.base import ReplayContext, Strategy
from trace_tools.strategies.chains_core.codec import ChainCodec
from trace_tools.strategies.chains_core.errors import RequestRejected, ServerError
from trace_tools.strategies.chains_core.session import ChainSession
from trace_tools.strategies.chains_core.state import CONTEXT, StepOutcome, Trajectory
from trace_tools.strategies.declarations import CHAINS
from trace_tools.strategies.helpers import failure_reason


class ChainsStrategy(Strategy):
    declaration = CHAINS

    def __init__(self, ctx: ReplayContext):
        super().__init__(ctx)
        self.rollback = self.setting("rollback")
        self.prompt_length = self.setting("prompt_length")
        self.response_length = self.setting("response_length")

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        if self.ctx.renderer is None:
            raise ReplayError("the chains strategy renders its own prompts; pass --tokenizer (and --chat-template)")
        session = prepared.session
        codec = ChainCodec(self.upstream, session_template_kwargs(session))
        chains = ChainSession(codec, self.prompt_length, self.response_length, self.rollback)
        wants_logprobs = any(turn.output_logprobs is not None for turn in session.turns)
        result = ReplayResult()
        for turn in prepared.turns:
            self._replay_turn(chains, turn, wants_logprobs, result)
        chains.set_reward_info({"reward": session.reward})
        result.samples = [trajectory_to_sample(t) for t in chains.finalize()]
        _count(chains, result)
        return result

    def _replay_turn(
        self, chains: ChainSession, prepared: PreparedTurn, wants_logprobs: bool, result: ReplayResult
    ) -> None:
        turn = prepared.turn
        index = turn.turn_index
        try:
            outcome = chains.step(
                turn.messages,
                turn.tools,
                turn.output_ids,
                turn.output_logprobs,
                self._recorded_assistant(turn),
                turn_index=index,
                request_logprobs=wants_logprobs,
            )
        except RequestRejected as exc:
            result.turn_events[index] = result.prompt_events[index] = "rejected"
            result.counters["rejected_requests"] += 1
            result.failures[index] = failure_reason(exc)
            return
        except ServerError as exc:
            result.turn_events[index] = result.prompt_events[index] = "failed"
            result.counters["server_errors"] += 1
            result.failures[index] = failure_reason(exc)
            return
        finally:
            if took_lenient(self.upstream):
                result.counters["lenient_renders"] += 1
        for dropped in outcome.rolled_back_turns:
            result.turn_events[dropped] = "rolled_back"
        result.prompt_events[index] = prompt_event(outcome)

    def _recorded_assistant(self, turn: Turn) -> dict:
        """The recorded response as sent to the harness; parsed from the output ids when absent.

        No engine tool-parser re-decode: the stored assistant is what the recording gateway
        returned, lowered by the adapter normalization inside `ChainSession.step`.
        """
        if turn.response is not None:
            return turn.response
        assert self.ctx.renderer is not None, "replay_session refuses to run without a renderer"
        return self.ctx.renderer.parse_response(turn.output_ids, turn.tools).message


def prompt_event(outcome: StepOutcome) -> str:
    if outcome.kind == "length":
        return "capacity_exhausted"
    if outcome.rollback:
        return "rolled_back"
    if outcome.new_chain and outcome.chain_id != 1:
        return "new_chain"
    return "clean"


def trajectory_to_sample(trajectory: Trajectory) -> Sample:
    """slime's layout: the chain's first prompt is context, its response region carries the mask."""
    n = len(trajectory.response_ids)
    logprobs = trajectory.response_logprobs if trajectory.response_logprobs is not None else [0.0] * n
    metadata: dict[str, Any] = {
        "chain_id": trajectory.chain_id,
        "order_seq": trajectory.order_seq,
        "num_turns": trajectory.num_turns,
        **trajectory.extra_fields,
    }
    return Sample(
        token_ids=trajectory.prompt_ids + trajectory.response_ids,
        response_length=n,
        loss_mask=list(trajectory.response_mask),
        logprobs=list(logprobs),
        source_turn=[CONTEXT] * len(trajectory.prompt_ids) + trajectory.response_source,
        reward=float(trajectory.reward_info.get("reward", 0.0)),
        metadata=metadata,
    )


def session_template_kwargs(session: Session) -> dict:
    """The first turn's chat_template_kwargs stand for the session (uni-agent has no per-request kwargs)."""
    return next((dict(t.chat_template_kwargs) for t in session.turns if t.chat_template_kwargs), {})


def _count(chains: ChainSession, result: ReplayResult) -> None:
    result.counters["chains_created"] += chains.chains_created
    result.counters["chain_forks"] += chains.chain_forks
    result.counters["rollbacks"] += chains.rollback_count
    result.counters["rollback_dropped_tokens"] += chains.rollback_dropped_tokens
    result.counters["capacity_exhausted"] += chains.capacity_exhausted
