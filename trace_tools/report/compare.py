"""Compare two runs (or two strategies of one run), and compare strategies by simulated behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from trace_tools.data import behaviour_label
from trace_tools.errors import TraceToolsError, UnknownName, UsageError
from trace_tools.io.rundir import load_summary, read_table
from trace_tools.report.rerender import read_run
from trace_tools.strategies.declarations import NAMES

OUTCOME_COLUMNS = ["samples", "trained_tokens", "forwarded_tokens"]


@dataclass
class Comparison:
    """`metrics`: every numeric summary leaf side by side; `tools`: coverage by tool side by side;
    `sessions`: sessions whose outcome (samples, trained or forwarded tokens) changed;
    `only_a`, `only_b`: strategies replayed in one run only, so not compared."""

    label_a: str
    label_b: str
    metrics: pd.DataFrame
    tools: pd.DataFrame
    sessions: pd.DataFrame
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)


def compare(run_a: str | Path, run_b: str | Path | None = None, strategies: list[str] | None = None) -> Comparison:
    """Two runs strategy by strategy, or (with one run and two strategy names) two strategies of it."""

    summary_a, sessions_a = load_summary(run_a), read_table(run_a, "sessions")
    summary_b, sessions_b = (
        (summary_a, sessions_a) if run_b is None else (load_summary(run_b), read_table(run_b, "sessions"))
    )
    pairs, labels, only_a, only_b = _pairs(run_a, run_b, summary_a, summary_b, strategies)
    return Comparison(
        labels[0],
        labels[1],
        _metric_deltas(summary_a, summary_b, pairs),
        _tool_sides(summary_a, summary_b, pairs),
        _changed_sessions(sessions_a, sessions_b, pairs),
        only_a,
        only_b,
    )


def _pairs(
    run_a: str | Path, run_b: str | Path | None, summary_a: dict, summary_b: dict, strategies: list[str] | None
) -> tuple[list[tuple[str, str]], tuple[str, str], list[str], list[str]]:
    """(strategy pairs compared, the two sides' labels, strategies only in A, only in B): two named
    strategies of one run, or the strategies two runs share (those named, when named)."""
    if run_b is None:
        if not strategies or len(strategies) != 2:
            raise UsageError("compare one run by naming two strategies: --strategy A --strategy B")
        _require_strategies(run_a, summary_a, strategies)
        return [(strategies[0], strategies[1])], (strategies[0], strategies[1]), [], []
    for run, summary in ((run_a, summary_a), (run_b, summary_b)):
        _require_strategies(run, summary, strategies or [])
    common = [s for s in summary_a["strategies"] if s in summary_b["strategies"]]
    names = [s for s in common if not strategies or s in strategies]
    if not names:
        raise TraceToolsError("the two runs share no strategy; replay both with a common --strategy")
    only_a = [] if strategies else [s for s in summary_a["strategies"] if s not in summary_b["strategies"]]
    only_b = [] if strategies else [s for s in summary_b["strategies"] if s not in summary_a["strategies"]]
    return [(s, s) for s in names], (str(run_a), str(run_b)), only_a, only_b


def _require_strategies(run: str | Path, summary: dict[str, Any], names: list[str]) -> None:
    """Every named strategy was replayed in the run, else a usage error naming the ones it has."""
    have = list(summary["strategies"])
    for name in names:
        if name not in have and name not in NAMES:  # a misspelling: suggest what the run has
            raise UnknownName("strategy", name, have)
        if name not in have:
            raise UsageError(
                f"run {run} has no strategy {name!r} (it has: {', '.join(have)}); "
                f"replay it with --strategy {name}, or compare strategies it has"
            )


def flatten(block: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in block.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[path] = float(value)
    return out


def _metric_deltas(a: dict, b: dict, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    rows = []
    for sa, sb in pairs:
        fa, fb = flatten(a["strategies"][sa]), flatten(b["strategies"][sb])
        for metric in sorted(set(fa) | set(fb)):
            va, vb = fa.get(metric), fb.get(metric)
            delta = vb - va if va is not None and vb is not None else None
            rows.append({"pair": _pair(sa, sb), "metric": metric, "a": va, "b": vb, "delta": delta})
    for key in ("quarantined", "sessions_total"):
        rows.append(
            {
                "pair": "run",
                "metric": key,
                "a": a.get(key),
                "b": b.get(key),
                "delta": (b.get(key) or 0) - (a.get(key) or 0),
            }
        )
    return pd.DataFrame(rows)


def _tool_sides(a: dict, b: dict, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    rows = []
    for sa, sb in pairs:
        ta, tb = a["strategies"][sa]["tool_turns"], b["strategies"][sb]["tool_turns"]
        for tool in sorted(set(ta) | set(tb)):
            ca = a["strategies"][sa]["coverage_by_tool"].get(tool)
            cb = b["strategies"][sb]["coverage_by_tool"].get(tool)
            rows.append(
                {
                    "pair": _pair(sa, sb),
                    "tool": tool,
                    "turns": (ta.get(tool) or tb.get(tool))["turns"],
                    "coverage_a": ca,
                    "coverage_b": cb,
                    "dropped_a": (ta.get(tool) or {}).get("dropped_turns"),
                    "dropped_b": (tb.get(tool) or {}).get("dropped_turns"),
                }
            )
    return pd.DataFrame(rows)


def _changed_sessions(a: pd.DataFrame, b: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    frames = []
    for sa, sb in pairs:
        left = a[a["strategy"] == sa].set_index("session_id")[OUTCOME_COLUMNS]
        right = b[b["strategy"] == sb].set_index("session_id")[OUTCOME_COLUMNS]
        joined = left.merge(right, how="outer", left_index=True, right_index=True, suffixes=("_a", "_b"))
        changed = joined[
            (
                joined[[f"{c}_a" for c in OUTCOME_COLUMNS]].values != joined[[f"{c}_b" for c in OUTCOME_COLUMNS]].values
            ).any(axis=1)
        ]
        frames.append(changed.reset_index().assign(pair=_pair(sa, sb)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _pair(a: str, b: str) -> str:
    return a if a == b else f"{a} → {b}"


@dataclass
class StepComparison:
    """`steps`: per step and compared pair, each metric of `STEP_METRICS` (and coverage by tool)
    for A and B and `delta` (B − A); steps one side lacks have `a` or `b` missing."""

    label_a: str
    label_b: str
    steps: pd.DataFrame


STEP_METRICS = ("sessions", "samples", "forks.mean", "coverage", "trained_tokens", "forwarded_tokens")


def compare_by_step(
    run_a: str | Path, run_b: str | Path | None = None, strategies: list[str] | None = None
) -> StepComparison:
    """Two strategies of one run, or two runs strategy by strategy, step by step (runs of dumps with steps)."""
    summary_a = load_summary(run_a)
    summary_b = summary_a if run_b is None else load_summary(run_b)
    pairs, labels, _, _ = _pairs(run_a, run_b, summary_a, summary_b, strategies)
    steps_a, steps_b = _steps_of(run_a, summary_a), _steps_of(run_b or run_a, summary_b)
    rows = []
    for step in sorted(set(steps_a) | set(steps_b)):
        for sa, sb in pairs:
            fa = _step_metrics(steps_a.get(step), sa)
            fb = _step_metrics(steps_b.get(step), sb)
            for metric in [m for m in STEP_METRICS if m in fa or m in fb] + sorted(
                m for m in set(fa) | set(fb) if m.startswith("coverage_by_tool.")
            ):
                va, vb = fa.get(metric), fb.get(metric)
                delta = vb - va if va is not None and vb is not None else None
                rows.append({"step": step, "pair": _pair(sa, sb), "metric": metric, "a": va, "b": vb, "delta": delta})
    return StepComparison(
        labels[0], labels[1], pd.DataFrame(rows, columns=["step", "pair", "metric", "a", "b", "delta"])
    )


def _steps_of(run: str | Path, summary: dict[str, Any]) -> dict[int, dict[str, Any]]:
    if not summary.get("by_step"):
        raise UsageError(
            f"run {run} has no steps (its dump has no step column); --by step needs a run replayed "
            "from a dump with steps (docs/trace_schema.md#columns)"
        )
    return {item["step"]: item for item in summary["by_step"]}


def _step_metrics(item: dict[str, Any] | None, strategy: str) -> dict[str, float]:
    block = ((item or {}).get("strategies") or {}).get(strategy)
    return flatten(block) if block else {}


def compare_by_behaviour(run: str | Path) -> pd.DataFrame:
    """Behaviour × strategy from the simulator's ground truth: samples and forwarded tokens against the
    ideal, and the share of genuine generated tokens trained."""

    tables = read_run(run)
    sessions, turns = tables["sessions"], tables["turns"]
    if not len(sessions) or sessions["ideal_samples"].isna().all():
        raise TraceToolsError(
            "this run has no simulator ground truth (metadata.behaviours / ideal_samples); "
            "--by behaviour needs a dump made by `trace-tools simulate`"
        )
    genuine = _genuine_share(turns)
    exploded = sessions.assign(behaviour=sessions["behaviours"].apply(behaviour_label))
    rows = []
    for (behaviour, strategy), group in exploded.groupby(["behaviour", "strategy"], sort=True):
        trained, total = genuine.get(strategy, {}).get(behaviour, (0, 0))
        rows.append(
            {
                "behaviour": behaviour,
                "strategy": strategy,
                "sessions": len(group),
                "samples_per_session": group["samples"].mean(),
                "ideal_samples_per_session": group["ideal_samples"].astype(float).mean(),
                "trained_share": trained / total if total else None,
                "forwarded_vs_ideal": group["forwarded_tokens"].sum()
                / group["ideal_forwarded_tokens"].astype(float).sum()
                if group["ideal_forwarded_tokens"].notna().all() and group["ideal_forwarded_tokens"].astype(float).sum()
                else None,
            }
        )
    return pd.DataFrame(rows)


def _genuine_share(turns: pd.DataFrame) -> dict[str, dict[str, tuple[int, int]]]:
    """Per strategy and behaviour: (trained, generated) tokens over the genuine turns."""
    if not len(turns) or "genuine" not in turns or "behaviour" not in turns:
        return {}
    frame = turns[turns["genuine"].fillna(False).astype(bool)]
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for (strategy, behaviour), group in frame.groupby(["strategy", "behaviour"]):
        out.setdefault(strategy, {})[behaviour] = (
            int(group["trained_tokens"].sum()),
            int(group["generated_tokens"].sum()),
        )
    return out
