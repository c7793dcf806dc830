"""The `echo-restore` strategy: slime PR #2282's pre-render restore, then slime's tree
(docs/strategies.md#the-strategies).

For every turn, the canonical prompt messages are walked against the session's message tree
*before* the prompt is rendered; a harness echo recognised as a re-rendered copy of a generated
assistant (schema defaults filled in, lines right-stripped) is swapped back for the stored dict.
The prompt is then rendered from the restored messages and the turn recorded with them, so both
routing and token prefix see the generated message and the turn stays trainable.

Counterfactual: a restored turn's prompt ids are ids the engine never saw; the recorded
`output_ids` / logprobs are reused as if the model had sampled them on that context (counterfactual:
docs/strategies.md#the-strategies). A turn where nothing was restored keeps its prepared
prompt ids (recorded or rendered, per `prompt_source`), which is what a restoring gateway would have
fed as well.

Options: everything `tree` takes (`fork_threshold` 1024 by default, ...), and `restore_prompt`
(default true; false restores for routing only and keeps the harness's prompt ids). Counters:
`restored_echoes` (substitutions, per turn), `unrecognized_echoes` (see restore_core) and the
extra `restored_distinct_echoes` (generated turns restored at least once, comparable with
`unrecognized_echoes`) on top of the tree's. Prompt event
`restored` marks a turn whose prompt needed a restore and then extended the held tokens cleanly;
if it still forked or realigned, the tree's event is kept.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from trace_tools.data import ReplayResult
from trace_tools.pipeline.prepared import render_prompt
from trace_tools.strategies.declarations import ECHO_RESTORE
from trace_tools.strategies.restore_core import RestoreOutcome, restore_walk
from trace_tools.strategies.tree import TreeStrategy, check_request
from trace_tools.strategies.tree_core import TrajectoryManager


@dataclass
class RestoreLog:
    """Per-turn restore outcomes of one session, folded into the ReplayResult at the end."""

    restored: Counter = field(default_factory=Counter)
    unrecognized: Counter = field(default_factory=Counter)
    nodes: set = field(default_factory=set)

    def note(self, source: int, outcome: RestoreOutcome) -> None:
        self.restored[source] += outcome.restored
        self.unrecognized[source] += outcome.unrecognized
        self.nodes.update(id(node) for node in outcome.restored_nodes)

    def apply(self, result: ReplayResult) -> ReplayResult:
        result.counters["restored_echoes"] += sum(self.restored.values())
        result.counters["unrecognized_echoes"] += sum(self.unrecognized.values())
        result.counters["restored_distinct_echoes"] += len(self.nodes)
        for source, count in self.restored.items():
            if count and result.prompt_events.get(source, "clean") == "clean":
                result.prompt_events[source] = "restored"
        return result


def restore_prepared(manager: TrajectoryManager, session_id: str, prepared: Any) -> tuple[Any, RestoreOutcome]:
    """The prepared turn with its messages restored against the tree, and what the walk did."""
    outcome = restore_walk(manager, session_id, prepared.messages, prepared.tools)
    if not outcome.restored:
        return prepared, outcome
    return replace(prepared, messages=outcome.messages), outcome


class EchoRestoreStrategy(TreeStrategy):
    declaration = ECHO_RESTORE

    def replay_prepared(
        self, session_id: str, prepared_turns: Sequence[Any], reward: float, manager: TrajectoryManager | None = None
    ) -> ReplayResult:
        self.restore_log = RestoreLog()
        return super().replay_prepared(session_id, prepared_turns, reward, manager)

    def record_prepared(self, manager: TrajectoryManager, session_id: str, prepared: Any) -> None:
        restored, outcome = restore_prepared(manager, session_id, prepared)
        # slime's adapter renders every request after the restore: where that render fails, the
        # request fails (and its restore counts for nothing), whichever ids stand in for it here.
        check_request(self.upstream, restored)
        self.restore_log.note(prepared.turn.turn_index, outcome)
        # `restore_prompt=False` recognises the echo for routing only and keeps the harness's prompt
        # ids: the third configuration slime PR #2282 measured, which shows why the restore must precede
        # the render (docs/results.md#published-measurements-reproduced).
        if outcome.restored and self.setting("restore_prompt"):
            ids = render_prompt(self.upstream, restored.messages, restored.tools, restored.turn, shared=True)
            restored = replace(restored, prompt_ids=ids, prompt_origin="rendered")
        super().record_prepared(manager, session_id, restored)

    def check_prompt(self, prepared: Any) -> None:
        """Done in `record_prepared`, for every request (recorded ids stand in for slime's render)."""

    def finish(self, manager: TrajectoryManager, session_id: str, reward: float) -> ReplayResult:
        return self.restore_log.apply(super().finish(manager, session_id, reward))
