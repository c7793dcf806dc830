"""The `linear` and `linear+restore` strategies: agentcore's LinearHealer, then slime's tree.

`linear` replays agentcore's `history_mode="linear"` pipeline per turn: heal (the prompt is the
served prefix + closer + new tail), record the turn with the healed prompt ids, commit. The tree
then sees every healed turn as a CLEAN extension, so an append-only session stays one sample.
`linear+restore` first restores re-rendered echoes (slime PR #2282) and heals the restored
messages, so an Edit echo with a filled-in default no longer breaks linearity; none of the
upstream systems offers this combination.

Counterfactual: healed prompts are ids the engine never saw; the recorded `output_ids` and
logprobs are reused as if sampled on the healed context (counterfactual: docs/strategies.md#the-strategies).

Options (`declarations.LINEAR_PARAMS`): `on_nonlinear` ("reset" | "error" | "passthrough", default reset),
`delta` (text-space delta render first, default true), plus every `tree` option.
`fork_threshold` defaults to the tree's 1024; agentcore pairs the healer with a CLEAN/FORK-only
manager, which is `fork_threshold=0`.

Prompt events: `healed`, `reset` (a nonlinear jump re-anchored on the plain render), `rendered`
(a segment's first turn, or a session in passthrough; the tree's `forked`/`realigned` wins for
those). Counters: healed_turns, healed_prefix_tokens, nonlinear, close_unresolved, resets (and
restored_echoes / unrecognized_echoes for `linear+restore`) on top of the tree's. Every sample's
metadata carries the session's healer stats under `linear_healer`, as agentcore attaches them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from trace_tools.data import ReplayResult
from trace_tools.errors import ReplayError
from trace_tools.strategies.declarations import LINEAR, LINEAR_RESTORE
from trace_tools.strategies.echo_restore import RestoreLog, restore_prepared
from trace_tools.strategies.linear_core import LinearHealer, heal_and_commit
from trace_tools.strategies.tree import TreeStrategy
from trace_tools.strategies.tree_core import TrajectoryManager

_PROMPT_EVENTS = {"healed": "healed", "reset": "reset", "rendered": "rendered", "passthrough": "rendered"}


class LinearStrategy(TreeStrategy):
    declaration = LINEAR
    restore_first = False

    def make_healer(self) -> LinearHealer:
        """A healer over the context's renderer as agentcore renders, configured from `on_nonlinear` and `delta`."""
        if self.ctx.renderer is None:
            raise ReplayError(f"strategy {self.name} renders prompts; pass --tokenizer (and --chat-template)")
        return LinearHealer(self.upstream, on_nonlinear=self.setting("on_nonlinear"), delta=self.setting("delta"))

    def replay_prepared(
        self, session_id: str, prepared_turns: Sequence[Any], reward: float, manager: TrajectoryManager | None = None
    ) -> ReplayResult:
        self.healer = self.make_healer()
        self.heal_events: dict[int, str] = {}
        self.restore_log = RestoreLog()
        return super().replay_prepared(session_id, prepared_turns, reward, manager)

    def record_prepared(self, manager: TrajectoryManager, session_id: str, prepared: Any) -> None:
        restore = None
        if self.restore_first:
            prepared, restore = restore_prepared(manager, session_id, prepared)
        # A heal whose render fails raises before the commit: agentcore answers the request with an
        # error and neither the healer nor the manager records it.
        outcome = heal_and_commit(self.healer, session_id, prepared)
        if restore is not None:
            self.restore_log.note(prepared.turn.turn_index, restore)
        self.heal_events[prepared.turn.turn_index] = _PROMPT_EVENTS[outcome.event]
        super().record_prepared(
            manager, session_id, replace(prepared, prompt_ids=outcome.ids, prompt_origin="rendered")
        )

    def check_prompt(self, prepared: Any) -> None:
        """Nothing to check: the healed prompt came from the healer's own (upstream) renders."""

    def finish(self, manager: TrajectoryManager, session_id: str, reward: float) -> ReplayResult:
        result = super().finish(manager, session_id, reward)
        stats = self.healer.pop_stats(session_id)
        self.healer.drop(session_id)
        result.counters.update(stats)
        for sample in result.samples:
            sample.metadata["linear_healer"] = dict(stats)
        for source, event in self.heal_events.items():
            if event != "rendered" or result.prompt_events.get(source, "clean") == "clean":
                result.prompt_events[source] = event
        return self.restore_log.apply(result) if self.restore_first else result


class LinearRestoreStrategy(LinearStrategy):
    declaration = LINEAR_RESTORE
    restore_first = True
