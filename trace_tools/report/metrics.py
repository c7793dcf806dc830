"""Run-level metrics (docs/metrics.md#per-run), and per step when the dump has steps
(docs/metrics.md#per-step), computed from the run tables; `summary.json` is their JSON form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from trace_tools.render.renderer import verify_summary
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


def upstream_lines(summary: dict[str, Any]) -> list[str]:
    """The one-line notes every view prints: lenient renders, and strategies failing most requests."""
    lines = []
    for s in summary.get("strategies", {}).values():
        if "lenient_render" in s:
            lines.append(s["lenient_render"]["label"])
        headline = (s.get("upstream_failures") or {}).get("headline")
        if headline:
            lines.append(headline)
    return lines


def reconstruction_summary(stats: dict[str, int]) -> dict[str, Any]:
    """How the run's prompts were rendered: incrementally, or in full and why (`render.incremental`).

    `full_renders_by_reason["no_cached_prefix"]` counts the first render of each conversation;
    the other reasons are fallbacks from the incremental path (e.g. `history_rewrite` where a
    template re-renders earlier turns, `appended_role` for a new user or system message)."""

    reasons = {key.split(":", 1)[1]: int(value) for key, value in sorted(stats.items()) if key.startswith("full:")}
    return {
        "incremental_renders": int(stats.get("incremental", 0)),
        "full_renders": int(stats.get("full", 0)),
        "full_renders_by_reason": reasons,
        "cache_hits": int(stats.get("cache_hits", 0)),
        "tokens_encoded": int(stats.get("tokens_encoded", 0)),
        "tokens_reused": int(stats.get("tokens_reused", 0)),
        "templates_not_incremental": int(stats.get("template_not_incremental", 0)),
        # only on the other render paths, so a default run's summary is what it was
        **({"reference_renders": int(stats["reference_renders"])} if stats.get("reference_renders") else {}),
        **({"verify": verify_summary(stats)} if stats.get("verify:checked") else {}),
    }
