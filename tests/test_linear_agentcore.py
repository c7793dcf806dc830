"""agentcore's linear-healer scenarios that need the trajectory manager (docs/upstream_restore_linear.md), in our own data.

`drive` mirrors the gateway pipeline: heal → generate (served ids from the 9000s, which never
equal a re-render) → commit → record_turn, on a CLEAN/FORK-only manager (`fork_threshold=0`,
agentcore after PR #149). Both heal paths run every scenario.
"""

from __future__ import annotations

import pytest

from test_linear_fakes import (
    A_CLOSE,
    A_OPEN,
    SERVED_BASE,
    U_CLOSE,
    U_OPEN,
    FakeRenderer,
    assistant,
    chars,
    tool_result,
    user,
)
from trace_tools.strategies.linear_core import LinearHealer
from trace_tools.strategies.tree_core import BaseSample, TrajectoryManager, TurnRecord


class Pipeline:
    def __init__(self, *, heal: bool = True, delta: bool = True, renderer=None, on_nonlinear="reset"):
        self.renderer = renderer or FakeRenderer()
        self.healer = LinearHealer(self.renderer, on_nonlinear, delta=delta) if heal else None
        self.manager = TrajectoryManager(fork_threshold=0)
        self.fed: list[list[int]] = []

    def drive(self, messages, output, reply, tools=None):
        fed = self.healer.heal("s", messages, tools) if self.healer else self.renderer.render(messages, tools, True)
        logprobs = [-(t - SERVED_BASE) / 100 for t in output]
        if self.healer:
            self.healer.commit("s", fed, output, messages, reply, tools)
        self.manager.record_turn(
            "s", turn=TurnRecord(fed, list(output), "stop", logprobs), prompt_messages=messages, response_message=reply
        )
        self.fed.append(fed)
        return fed

    def records(self):
        return self.manager.get_trajectory("s", base_sample=BaseSample(), reward=1.0)


@pytest.fixture(params=[True, False], ids=["delta", "full"])
def delta(request):
    return request.param


TURN1 = [user("fix the bug")]
REPLY1 = assistant("looking")
TURN2 = TURN1 + [REPLY1, user("and the test")]


def test_unhealed_drift_forks():
    pipeline = Pipeline(heal=False)
    pipeline.drive(TURN1, [SERVED_BASE + 1, SERVED_BASE + 2], REPLY1)
    pipeline.drive(TURN2, [SERVED_BASE + 3], assistant("done"))
    assert len(pipeline.records()) == 2


def test_healed_drift_stays_one_sample(delta):
    pipeline = Pipeline(delta=delta)
    out1, out2 = [SERVED_BASE + 1, SERVED_BASE + 2], [SERVED_BASE + 3, SERVED_BASE + 4, SERVED_BASE + 5]
    fed1 = pipeline.drive(TURN1, out1, REPLY1)
    fed2 = pipeline.drive(TURN2, out2, assistant("done"))
    tail = [A_CLOSE, U_OPEN, *chars("and the test"), U_CLOSE, A_OPEN]
    assert fed2 == fed1 + out1 + tail
    (record,) = pipeline.records()
    assert record.token_ids == fed2 + out2
    assert record.loss_mask == [1, 1] + [0] * len(tail) + [1, 1, 1]
    assert record.logprobs == [-0.01, -0.02] + [0.0] * len(tail) + [-0.03, -0.04, -0.05]
    stats = pipeline.healer.pop_stats("s")
    assert (stats["healed_turns"], stats["nonlinear"]) == (1, 0)


def test_healed_does_not_duplicate_the_closer_in_served_output(delta):
    pipeline = Pipeline(delta=delta)
    out1 = [SERVED_BASE + 1, A_CLOSE]
    pipeline.drive(TURN1, out1, REPLY1)
    pipeline.drive(TURN2, [SERVED_BASE + 2], assistant("done"))
    (record,) = pipeline.records()
    assert record.token_ids.count(A_CLOSE) == 1


