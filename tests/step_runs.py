"""A run directory whose summary has `by_step`, made from a real run for the tests of per-step views.

The replayed sessions are split into steps (a few sessions each, in session-id order) and each
step's block is computed by the run's own summary functions over that step's rows, in the
`by_step` shape of docs/metrics.md: what a run of a dump with a `step` column holds, without
depending on how the dump came to have one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from trace_tools.report.metrics import drift_causes, strategy_summary, token_savings

STEP_GAP = 10  # steps 0, 10, 20, ...: the series are indexed by the step's value, not its position


def stepped_run(run_dir: Path, dest: Path, sessions_per_step: int = 4) -> Path:
    """A copy of `run_dir` whose summary.json gains `by_step` (its sessions `sessions_per_step` to a step)."""
    shutil.copytree(run_dir, dest)
    summary = json.loads((run_dir / "summary.json").read_text())
    sessions = pd.read_parquet(run_dir / "sessions.parquet")
    turns = pd.read_parquet(run_dir / "turns.parquet")
    order = sorted(sessions["session_id"].unique())
    step_of = {sid: (i // sessions_per_step) * STEP_GAP for i, sid in enumerate(order)}
    summary["by_step"] = [
        _step_block(
            step,
            sessions[sessions["session_id"].map(step_of) == step],
            turns[turns["session_id"].map(step_of) == step],
            list(summary["strategies"]),
        )
        for step in sorted(set(step_of.values()))
    ]
    summary["sessions_without_step"] = 0
    (dest / "summary.json").write_text(json.dumps(summary))
    return dest


def _step_block(step: int, sessions: pd.DataFrame, turns: pd.DataFrame, strategies: list[str]) -> dict:
    blocks = {name: strategy_summary(turns, sessions, name) for name in strategies}
    return {
        "step": step,
        "sessions_replayed": int(sessions["session_id"].nunique()),
        "turns_replayed": int(len(turns[["session_id", "turn_index"]].drop_duplicates())),
        "strategies": blocks,
        "token_savings": token_savings(blocks),
        "drift_causes": drift_causes(turns),
    }
