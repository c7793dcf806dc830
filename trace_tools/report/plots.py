"""Matplotlib plots of a run (Agg backend; imported only when a report is written)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd


def write_plots(plot_dir: Path, tables: dict[str, pd.DataFrame]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    plot_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (("coverage_by_tool", _coverage_by_tool), ("samples_per_session", _samples_hist),
                       ("drift_start", _drift_start)):
        path = plot_dir / f"{name}.png"
        if draw(tables, path):
            written.append(str(path))
    return written


def _coverage_by_tool(tables: dict[str, pd.DataFrame], path: Path) -> bool:
    import matplotlib.pyplot as plt

    turns = tables["turns"]
    if not len(turns):
        return False
    grouped = turns.groupby(["tool", "strategy"])[["trained_tokens", "generated_tokens"]].sum()
    coverage = (grouped["trained_tokens"] / grouped["generated_tokens"].where(grouped["generated_tokens"] > 0)).unstack()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(coverage)), 4))
    coverage.plot.bar(ax=ax, width=0.8)
    ax.set_ylabel("token coverage (trained / generated)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Loss-mask coverage by tool")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def _samples_hist(tables: dict[str, pd.DataFrame], path: Path) -> bool:
    import matplotlib.pyplot as plt

    sessions = tables["sessions"]
    if not len(sessions):
        return False
    counts = sessions.groupby(["samples", "strategy"]).size().unstack(fill_value=0)
    fig, ax = plt.subplots(figsize=(7, 4))
    counts.plot.bar(ax=ax, width=0.8)
    ax.set_xlabel("samples per session")
    ax.set_ylabel("sessions")
    ax.set_title("Samples per session")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def _drift_start(tables: dict[str, pd.DataFrame], path: Path) -> bool:
    import matplotlib.pyplot as plt

    turns = tables["turns"]
    if not len(turns) or "drift_position" not in turns:
        return False
    drifted = turns.dropna(subset=["drift_position", "prompt_tokens"])
    drifted = drifted[drifted["prompt_tokens"] > 0]
    if not len(drifted):
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for strategy, group in drifted.groupby("strategy"):
        ax.hist(group["drift_position"] / group["prompt_tokens"], bins=20, range=(0, 1), alpha=0.5, label=strategy)
    ax.set_xlabel("first divergence / prompt length")
    ax.set_ylabel("drifted turns")
    ax.set_title("Where in the context drift starts")
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path: Path) -> bool:
    import matplotlib.pyplot as plt

    tmp = path.with_suffix(".tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return True
