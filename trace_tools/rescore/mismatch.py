"""Training–inference mismatch metrics under the frameworks' names (numpy only, no torch).

Inputs, per trained token: `train` = the trainer's logprob (rescored here, or read from a trainer's
own export), `rollout` = the logprob the inference engine recorded when it sampled the token, and
`sequence` = which sequence the token belongs to (a sample, or a turn inside one). With the log
ratio r = train − rollout (log ρ, ρ = π_train / π_rollout), every metric is defined as verl's
`rollout_corr` metrics are (`verl/trainer/ppo/rollout_corr_helper.py`,
`compute_offpolicy_metrics`) and slime's `mismatch_*` ones
(`examples/train_infer_mismatch_helper/mis.py`, `add_ppl_metrics`):

* token means over all tokens: `k1_kl` = mean(rollout − train) (verl `kl`, slime `mismatch_kl`),
  `k3_kl` = mean(e^r − r − 1), `chi2_token` = mean(ρ²) − 1 (log ρ clamped to ±20 as both do);
* per sequence first, then the mean over sequences: `training_log_ppl` = mean_seq(−mean(train)),
  `rollout_log_ppl`, `training_ppl` = mean_seq(exp(−mean(train))), `rollout_ppl`,
  `log_ppl_diff` = mean_seq(mean(rollout) − mean(train)) (= log of the sequence's ppl ratio),
  `log_ppl_abs_diff` = mean_seq(|…|), `log_ppl_diff_max` / `_min`, `ppl_ratio` = mean_seq(exp(…)),
  `chi2_seq` = mean_seq(exp(2 Σ r)) − 1 (Σ r clamped to ±20);
* |Δ| with Δ = rollout − train: `mean_abs_diff` (slime `train_rollout_logprob_abs_diff`, here a
  plain token mean), `max_abs_diff`, `p50/p90/p99_abs_diff`.

`tokens` and `sequences` count what was measured; every metric is None over no tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trace_tools.io.rundir import MISMATCH_METRICS

SAFETY_BOUND = 20.0  # |log ρ| clamp before exponentiating, verl's and slime's constant
QUANTILES = {"p50_abs_diff": 0.5, "p90_abs_diff": 0.9, "p99_abs_diff": 0.99}
HEADLINE_KEYS = ("max_abs_diff", "k3_kl", "log_ppl_abs_diff")  # what `rescore --samples --json` prints


def mismatch_metrics(train: np.ndarray, rollout: np.ndarray, sequence: np.ndarray) -> dict[str, Any]:
    """The metrics above over one set of trained tokens; `sequence` labels each token's sequence."""
    train = np.asarray(train, dtype=np.float64)
    rollout = np.asarray(rollout, dtype=np.float64)
    if train.size == 0:
        return {"tokens": 0, "sequences": 0, **{key: None for key in MISMATCH_METRICS}}
    _, codes = np.unique(np.asarray(sequence), return_inverse=True)
    ratio = train - rollout
    magnitude = np.abs(ratio)
    counts = np.bincount(codes).astype(np.float64)
    mean_train = np.bincount(codes, train) / counts
    mean_rollout = np.bincount(codes, rollout) / counts
    log_ppl_diff = mean_rollout - mean_train
    ratio_sum = np.clip(np.bincount(codes, ratio), -SAFETY_BOUND, SAFETY_BOUND)
    out: dict[str, Any] = {
        "tokens": int(train.size),
        "sequences": int(counts.size),
        "k1_kl": float(np.mean(-ratio)),
        # expm1 keeps e^r − 1 − r exact for the tiny r of a matching context (float noise ~1e-6)
        "k3_kl": float(np.mean(np.expm1(ratio) - ratio)),
        "training_log_ppl": float(np.mean(-mean_train)),
        "rollout_log_ppl": float(np.mean(-mean_rollout)),
        "training_ppl": float(np.mean(np.exp(-mean_train))),
        "rollout_ppl": float(np.mean(np.exp(-mean_rollout))),
        "log_ppl_diff": float(np.mean(log_ppl_diff)),
        "log_ppl_abs_diff": float(np.mean(np.abs(log_ppl_diff))),
        "log_ppl_diff_max": float(np.max(log_ppl_diff)),
        "log_ppl_diff_min": float(np.min(log_ppl_diff)),
        "ppl_ratio": float(np.mean(np.exp(log_ppl_diff))),
        "chi2_token": float(np.mean(np.exp(2.0 * np.clip(ratio, -SAFETY_BOUND, SAFETY_BOUND))) - 1.0),
        "chi2_seq": float(np.mean(np.exp(2.0 * ratio_sum)) - 1.0),
        "mean_abs_diff": float(np.mean(magnitude)),
        "max_abs_diff": float(np.max(magnitude)),
    }
    for key, value in zip(QUANTILES, np.quantile(magnitude, list(QUANTILES.values()))):
        out[key] = float(value)
    return out


def headline(metrics: dict[str, Any]) -> dict[str, Any]:
    """The three numbers a strategy's mismatch is summed up by."""
    return {key: metrics.get(key) for key in HEADLINE_KEYS}
