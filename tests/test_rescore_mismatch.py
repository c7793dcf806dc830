"""Mismatch metrics and the correction preview against hand computations on small cases (no torch)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from trace_tools.errors import TraceToolsError
from trace_tools.report.gate import MISMATCH_KEYS
from trace_tools.rescore.corrections import CLIPPED, KEPT, MASKED, CorrectionOptions, preview, token_outcomes
from trace_tools.rescore.mismatch import mismatch_metrics

# Two sequences: A has log ratios r = train − rollout of (0, ln 2, −ln 2), B of (ln 3).
ROLLOUT = np.array([-1.0, -2.0, -1.0, -3.0])
RATIO = np.array([0.0, math.log(2), -math.log(2), math.log(3)])
TRAIN = ROLLOUT + RATIO
SEQUENCE = np.array(["A", "A", "A", "B"])


def test_metrics_follow_the_verl_definitions_by_hand():
    got = mismatch_metrics(TRAIN, ROLLOUT, SEQUENCE)
    # token means over the four tokens
    assert got["tokens"] == 4 and got["sequences"] == 2
    assert got["k1_kl"] == pytest.approx(-math.log(3) / 4)  # mean(rollout − train) = −Σr/4
    k3 = [0.0, 2 - math.log(2) - 1, 0.5 + math.log(2) - 1, 3 - math.log(3) - 1]
    assert got["k3_kl"] == pytest.approx(sum(k3) / 4)
    assert got["chi2_token"] == pytest.approx((1 + 4 + 0.25 + 9) / 4 - 1)
    # per sequence, then the mean over sequences: A's mean r is 0, B's is ln 3
    mean_train = {"A": (-1 + (-2 + math.log(2)) + (-1 - math.log(2))) / 3, "B": -3 + math.log(3)}
    mean_rollout = {"A": -4 / 3, "B": -3.0}
    assert got["training_log_ppl"] == pytest.approx(-(mean_train["A"] + mean_train["B"]) / 2)
    assert got["rollout_log_ppl"] == pytest.approx(-(mean_rollout["A"] + mean_rollout["B"]) / 2)
    assert got["training_ppl"] == pytest.approx((math.exp(-mean_train["A"]) + math.exp(-mean_train["B"])) / 2)
    assert got["log_ppl_diff"] == pytest.approx((0 - math.log(3)) / 2)
    assert got["log_ppl_abs_diff"] == pytest.approx(math.log(3) / 2)
    assert (got["log_ppl_diff_max"], got["log_ppl_diff_min"]) == pytest.approx((0.0, -math.log(3)))
    assert got["ppl_ratio"] == pytest.approx((1 + 1 / 3) / 2)
    assert got["chi2_seq"] == pytest.approx((1 + 9) / 2 - 1)  # (Π ρ)² per sequence: 1 and 9
    assert got["max_abs_diff"] == pytest.approx(math.log(3))
    assert got["mean_abs_diff"] == pytest.approx((2 * math.log(2) + math.log(3)) / 4)


def test_metrics_of_no_tokens_are_absent_not_zero():
    got = mismatch_metrics(np.empty(0), np.empty(0), np.empty(0))
    assert got["tokens"] == 0 and got["k3_kl"] is None and got["max_abs_diff"] is None


@pytest.mark.parametrize("tokens", [0, 4])
def test_the_names_rescore_writes_are_the_ones_gate_bounds(tokens):
    """The metrics are computed under literal names; gate knows them from io.rundir's list."""
    got = mismatch_metrics(TRAIN[:tokens], ROLLOUT[:tokens], SEQUENCE[:tokens])
    assert tuple(got) == MISMATCH_KEYS


def test_identical_logprobs_measure_no_mismatch():
    got = mismatch_metrics(ROLLOUT, ROLLOUT, SEQUENCE)
    assert got["k3_kl"] == got["k1_kl"] == got["max_abs_diff"] == got["chi2_token"] == got["log_ppl_abs_diff"] == 0


