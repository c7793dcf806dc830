"""Run-level metrics (docs/metrics.md#per-run), and per step when the dump has steps
(docs/metrics.md#per-step), computed from the run tables; `summary.json` is their JSON form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from trace_tools.report.aggregate import RunAggregate, aggregate_run, failures_of, token_savings

__all__ = ["drift_causes", "step_summaries", "summarize", "summarize_run", "token_savings", "upstream_failures"]


def summarize(tables: dict[str, pd.DataFrame], loaded, strategies: list[str]) -> dict[str, Any]:
    """summary.json's metrics of tables held whole (a run directory's: `summarize_run`, in one
    bounded pass). Each table's rows of one session must be together, as replay writes them."""
    aggregate = RunAggregate()
    aggregate.add_turns(tables["turns"])
    aggregate.add_sessions(tables["sessions"])
    aggregate.add_quarantine(tables["quarantine"])
    aggregate.add_fidelity(tables.get("fidelity", pd.DataFrame()))
    return aggregate.summary(loaded, strategies)


def summarize_run(run_dir: Path, loaded, strategies: list[str]) -> dict[str, Any]:
    """summary.json's metrics from a run directory's tables, read in batches: the memory it takes
    grows with the sessions' ids and the distinct tools, steps and reasons, not with the turns."""
    return aggregate_run(run_dir).summary(loaded, strategies)


def step_summaries(turns: pd.DataFrame, sessions: pd.DataFrame, strategies: list[str]) -> dict[str, Any]:
    """`{"by_step": [...], "sessions_without_step": n}` when the run's sessions carry steps, else {}.

    Each item holds, for the sessions of one step, what the top level holds for the run: sessions
    and turns replayed, `strategies`, `token_savings` and `drift_causes` (docs/metrics.md#per-step)."""
    aggregate = RunAggregate()
    aggregate.add_turns(turns)
    aggregate.add_sessions(sessions)
    return aggregate.step_summaries(strategies)


def drift_causes(turns: pd.DataFrame) -> dict[str, dict[str, dict[str, int]]]:
    """Per strategy and cause: drifted turns, turns that lost tokens, and the tokens lost."""
    aggregate = RunAggregate()
    aggregate.add_turns(turns)
    return aggregate.run_scope().drift_causes()


def upstream_failures(turns: pd.DataFrame, name: str) -> dict[str, Any]:
    """Requests the reproduced upstream system answers with an error (turns `failed` or `rejected`),
    by reason, and `headline`: one line naming the most common reason when they are most requests."""
    return failures_of(turns).upstream(name)
