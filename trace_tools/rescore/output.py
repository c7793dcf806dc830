"""A rescore's result and its run directory: Parquet tables, summary.json and the Δ histogram (no torch here)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trace_tools.rescore.metrics import DEFAULT_THRESHOLD

PLOT_NAME = "rescore_delta_hist.png"


@dataclass
class RescoreResult:
    """Tables (pandas) and the run summary of one rescore; `save` writes them as a run directory."""

    tokens: pd.DataFrame
    turns: pd.DataFrame
    sessions: pd.DataFrame
    summary: dict[str, Any]
    threshold: float = DEFAULT_THRESHOLD
    out_dir: Path | None = None
    written: list[Path] = field(default_factory=list)

    @property
    def flagged(self) -> pd.DataFrame:
        """Flagged turns, worst first (by max |Δ|)."""
        return self.turns[self.turns["flagged"]].sort_values("max_abs_delta", ascending=False)

    def save(self, directory: str | os.PathLike, write_tokens: bool = True) -> list[Path]:
        """tokens.parquet (optional), turns.parquet, sessions.parquet, summary.json, plots/rescore_delta_hist.png."""
        self.out_dir = Path(directory)
        self.written = write_run(self, self.out_dir, write_tokens)
        return self.written


def write_run(result: RescoreResult, directory: Path, write_tokens: bool = True) -> list[Path]:
    """Write every output atomically; returns the paths written."""
    from trace_tools.io.write import write_json_atomic, write_parquet_atomic

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    tables = {"turns.parquet": result.turns, "sessions.parquet": result.sessions}
    if write_tokens:
        tables = {"tokens.parquet": result.tokens, **tables}
    for name, frame in tables.items():
        write_parquet_atomic(frame, directory / name)
        written.append(directory / name)
    write_json_atomic(result.summary, directory / "summary.json")
    written.append(directory / "summary.json")
    written.append(
        plot_delta_histogram(result.tokens["delta"].to_numpy(), directory / "plots" / PLOT_NAME, result.threshold)
    )
    return written


def plot_delta_histogram(delta: np.ndarray, path: Path, threshold: float) -> Path:
    """Two panels: signed Δ (linear x, log counts) and |Δ| on a log axis, which separates the
    floating-point noise floor (~1e-6 in float32, ~1e-2 in bf16) from real mismatches."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(figure)  # a private canvas: no pyplot global state, works headless
    signed, magnitude = figure.subplots(1, 2)
    delta = np.asarray(delta, dtype=np.float64)
    if delta.size:
        signed.hist(delta, bins=81, color="tab:blue", log=True)
        positive = np.abs(delta[delta != 0])
        if positive.size:
            low = max(float(positive.min()), 1e-9)
            bins = np.logspace(np.log10(low), np.log10(max(float(positive.max()), low * 10)), 61)
            magnitude.hist(positive, bins=bins, color="tab:orange", log=True)
        magnitude.set_xscale("log")
    for axis in (signed, magnitude):
        axis.axvline(threshold, color="tab:red", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    signed.axvline(-threshold, color="tab:red", linestyle="--", linewidth=1)
    signed.set(title=f"Δ = recorded − recomputed ({delta.size} tokens)", xlabel="Δ (nats)", ylabel="tokens")
    exact = int(np.sum(delta == 0))
    magnitude.set(title=f"|Δ| (log scale; {exact} tokens with Δ = 0 not shown)", xlabel="|Δ| (nats)")
    magnitude.legend(loc="upper right")
    return _save_atomic(figure, path)


def _save_atomic(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        figure.savefig(tmp, dpi=110)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