def test_healed_three_turns_one_sample(delta):
    pipeline = Pipeline(delta=delta)
    outputs = [
        [SERVED_BASE + 1, SERVED_BASE + 2],
        [SERVED_BASE + 3],
        [SERVED_BASE + 4, SERVED_BASE + 5, SERVED_BASE + 6],
    ]
    replies = [REPLY1, assistant("ran it"), assistant("all green")]
    history = TURN1
    pipeline.drive(history, outputs[0], replies[0])
    for output, reply, previous, result in zip(outputs[1:], replies[1:], replies, ["FAILED", "passed"]):
        history = history + [previous, tool_result(result)]
        pipeline.drive(history, output, reply)
    (record,) = pipeline.records()
    assert sum(record.loss_mask) == sum(map(len, outputs))
    assert pipeline.healer.pop_stats("s")["healed_turns"] == 2


def test_reordered_tool_call_args_stay_healed(delta):
    pipeline = Pipeline(delta=delta, renderer=FakeRenderer(sort_args=False))
    generated = assistant("", ("Grep", {"pattern": "TODO", "path": "src"}))
    echo = assistant("", ("Grep", {"path": "src", "pattern": "TODO"}))
    out1 = [SERVED_BASE + 1, SERVED_BASE + 2]
    fed1 = pipeline.drive(TURN1, out1, generated)
    fed2 = pipeline.drive(TURN1 + [echo, tool_result("src/a.py")], [SERVED_BASE + 3], assistant("found"))
    assert fed2[: len(fed1) + 2] == fed1 + out1
    stats = pipeline.healer.pop_stats("s")
    assert (stats["nonlinear"], stats["healed_turns"]) == (0, 1)
    assert len(pipeline.records()) == 1


def test_tools_change_is_nonlinear(delta):
    bash = [{"type": "function", "function": {"name": "Bash"}}]
    pipeline = Pipeline(delta=delta)
    pipeline.drive(TURN1, [SERVED_BASE + 1], REPLY1, tools=bash)
    pipeline.drive(
        TURN2, [SERVED_BASE + 2], assistant("done"), tools=bash + [{"type": "function", "function": {"name": "Read"}}]
    )
    stats = pipeline.healer.pop_stats("s")
    assert (stats["nonlinear"], stats["healed_turns"]) == (1, 0)


@pytest.mark.parametrize("edit", ["user", "assistant"])
def test_nonlinear_reset_reanchors_and_continues(delta, edit):
    pipeline = Pipeline(delta=delta)
    pipeline.drive(TURN1, [SERVED_BASE + 1], REPLY1)
    edited = (
        [user("fix the other bug"), REPLY1, user("and the test")]
        if edit == "user"
        else TURN1 + [assistant("looking hard"), user("and the test")]
    )
    fed = pipeline.drive(edited, [SERVED_BASE + 2], assistant("done"))
    assert fed == pipeline.renderer.render(edited)
    assert pipeline.healer.pop_stats("s")["nonlinear"] == 1
    records = pipeline.records()
    assert [r.token_ids[-1] for r in records] == [SERVED_BASE + 1, SERVED_BASE + 2]
    assert [r.loss_mask for r in records] == [[1], [1]]


def test_nonlinear_passthrough_routes_the_rest_through_the_tree():
    pipeline = Pipeline(on_nonlinear="passthrough")
    pipeline.drive(TURN1, [SERVED_BASE + 1], REPLY1)
    edited = [user("start over"), REPLY1, user("and the test")]
    pipeline.drive(edited, [SERVED_BASE + 2], assistant("done"))
    later = edited + [assistant("done"), user("thanks")]
    assert pipeline.drive(later, [SERVED_BASE + 3], assistant("bye")) == pipeline.renderer.render(later)
    assert pipeline.healer.pop_stats("s")["nonlinear"] == 1
