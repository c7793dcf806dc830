"""Mismatch metrics between recorded (sampler) and recomputed (trainer) logprobs; numpy only.

Per token: Δ = recorded − recomputed, in nats; r = −Δ = recomputed − recorded is the log
importance ratio log(p_trainer / p_sampler) of that token. Over a set of tokens sampled from
the sampler (a turn, a session, the run):

* `mean_delta`, `mean_abs_delta`, `max_abs_delta`, `p50/p90/p99_abs_delta` (quantiles of |Δ|);
* `k1` = mean(Δ) and `k3` = mean(exp(r) − 1 − r): the sample estimators of KL(sampler ‖ trainer)
  in the k1/k2/k3 naming John Schulman popularised ("Approximating KL Divergence"). Both are
  unbiased when the tokens are sampled from the sampler; k1 is the plain log-ratio mean and can
  come out negative on a finite sample, k3 adds the control variate exp(r) − 1 (whose expectation
  under the sampler is 0), so every term is ≥ 0 and its variance is lower when the two
  distributions are close;
* `frac_above` = the fraction of tokens with |Δ| > `threshold`;
* `log_ratio` = Σ r = log p_trainer(sequence) − log p_sampler(sequence), the sequence-level log
  importance weight a trainer would apply (0 when both agree; large |log_ratio| means the
  sequence-level weight explodes or vanishes).

A turn is *flagged* when `mean_abs_delta > threshold` (the whole turn is off: wrong prompt,
template or weights) or `max_abs_delta > max_threshold` (one token's probability is off by more
than a factor e^max_threshold: a wrong id, a missed temperature or a corrupted logprob).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

DEFAULT_THRESHOLD = 0.05
DEFAULT_MAX_THRESHOLD = 1.0
QUANTILES = {"p50_abs_delta": 0.5, "p90_abs_delta": 0.9, "p99_abs_delta": 0.99}
STAT_KEYS = (
    "tokens",
    "mean_delta",
    "mean_abs_delta",
    "max_abs_delta",
    *QUANTILES,
    "k1",
    "k3",
    "frac_above",
    "log_ratio",
)


def token_stats(delta: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> dict[str, Any]:
    """The statistics above over one set of per-token Δ (None for each when the set is empty)."""
    delta = np.asarray(delta, dtype=np.float64)
    if delta.size == 0:
        return {key: (0 if key == "tokens" else None) for key in STAT_KEYS}
    magnitude = np.abs(delta)
    ratio = -delta
    stats: dict[str, Any] = {
        "tokens": int(delta.size),
        "mean_delta": float(delta.mean()),
        "mean_abs_delta": float(magnitude.mean()),
        "max_abs_delta": float(magnitude.max()),
    }
    for key, value in zip(QUANTILES, np.quantile(magnitude, list(QUANTILES.values()))):
        stats[key] = float(value)
    stats["k1"] = float(delta.mean())
    # expm1 keeps the O(r^2) terms exact when r is tiny (the usual case).
    stats["k3"] = float(np.mean(np.expm1(ratio) - ratio))
    stats["frac_above"] = float(np.mean(magnitude > threshold))
    stats["log_ratio"] = float(ratio.sum())
    return stats


def is_flagged(
    stats: dict[str, Any], threshold: float = DEFAULT_THRESHOLD, max_threshold: float = DEFAULT_MAX_THRESHOLD
) -> bool:
    """The flag rule from the module docstring (never for a turn without compared tokens)."""
    if not stats.get("tokens"):
        return False
    return stats["mean_abs_delta"] > threshold or stats["max_abs_delta"] > max_threshold


def worst_token(delta: np.ndarray) -> int | None:
    """Index of the token with the largest |Δ| (the first on ties), or None for no tokens."""
    return int(np.argmax(np.abs(delta))) if len(delta) else None


def pooled(deltas: Iterable[np.ndarray]) -> np.ndarray:
    """All tokens of several turns as one array (for session and run statistics)."""
    parts = [np.asarray(d, dtype=np.float64) for d in deltas]
    return np.concatenate(parts) if parts else np.empty(0)


def turn_log_ratio_summary(log_ratios: Iterable[float | None]) -> dict[str, float | None]:
    """Mean, min and max of the per-turn sequence log importance ratios."""
    values = np.array([v for v in log_ratios if v is not None], dtype=np.float64)
    if values.size == 0:
        return {"mean": None, "min": None, "max": None}
    return {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max())}
