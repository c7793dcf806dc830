"""The overview tab's tables, built from summary.json (static HTML rows; the page's JS only sorts them)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from trace_tools.report.layout import legend
from trace_tools.strategies.declarations import counter_applies, label

PLOT_TITLES = {
    "coverage_by_tool": "Loss-mask coverage by tool",
    "samples_per_session": "Samples per session",
    "drift_start": "Where in the context drift starts",
}
QUARANTINE_ROWS_SHOWN = 200


def strategy_rows(summary: dict[str, Any], counterfactual: list[str]) -> list[dict[str, Any]]:
    """One row per strategy: samples, coverage, token totals and savings against `tree`."""
    savings = summary.get("token_savings") or {}
    rows = []
    for name, s in summary["strategies"].items():
        saving = savings.get(name)
        rows.append(
            {
                "name": name,
                "counterfactual": name in counterfactual,
                "sessions": s["sessions"],
                "samples": s["samples"],
                "per_session": s["samples"] / s["sessions"] if s["sessions"] else 0.0,
                "forks_max": s["forks"]["max"],
                "coverage": s["coverage"],
                "trained": s["trained_tokens"],
                "forwarded": s["forwarded_tokens"],
                "context": s["context_tokens"],
                "savings": saving["savings"] if saving else None,
                "trained_delta": saving["trained_delta"] if saving else None,
                "flagged": bool(saving and saving["saves_by_training_less"]),
            }
        )
    return rows


def tool_columns(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Tools ordered by how many turns call them (most first), with their turn counts."""
    turns: dict[str, int] = {}
    for s in summary["strategies"].values():
        for tool, v in s["tool_turns"].items():
            turns[tool] = max(turns.get(tool, 0), v["turns"])
    return [{"name": t, "turns": n} for t, n in sorted(turns.items(), key=lambda kv: (-kv[1], kv[0]))]


def tool_rows(summary: dict[str, Any], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per strategy, per tool: token coverage and dropped turns (None where the tool never ran)."""
    rows = []
    for name, s in summary["strategies"].items():
        cells = []
        for tool in tools:
            tt = s["tool_turns"].get(tool["name"])
            cells.append(
                {
                    "coverage": s["coverage_by_tool"].get(tool["name"]),
                    "dropped": tt["dropped_turns"] if tt else 0,
                    "turns": tt["turns"] if tt else 0,
                }
            )
        rows.append({"name": name, "cells": cells})
    return rows


def counter_table(summary: dict[str, Any]) -> dict[str, Any]:
    """Counters as rows and strategies (short labels) as columns, so the table stays narrow: the
    counters some strategy counted, None where a strategy has no such step, and the all-zero ones."""

    blocks = summary["strategies"]
    every = list(dict.fromkeys(c for s in blocks.values() for c in s.get("counters", {})))
    shown = [c for c in every if any(s["counters"].get(c) for s in blocks.values())]
    rows = [
        {
            "name": c,
            "cells": [
                v if counter_applies(name, c, v := s["counters"].get(c, 0)) else None for name, s in blocks.items()
            ],
        }
        for c in shown
    ]
    columns = [{"name": name, "label": label(name)} for name in blocks]
    zero = [c for c in every if c not in shown]
    return {"columns": columns, "rows": rows, "zero": zero, "legend": legend(blocks)}


def cause_rows(summary: dict[str, Any], cause_text: dict[str, str]) -> list[dict[str, Any]]:
    """Per drift cause: each strategy's drifted turns, turns that lost tokens and tokens lost."""
    by_strategy = summary.get("drift_causes") or {}
    causes = sorted(
        {c for v in by_strategy.values() for c in v},
        key=lambda c: (list(cause_text).index(c) if c in cause_text else 99, c),
    )
    rows = []
    for cause in causes:
        cells = [by_strategy.get(name, {}).get(cause) for name in summary["strategies"]]
        turns = max((c["turns"] for c in cells if c), default=0)
        rows.append({"cause": cause, "text": cause_text.get(cause, ""), "turns": turns, "cells": cells})
    return rows


def quarantine_view(summary: dict[str, Any], quarantine) -> dict[str, Any]:
    """Counts by reason and the first rows (the rest stay in quarantine.parquet)."""
    import pandas as pd

    rows = []
    if quarantine is not None and len(quarantine):
        for rec in quarantine.head(QUARANTINE_ROWS_SHOWN).to_dict("records"):
            turn = rec.get("turn_index")
            rows.append(
                {
                    "session_id": rec.get("session_id") or "<file>",
                    "reason": rec.get("reason"),
                    "turn": "" if pd.isna(turn) else int(turn),
                    "detail": rec.get("detail") or "",
                }
            )
    total = 0 if quarantine is None else len(quarantine)
    return {
        "sessions": summary.get("quarantined", 0),
        "by_reason": summary.get("quarantined_by_reason") or {},
        "rows": rows,
        "hidden": max(total - len(rows), 0),
    }


def inline_plots(plot_dir: Path) -> list[dict[str, str]]:
    """The run's PNG plots as data URIs, so the page needs no file beside it."""
    plots = []
    for path in sorted(plot_dir.glob("*.png")):
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        plots.append(
            {
                "name": path.stem,
                "title": PLOT_TITLES.get(path.stem, path.stem.replace("_", " ")),
                "src": f"data:image/png;base64,{data}",
            }
        )
    return plots
