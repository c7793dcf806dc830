"""The `tree` strategy: slime's TrajectoryManager over a recorded session (DESIGN §4).

Each prepared turn (canonical messages, canonical response, prompt ids recorded or rendered) is
recorded into a `TrajectoryManager` with the dump's `turn_index` as provenance, then the session
is linearized with the session reward. Options (from `ReplayContext.params`):

* `fork_threshold` (1024): REALIGN / rewrite-merge threshold; `<= 0` gives agentcore's current
  CLEAN/FORK-only behaviour.
* `realign_gate` ("output" | "drift") and `realign_from` ("response" | "divergence"): slime's
  REALIGN rule or TRL's.
* `max_sample_tokens` (0 = no limit): slime truncates each sample to the session's context budget.
* `safe_edges` (True): guard upstream's edge cases; False reproduces them.

Other strategies reuse this one: subclass `TreeStrategy` and override `record_prepared` (e.g. to
restore echoes or heal prompts before recording), or call `replay_prepared` with their own turns.
"""
from __future__ import annotations

from typing import Any, Sequence

from trace_tools.data import ReplayResult
from trace_tools.pipeline.prepared import PreparedSession
from trace_tools.errors import UnknownName
from trace_tools.strategies.base import Strategy, register
from trace_tools.strategies.tree_core import BaseSample, TrajectoryManager, TreeSample, TurnRecord


class InvalidTreeOption(UnknownName, ValueError):
    """A tree strategy option outside its allowed values."""


@register
class TreeStrategy(Strategy):
    name = "tree"
    description = "slime TrajectoryManager: message tree, rewrite-merge, CLEAN/REALIGN/FORK, per-node dedup"

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        return self.replay_prepared(prepared.session_id, prepared.turns, prepared.reward)

    def make_manager(self) -> TrajectoryManager:
        """A manager configured from the context's params (validated)."""
        return TrajectoryManager(
            fork_threshold=self._int_param("fork_threshold", 1024),
            realign_gate=self.ctx.param("realign_gate", "output"),
            realign_from=self.ctx.param("realign_from", "response"),
            safe_edges=bool(self.ctx.param("safe_edges", True)),
        )

    def replay_prepared(self, session_id: str, prepared_turns: Sequence[Any], reward: float,
                        manager: TrajectoryManager | None = None) -> ReplayResult:
        """Record every prepared turn (`pipeline.PreparedTurn` or alike), then linearize."""
        manager = manager or self.make_manager()
        for prepared in prepared_turns:
            self.record_prepared(manager, session_id, prepared)
        return self.finish(manager, session_id, reward)

    def record_prepared(self, manager: TrajectoryManager, session_id: str, prepared: Any) -> None:
        """Record one turn the way slime's adapter does (`metadata={"sid": ...}`), tagged with its turn_index."""
        manager.record_turn(session_id, turn=turn_record(prepared), prompt_messages=prepared.messages,
                            response_message=prepared.response_message, metadata={"sid": session_id},
                            source=prepared.turn.turn_index)

    def finish(self, manager: TrajectoryManager, session_id: str, reward: float) -> ReplayResult:
        """Linearize the session and package samples, counters and per-turn events."""
        samples = manager.get_trajectory(session_id, base_sample=BaseSample(rollout_id=session_id), reward=reward,
                                         max_sample_tokens=self._max_sample_tokens())
        return result_from(samples, manager.pop_stats(session_id))

    def _max_sample_tokens(self) -> int:
        value = self._int_param("max_sample_tokens", 0)
        if value < 0:
            raise InvalidTreeOption("max_sample_tokens", str(value), ["0 (no limit)", "a positive token count"])
        return value

    def _int_param(self, key: str, default: int) -> int:
        value = self.ctx.param(key, default)
        try:
            return int(value)
        except (TypeError, ValueError):
            raise InvalidTreeOption(key, str(value), ["an integer"]) from None


def turn_record(prepared: Any) -> TurnRecord:
    """The engine-side view of a prepared turn: prompt ids fed, ids sampled, their logprobs."""
    turn = prepared.turn
    return TurnRecord(prompt_ids=list(prepared.prompt_ids), output_ids=list(turn.output_ids),
                      finish_reason=turn.finish_reason or "stop",
                      output_log_probs=list(turn.output_logprobs or ()), ill_formed=bool(prepared.ill_formed))


def result_from(samples: list[TreeSample], stats: Any) -> ReplayResult:
    return ReplayResult(samples=[s.to_sample() for s in samples], turn_events=dict(stats.turn_events),
                        prompt_events=dict(stats.prompt_events), counters=stats.counters,
                        drift_positions=dict(stats.drift_positions))
