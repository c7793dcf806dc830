"""The `tree` strategy: slime's TrajectoryManager over a recorded session (docs/upstream_tree.md).

Each prepared turn (canonical messages, canonical response, prompt ids recorded or rendered) is
recorded into a `TrajectoryManager` with the dump's `turn_index` as provenance, then the session
is linearized with the session reward. Options: `declarations.TREE_PARAMS` (fork threshold, the REALIGN rule
of slime or TRL, slime's per-sample token budget, and whether upstream's unsafe edges are guarded).

Other strategies reuse this one: subclass `TreeStrategy` and override `record_prepared` (e.g. to
restore echoes or heal prompts before recording), or call `replay_prepared` with their own turns.
"""

from __future__ import annotations

from typing import Any, Sequence

from trace_tools.data import ReplayResult
from trace_tools.pipeline.prepared import PreparedSession
from trace_tools.render.upstream import ArgumentFormError, check_render, took_lenient
from trace_tools.strategies.base import Strategy
from trace_tools.strategies.declarations import TREE
from trace_tools.strategies.helpers import failure_reason, read_only_list, release_tree
from trace_tools.strategies.tree_core import (
    BaseSample,
    TrajectoryManager,
    TreeSample,
    TurnRecord,
)


class TreeStrategy(Strategy):
    declaration = TREE

    def replay_session(self, prepared: PreparedSession) -> ReplayResult:
        return self.replay_prepared(prepared.session_id, prepared.turns, prepared.reward)

    def make_manager(self) -> TrajectoryManager:
        """A manager configured from the declared options."""
        return TrajectoryManager(
            fork_threshold=self.setting("fork_threshold"),
            realign_gate=self.setting("realign_gate"),
            realign_from=self.setting("realign_from"),
            safe_edges=self.setting("safe_edges"),
        )

    def replay_prepared(
        self, session_id: str, prepared_turns: Sequence[Any], reward: float, manager: TrajectoryManager | None = None
    ) -> ReplayResult:
        """Record every prepared turn (`pipeline.PreparedTurn` or alike), then linearize.

        A request whose upstream render fails (`ArgumentFormError`) is not recorded: the gateway
        answered it with an error, and replay goes on with the next one."""
        manager = manager or self.make_manager()
        self.failures: dict[int, str] = {}
        self.lenient_requests = 0
        for prepared in prepared_turns:
            try:
                self.record_prepared(manager, session_id, prepared)
            except ArgumentFormError as exc:
                self.failures[prepared.turn.turn_index] = failure_reason(exc)
            self.lenient_requests += took_lenient(self.upstream)
        return self.finish(manager, session_id, reward)

    def record_prepared(self, manager: TrajectoryManager, session_id: str, prepared: Any) -> None:
        """Record one turn the way slime's adapter does (`metadata={"sid": ...}`), tagged with its turn_index."""
        self.check_prompt(prepared)
        manager.record_turn(
            session_id,
            turn=turn_record(prepared),
            prompt_messages=prepared.messages,
            response_message=prepared.response_message,
            metadata={"sid": session_id},
            source=prepared.turn.turn_index,
        )

    def check_prompt(self, prepared: Any) -> None:
        """Fail the request where slime's render of it fails. A recorded prompt is the recording
        gateway's, not slime's, so only a rendered one (`--prompt-source rendered`) is checked."""
        if getattr(prepared, "prompt_origin", "recorded") == "rendered":
            check_request(self.upstream, prepared)

    def finish(self, manager: TrajectoryManager, session_id: str, reward: float) -> ReplayResult:
        """Linearize the session and package samples, counters and per-turn events."""
        root = manager.root(session_id)
        samples = manager.get_trajectory(
            session_id,
            base_sample=BaseSample(rollout_id=session_id),
            reward=reward,
            max_sample_tokens=self.settings.get("max_sample_tokens", 0),  # not every subclass declares it
        )
        result = result_from(samples, manager.pop_stats(session_id))
        release_tree([root] if root is not None else [])
        record_failures(result, self.failures)
        if self.lenient_requests:
            result.counters["lenient_renders"] += self.lenient_requests
        return result


def turn_record(prepared: Any) -> TurnRecord:
    """The engine-side view of a prepared turn: prompt ids fed, ids sampled, their logprobs."""
    turn = prepared.turn
    return TurnRecord(  # the manager reads these lists and never modifies them
        prompt_ids=read_only_list(prepared.prompt_ids),
        output_ids=read_only_list(turn.output_ids),
        finish_reason=turn.finish_reason or "stop",
        output_log_probs=read_only_list(turn.output_logprobs or ()),
        ill_formed=bool(prepared.ill_formed),
    )


def check_request(view: Any, prepared: Any) -> None:
    """Fail a prepared turn's request where `view`'s render of its messages fails upstream."""
    check_render(view, prepared.messages, prepared.tools, **(prepared.turn.chat_template_kwargs or {}))


def record_failures(result: ReplayResult, failures: dict[int, str]) -> None:
    """Requests the gateway answered with an error (500): nothing of them reached the manager."""
    result.counters["server_errors"] += len(failures)
    for index, reason in failures.items():
        result.turn_events[index] = result.prompt_events[index] = "failed"
        result.failures[index] = reason


def result_from(samples: list[TreeSample], stats: Any) -> ReplayResult:
    return ReplayResult(
        samples=[s.to_sample() for s in samples],
        turn_events=dict(stats.turn_events),
        prompt_events=dict(stats.prompt_events),
        counters=stats.counters,
        drift_positions=dict(stats.drift_positions),
    )
