"""No token trained twice (docs/metrics.md#invariants), enforced by the engine: a strategy whose samples train a
generated token twice has that session quarantined as `replay_error`, with a message naming it."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from trace_tools.api import replay
from trace_tools.data import ReplayResult, Sample, Session, Turn
from trace_tools.replay.turnrows import TrainedTwice, check_trained_once
from trace_tools.strategies.declarations import TREE
from trace_tools.strategies.registry import REGISTRY, register
from trace_tools.strategies.tree import TreeStrategy


def _session(*outputs: list[int]) -> Session:
    turns = [Turn("s", i, [{"role": "user", "content": "go"}], list(ids)) for i, ids in enumerate(outputs)]
    return Session("s", turns)


def _sample(prompt: list[int], response: list[int], sources: list[int], mask: list[int]) -> Sample:
    """`prompt` is context; `response` carries `sources` and `mask` token for token."""
    return Sample(prompt + response, len(response), mask, [0.0] * len(response), [-1] * len(prompt) + sources)


def test_each_output_token_trained_once_passes():
    session = _session([10, 11, 12], [20, 21])
    one = _sample([1, 2], [10, 11, 12, 5, 20, 21], [0, 0, 0, -1, 1, 1], [1, 1, 1, 0, 1, 1])
    check_trained_once(session, ReplayResult(samples=[one]))
    # a fork: the second sample repeats turn 0 as context (mask 0) and trains turn 1
    first = _sample([1], [10, 11, 12], [0, 0, 0], [1, 1, 1])
    second = _sample([1, 10, 11, 12, 5], [20, 21], [1, 1], [1, 1])
    check_trained_once(session, ReplayResult(samples=[first, second]))


def test_an_id_the_turn_generated_twice_may_be_trained_twice():
    session = _session([7, 8, 7])  # token 7 at two positions
    head = _sample([1], [7, 8], [0, 0], [1, 1])
    tail = _sample([1, 7, 8], [7], [0], [1])
    check_trained_once(session, ReplayResult(samples=[head, tail]))


def test_a_token_trained_in_two_samples_is_named():
    session = _session([10, 11, 12], [20, 21])
    first = _sample([1], [10, 11, 12], [0, 0, 0], [1, 1, 1])
    second = _sample([1, 10, 11, 12, 5], [20, 21], [1, 1], [1, 1])
    again = _sample([1], [10, 11], [0, 0], [0, 1])  # token 11 of turn 0 carries loss again
    with pytest.raises(
        TrainedTwice,
        match=r"turn 0's token 11 carries loss 1 2 times in samples \[0, 2\] but the "
        r"turn generated it 1 time\(s\)",
    ):
        check_trained_once(session, ReplayResult(samples=[first, second, again]))


def test_more_trained_than_generated_is_named():
    session = _session([10, 11])
    # ids that are not the turn's own, so only the count can tell
    sample = _sample([1], [90, 91, 92], [0, 0, 0], [1, 1, 1])
    with pytest.raises(TrainedTwice, match=r"turn 0 has 3 tokens with loss 1 in samples \[0\] but generated 2"):
        check_trained_once(session, ReplayResult(samples=[sample]))


def test_context_and_masked_tokens_do_not_count():
    session = _session([10, 11])
    sample = _sample([10, 11], [10, 11, 10, 11], [-1, -1, 0, 0], [1, 1, 1, 1])  # loss on context: not a turn's token
    check_trained_once(session, ReplayResult(samples=[sample, replace(sample, loss_mask=[0, 0, 0, 0])]))


class _TrainsTwice(TreeStrategy):
    """The tree, with its first sample emitted twice: every token it trains, it trains twice."""

    declaration = replace(TREE, name="test-trains-twice", label="twice")

    def replay_session(self, prepared):
        result = super().replay_session(prepared)
        result.samples = result.samples[:1] * 2 + result.samples[1:]
        return result


def test_the_engine_quarantines_a_strategy_that_trains_a_token_twice(simulated_dump, tmp_path):
    register(_TrainsTwice)
    try:
        result = replay(simulated_dump, out=tmp_path / "run", strategies=["tree", "test-trains-twice"], workers=1)
    finally:
        REGISTRY.pop("test-trains-twice")
    quarantine = pd.read_parquet(result.run_dir / "quarantine.parquet")
    assert len(quarantine) == result.summary["sessions_total"]  # every session trains a token
    assert (quarantine["reason"] == "replay_error").all()
    detail = quarantine["detail"].iloc[0]
    assert detail.startswith("strategy test-trains-twice: turn 0's token ") and "in samples [0, 1]" in detail
    assert "a generated token may be trained in one sample only" in detail
    strategies = result.summary["strategies"]
    assert strategies["test-trains-twice"]["sessions"] == 0
    assert strategies["tree"]["sessions"] == result.summary["sessions_total"]  # the other strategy is untouched
