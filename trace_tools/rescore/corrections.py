"""Correction preview: what the frameworks' off-policy corrections would do to each trained token.

Pure arithmetic on the per-token log ratio r = log π_train − log π_rollout (ρ = e^r) and the
sample each token belongs to (a sample is what verl and slime call a sequence). Every test is done
in log space, as verl does, so a ρ of exactly the threshold is kept. Per mode, a token ends
`kept` (weight ρ or 1, unchanged), `clipped` (its weight is cut to the cap: it still has a
gradient, a smaller one) or `masked` (weight 0: no gradient).

* `token_tis`: ρ > C → clipped to C (C = 2: verl `rollout_is="token"`, `rollout_is_threshold=2.0`;
  slime `--use-tis --tis-clip 2.0`);
* `seq_tis`: Π ρ over the sample > C → every token clipped (verl's default level, `"sequence"`);
* `token_mis`: ρ outside [low, high] → masked ([0.5, 2]: slime `mis.yaml`, `tis_mode: mask`);
* `seq_mis`: Π ρ over the sample outside [low, high] → every token masked (`tis_level: sequence`);
* `icepop`: ρ outside [α, β] → masked ([0.5, 2]: slime's `icepop_function` reads the band from
  `--tis-clip-low` / `--tis-clip`, and slime 624b824's own IcePop run sets 0.5 and 2.0);
* `k3_rs`: the sample's mean of e^r − r − 1 > τ → every token masked (τ = 0.01: verl
  `decoupled_k3_rs`, `rollout_rs="seq_mean_k3"`).

docs/rescore_samples.md has the same table with its sources.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from trace_tools.errors import TraceToolsError

KEPT, CLIPPED, MASKED = 0, 1, 2
MODES = ("token_tis", "seq_tis", "token_mis", "seq_mis", "icepop", "k3_rs")
LOST_TURNS_LISTED = 20  # turns that lose all their gradient, listed per mode in summary.json


@dataclass(frozen=True)
class CorrectionOptions:
    """Thresholds of the correction modes (module docstring: meaning and sources)."""

    tis_cap: float = 2.0
    mis_low: float = 0.5
    mis_high: float = 2.0
    icepop_low: float = 0.5
    icepop_high: float = 2.0
    k3_threshold: float = 0.01

    def __post_init__(self) -> None:
        if not (self.tis_cap > 0 and self.k3_threshold > 0):
            raise TraceToolsError("--tis-cap and --k3-threshold must be positive")
        for name, low, high in (("mis", self.mis_low, self.mis_high), ("icepop", self.icepop_low, self.icepop_high)):
            if not 0 < low < high:
                raise TraceToolsError(f"the {name} band needs 0 < low < high, got [{low}, {high}]")

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def token_outcomes(log_ratio: np.ndarray, sample: np.ndarray, options: CorrectionOptions) -> dict[str, np.ndarray]:
    """Per mode, each token's outcome (KEPT, CLIPPED or MASKED); `sample` labels each token's sample."""
    r = np.asarray(log_ratio, dtype=np.float64)
    _, codes = np.unique(np.asarray(sample), return_inverse=True)
    counts = np.bincount(codes).astype(np.float64) if r.size else np.zeros(0)
    seq_log_ratio = (np.bincount(codes, r) if r.size else np.zeros(0))[codes]
    seq_k3 = (np.bincount(codes, np.expm1(r) - r) / counts)[codes] if r.size else r

    def outside(values: np.ndarray, low: float, high: float) -> np.ndarray:
        return (values < math.log(low)) | (values > math.log(high))

    cap = math.log(options.tis_cap)
    return {
        "token_tis": np.where(r > cap, CLIPPED, KEPT).astype(np.int8),
        "seq_tis": np.where(seq_log_ratio > cap, CLIPPED, KEPT).astype(np.int8),
        "token_mis": np.where(outside(r, options.mis_low, options.mis_high), MASKED, KEPT).astype(np.int8),
        "seq_mis": np.where(outside(seq_log_ratio, options.mis_low, options.mis_high), MASKED, KEPT).astype(np.int8),
        "icepop": np.where(outside(r, options.icepop_low, options.icepop_high), MASKED, KEPT).astype(np.int8),
        "k3_rs": np.where(seq_k3 > options.k3_threshold, MASKED, KEPT).astype(np.int8),
    }


def preview(tokens: pd.DataFrame, outcomes: dict[str, np.ndarray], groups: Mapping[str, str]) -> dict[str, Any]:
    """Per mode: the fractions of trained tokens masked and clipped, overall and per value of each
    column of `groups` (summary key → column: `{"by_tool": "tool"}`), and the turns that lose all
    their gradient.

    `tokens` holds one row per trained token with `session_id` and `turn_index` (a turn is the
    unit that loses its gradient: all its trained tokens, in every sample, masked)."""
    out: dict[str, Any] = {}
    for mode, outcome in outcomes.items():
        frame = tokens[["session_id", "turn_index", *groups.values()]].assign(
            masked=outcome == MASKED, clipped=outcome == CLIPPED
        )
        entry: dict[str, Any] = _fractions(frame)
        for key, column in groups.items():
            entry[key] = {
                str(value): _fractions(part) for value, part in frame.groupby(column, dropna=False, sort=True)
            }
        lost = frame.groupby(["session_id", "turn_index"], sort=True)["masked"].all()
        lost_turns = [{"session_id": s, "turn_index": int(t)} for (s, t), gone in lost.items() if gone]
        entry["turns"] = int(lost.size)
        entry["turns_losing_all_gradient"] = len(lost_turns)
        entry["lost_turns"] = lost_turns[:LOST_TURNS_LISTED]
        out[mode] = entry
    return out


def _fractions(frame: pd.DataFrame) -> dict[str, Any]:
    tokens = len(frame)
    return {
        "tokens": tokens,
        "masked_fraction": float(frame["masked"].mean()) if tokens else None,
        "clipped_fraction": float(frame["clipped"].mean()) if tokens else None,
    }