def test_correction_outcomes_by_hand():
    # A: r = (0, ln 2.5, ln 0.4), Σ = 0 → the sequence ratio is 1; B: r = (ln 3), sequence ratio 3.
    ratio = np.array([0.0, math.log(2.5), math.log(0.4), math.log(3)])
    got = token_outcomes(ratio, SEQUENCE, CorrectionOptions())
    assert got["token_tis"].tolist() == [KEPT, CLIPPED, KEPT, CLIPPED]  # ρ > 2
    assert got["seq_tis"].tolist() == [KEPT, KEPT, KEPT, CLIPPED]  # only B's product exceeds 2
    assert got["token_mis"].tolist() == [KEPT, MASKED, MASKED, MASKED]  # ρ outside [0.5, 2]
    assert got["seq_mis"].tolist() == [KEPT, KEPT, KEPT, MASKED]
    assert got["icepop"].tolist() == [KEPT, MASKED, MASKED, MASKED]  # ρ outside [0.5, 2], as slime runs it
    wide = token_outcomes(ratio, SEQUENCE, CorrectionOptions(icepop_high=5.0))
    assert wide["icepop"].tolist() == [KEPT, KEPT, MASKED, KEPT]  # a wider band: only 0.4 falls out
    # mean k3 of A: (0 + (2.5 − ln 2.5 − 1) + (0.4 − ln 0.4 − 1)) / 3 ≈ 0.30 > 0.01; B: 3 − ln 3 − 1 ≈ 0.90
    assert got["k3_rs"].tolist() == [MASKED] * 4
    looser = token_outcomes(ratio, SEQUENCE, CorrectionOptions(k3_threshold=0.5, icepop_low=0.3, icepop_high=5.0))
    assert looser["k3_rs"].tolist() == [KEPT, KEPT, KEPT, MASKED]
    assert looser["icepop"].tolist() == [KEPT] * 4


def test_a_ratio_on_the_threshold_is_kept():
    got = token_outcomes(np.array([math.log(2.0), math.log(0.5)]), np.array([0, 1]), CorrectionOptions())
    assert got["token_tis"].tolist() == [KEPT, KEPT] and got["token_mis"].tolist() == [KEPT, KEPT]


def test_preview_fractions_by_tool_and_turns_losing_all_gradient():
    ratio = np.array([0.0, math.log(2.5), math.log(0.4), math.log(3)])
    tokens = pd.DataFrame(
        {
            "session_id": ["s", "s", "s", "s"],
            "turn_index": [0, 1, 1, 2],
            "tool": ["Read", "Edit", "Edit", "Bash"],
            "cause": ["none", "key_order", "key_order", "none"],
        }
    )
    outcomes = token_outcomes(ratio, SEQUENCE, CorrectionOptions())
    got = preview(tokens, outcomes, {"by_tool": "tool", "by_drift_cause": "cause"})
    mis = got["token_mis"]
    assert mis["tokens"] == 4 and mis["masked_fraction"] == 0.75 and mis["clipped_fraction"] == 0
    assert mis["by_tool"]["Edit"]["masked_fraction"] == 1.0 and mis["by_tool"]["Read"]["masked_fraction"] == 0
    assert mis["by_drift_cause"]["key_order"]["masked_fraction"] == 1.0
    assert mis["turns"] == 3 and mis["turns_losing_all_gradient"] == 2
    assert mis["lost_turns"] == [{"session_id": "s", "turn_index": 1}, {"session_id": "s", "turn_index": 2}]
    tis = got["token_tis"]
    assert tis["clipped_fraction"] == 0.5 and tis["masked_fraction"] == 0 and tis["turns_losing_all_gradient"] == 0
    assert got["icepop"]["by_tool"]["Edit"]["masked_fraction"] == 1.0  # slime's band is token_mis's [0.5, 2]


@pytest.mark.parametrize("kwargs", [{"mis_low": 2.0, "mis_high": 1.0}, {"icepop_low": 0}, {"tis_cap": 0}])
def test_bad_thresholds_are_refused_with_the_option_named(kwargs):
    with pytest.raises(TraceToolsError, match="band|--tis-cap"):
        CorrectionOptions(**kwargs)
