"""Rescore planning (prefix sharing, skip reasons) and metric definitions: pure Python, no model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_tools.rescore import metrics, plan
from trace_tools.rescore.plan import TurnInput


def _turn(session: str, index: int, prompt: list[int] | None, output: list[int], logprobs=None) -> TurnInput:
    recorded = [-1.0] * len(output) if logprobs is None else logprobs
    return TurnInput(session, index, output, recorded, prompt, "recorded")


def test_append_only_session_is_scored_as_one_sequence():
    first = _turn("a", 0, [5, 6, 7], [8, 9])
    second = _turn("a", 1, [5, 6, 7, 8, 9, 10, 11], [12])  # prompt = first prompt + output + new user ids
    third = _turn("a", 2, [5, 6, 7, 8, 9, 10, 11, 12, 13], [14, 15, 16])
    plans = plan.plan_sequences([first, second, third])
    assert len(plans) == 1
    assert plans[0].ids == [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    assert plans[0].positions().tolist() == [3, 4, 7, 9, 10, 11]


def test_each_turn_reads_its_own_span_from_the_shared_sequence():
    turns = [_turn("a", 0, [1, 2], [3, 4]), _turn("a", 1, [1, 2, 3, 4, 5], [6, 7, 8])]
    plans = plan.plan_sequences(turns)
    # Fake scores: the logprob of position t is -t, so each span shows where it was read from.
    scored = [-plan_.positions().astype(float) for plan_ in plans]
    spans = plan.read_spans(plans, scored, len(turns))
    assert spans[0].tolist() == [-2.0, -3.0]
    assert spans[1].tolist() == [-5.0, -6.0, -7.0]


def test_branches_share_within_a_branch_only():
    trunk = _turn("a", 0, [1, 2], [3])
    left = _turn("a", 1, [1, 2, 3, 4], [5, 6])
    right = _turn("a", 2, [1, 2, 3, 9], [10])  # a retry that rewrote the history after the trunk
    plans = plan.plan_sequences([trunk, left, right])
    assert sorted(p.ids for p in plans) == [[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 10]]
    hosts = {index: p for p in plans for index, _, _ in p.spans}
    assert hosts[0] is hosts[1]  # longest first: the trunk joins the first branch that contains it


def test_sharing_never_crosses_sessions_and_can_be_disabled():
    one = _turn("a", 0, [1, 2], [3])
    same_text_other_session = _turn("b", 0, [1, 2, 3, 4], [5])
    assert len(plan.plan_sequences([one, same_text_other_session])) == 2
    first, second = _turn("a", 0, [1, 2], [3]), _turn("a", 1, [1, 2, 3, 4], [5])
    assert len(plan.plan_sequences([first, second], share_prefix=True)) == 1
    assert len(plan.plan_sequences([first, second], share_prefix=False)) == 2


def test_turns_that_cannot_be_compared_are_not_planned():
    ok = _turn("a", 0, [1, 2], [3])
    skipped = _turn("a", 1, [1, 2, 3, 4], [5])
    skipped.skip_reason = plan.NO_LOGPROBS
    plans = plan.plan_sequences([ok, skipped])
    assert [p.ids for p in plans] == [[1, 2, 3]]


@pytest.mark.parametrize(
    "prompt, output, recorded, vocab, reason",
    [
        ([1], [2], None, 10, plan.NO_LOGPROBS),
        ([1], [2, 3], [-1.0], 10, plan.LOGPROBS_LENGTH),
        ([1], [], [], 10, plan.EMPTY_OUTPUT),
        (None, [2], [-1.0], 10, plan.NO_PROMPT),
        ([], [2], [-1.0], 10, plan.EMPTY_PROMPT),
        ([1], [10], [-1.0], 10, plan.OUT_OF_MODEL_VOCAB),
        ([1], [9], [-1.0], 10, None),
    ],
)
def test_skip_reasons(prompt, output, recorded, vocab, reason):
    found = plan.logprob_problem(output, recorded) or plan.sequence_problem(prompt, output, vocab)
    assert found == reason


def test_token_stats_follow_the_definitions():
    recorded = np.array([-1.0, -2.0, -0.5, -3.0])
    recomputed = np.array([-1.1, -1.8, -0.5, -3.3])
    delta = recorded - recomputed  # 0.1, -0.2, 0, 0.3
    stats = metrics.token_stats(delta, threshold=0.15)
    assert stats["tokens"] == 4
    assert stats["mean_delta"] == pytest.approx(0.05)
    assert stats["k1"] == pytest.approx(0.05)
    assert stats["mean_abs_delta"] == pytest.approx(0.15)
    assert stats["max_abs_delta"] == pytest.approx(0.3)
    assert stats["frac_above"] == pytest.approx(0.5)  # 0.2 and 0.3 exceed 0.15
    # k3 term per token with r = recomputed - recorded: e^r - 1 - r
    expected_k3 = np.mean([math.exp(r) - 1 - r for r in (-0.1, 0.2, 0.0, -0.3)])
    assert stats["k3"] == pytest.approx(expected_k3)
    assert stats["log_ratio"] == pytest.approx(recomputed.sum() - recorded.sum())
    assert stats["p50_abs_delta"] == pytest.approx(0.15)


def test_k3_is_non_negative_even_when_k1_is_negative():
    stats = metrics.token_stats(np.array([-0.3, -0.1, 0.05]))
    assert stats["k1"] < 0
    assert stats["k3"] > 0


def test_empty_token_set_has_no_statistics():
    stats = metrics.token_stats(np.empty(0))
    assert stats["tokens"] == 0 and stats["max_abs_delta"] is None and stats["k3"] is None
    assert not metrics.is_flagged(stats)


def test_flag_rule_uses_mean_and_max():
    quiet = metrics.token_stats(np.array([0.01, -0.02, 0.0]))
    one_bad_token = metrics.token_stats(np.array([0.0] * 99 + [1.5]))
    shifted = metrics.token_stats(np.full(10, 0.08))
    assert not metrics.is_flagged(quiet)
    assert metrics.is_flagged(one_bad_token)  # mean 0.015 < 0.05 but max 1.5 > 1.0
    assert metrics.is_flagged(shifted)  # every token a little off: mean 0.08 > 0.05
    assert not metrics.is_flagged(shifted, threshold=0.1)


def test_worst_token_is_the_largest_magnitude():
    assert metrics.worst_token(np.array([0.1, -0.7, 0.5])) == 1
    assert metrics.worst_token(np.empty(0)) is None
