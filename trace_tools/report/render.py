"""report.md and plots for a run directory, rebuilt from its tables (never from live objects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from trace_tools.io.write import write_text_atomic
from trace_tools.report.escape import markdown_cell
from trace_tools.report.layout import ABSENT, signed_pct
from trace_tools.report.plots import write_plots
from trace_tools.report.samples_audit import audit_markdown
from trace_tools.report.verdict import upstream_lines, verdict_lines
from trace_tools.strategies.declarations import BY_NAME, counter_applies

COUNTERFACTUAL_NOTE = (
    "Strategies marked *counterfactual* act before generation (they change the ids the engine would "
    "have seen). Replay reuses the recorded `output_ids` and logprobs as if the model had produced them "
    "on the healed/restored/re-encoded context, as agentcore's linear-history pull request validated its healing."
)


def write_report(
    run_dir: Path, summary: dict[str, Any], tables: dict[str, pd.DataFrame], plots: list[str] | None = None
) -> None:
    """RUN/report.md, and RUN/plots unless `plots` names the files already drawn."""

    if plots is None:
        plots = write_plots(run_dir / "plots", tables)
    write_text_atomic(markdown_report(summary, plots), run_dir / "report.md")


def markdown_report(summary: dict[str, Any], plots: list[str] | None = None) -> str:
    audit = summary.get("audit")  # an `audit-samples` run: the trainer's own samples, nothing replayed
    lines = [f"# trace-tools {'audit-samples' if audit else 'replay'} report", ""]
    # A tool or cause name comes from the dump: escaped, so it stays text in any Markdown viewer.
    verdict = [markdown_cell(line) for line in verdict_lines(summary)] if not audit else []
    if verdict:
        lines += [
            "## Verdict",
            "",
            *(f"  - {line.strip()}" if line.startswith("  ") else f"- {line}" for line in verdict),
            "",
        ]
    lines += _overview(summary)
    upstream = upstream_lines(summary)
    if upstream:
        lines += ["", *(f"> {line}" for line in upstream)]
    lines += ["", "## Strategies", "", *_strategy_table(summary), ""]
    lines += ["## Coverage by tool (token coverage; dropped turns in parentheses)", "", *_tool_table(summary), ""]
    lines += [audit_markdown(audit)] if audit else _replay_sections(summary)
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}](plots/{Path(p).name})" for p in plots] + [""]
    return "\n".join(lines)


def _replay_sections(summary: dict[str, Any]) -> list[str]:
    """What only a replay has: savings against `tree`, the strategies' counters, drift causes."""
    lines = ["## Token savings against `tree`", "", *_savings_table(summary), ""]
    lines += ["## Counters", "", *_counter_table(summary), ""]
    causes = summary.get("drift_causes")
    if causes:
        lines += ["## Drift causes", "", *_causes_table(causes), ""]
    if summary.get("by_step"):
        lines += ["## Per step (coverage; forks per session in parentheses)", "", *_step_table(summary), ""]
    return lines + [
        "## Counterfactual replay",
        "",
        COUNTERFACTUAL_NOTE,
        "",
        "Counterfactual here: " + (", ".join(f"`{n}`" for n in counterfactual_names(summary)) or "none") + ".",
        "",
    ]


def counterfactual_names(summary: dict[str, Any]) -> list[str]:
    """The run's strategies declared counterfactual (one this build does not declare is not named)."""
    return [name for name in summary["strategies"] if name in BY_NAME and BY_NAME[name].counterfactual]


def _overview(summary: dict[str, Any]) -> list[str]:
    fidelity = summary["prompt_fidelity"]
    rate = "n/a (no recorded prompt ids)" if fidelity["rate"] is None else f"{fidelity['rate']:.1%}"
    by_reason = ", ".join(f"{k}: {v}" for k, v in summary["quarantined_by_reason"].items()) or "none"
    vocab = (
        "" if summary.get("vocab_checked") else " Token ids were NOT checked against a vocabulary (no tokenizer known)."
    )
    warnings = ", ".join(f"{kind.replace('_', ' ')}: {n}" for kind, n in (summary.get("warnings") or {}).items() if n)
    return [
        f"- sessions: {summary['sessions_total']} ({summary['quarantined']} quarantined: {by_reason})",
        f"- turns: {summary['turns_total']}",
        f"- prompt fidelity (rendered == recorded prompt ids): {rate} of {fidelity['turns_compared']} turns.{vocab}",
        f"- warnings (legal, counted; sessions with a turn_index gap, turns with an empty generation): "
        f"{warnings or 'none'}",
    ]


def _strategy_table(summary: dict[str, Any]) -> list[str]:
    rows = [
        "| strategy | sessions | samples | samples/session | forks max | coverage | trained | forwarded | context |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in summary["strategies"].items():
        per = s["samples"] / s["sessions"] if s["sessions"] else 0
        rows.append(
            f"| {markdown_cell(name)} | {s['sessions']} | {s['samples']} | {per:.2f} | {s['forks']['max']} | "
            f"{s['coverage']:.1%} | {s['trained_tokens']} | {s['forwarded_tokens']} | {s['context_tokens']} |"
        )
    return rows


def _tool_table(summary: dict[str, Any]) -> list[str]:
    tools = sorted({t for s in summary["strategies"].values() for t in s["tool_turns"]})
    rows = [
        "| tool | turns | " + " | ".join(map(markdown_cell, summary["strategies"])) + " |",
        "|---|---:|" + "---:|" * len(summary["strategies"]),
    ]
    for tool in tools:
        cells, turns = [], 0
        for s in summary["strategies"].values():
            tt = s["tool_turns"].get(tool)
            turns = max(turns, tt["turns"] if tt else 0)
            cells.append(f"{s['coverage_by_tool'][tool]:.1%} ({tt['dropped_turns']})" if tt else ABSENT)
        rows.append(f"| {markdown_cell(tool)} | {turns} | " + " | ".join(cells) + " |")
    return rows


def _savings_table(summary: dict[str, Any]) -> list[str]:
    savings = summary.get("token_savings") or {}
    if not savings:
        return ["(no `tree` baseline in this run)"]
    rows = ["| strategy | samples Δ | forwarded Δ | trained Δ | savings | flag |", "|---|---:|---:|---:|---:|---|"]
    for name, v in savings.items():
        flag = "saves tokens by training fewer" if v["saves_by_training_less"] else ""
        deltas = f"{v['samples_delta']:+d} | {v['forwarded_delta']:+d} | {v['trained_delta']:+d}"
        rows.append(f"| {markdown_cell(name)} | {deltas} | {signed_pct(v['savings'])} | {flag} |")
    return rows


def _counter_table(summary: dict[str, Any]) -> list[str]:
    """Every counter the run holds: a row per counter some strategy counted, `n/a` where a strategy
    has no such step, and one line naming the counters that are zero everywhere (never dropped)."""
    strategies = summary["strategies"]
    every = list(dict.fromkeys(c for s in strategies.values() for c in s.get("counters", {})))
    shown = [c for c in every if any(s["counters"].get(c) for s in strategies.values())]
    zero = [c for c in every if c not in shown]
    rows = []
    if shown:
        rows += [f"| counter | {' | '.join(map(markdown_cell, strategies))} |", "|---|" + "---:|" * len(strategies)]
        for c in shown:
            values = {name: s["counters"].get(c, 0) for name, s in strategies.items()}
            cells = [str(v) if counter_applies(name, c, v) else ABSENT for name, v in values.items()]
            rows.append(f"| {c} | " + " | ".join(cells) + " |")
        rows.append("")
    if zero:
        rows.append(f"Zero in every strategy: {', '.join(f'`{c}`' for c in zero)}.")
    rows.append(f"{ABSENT}: the strategy has no such step.")
    return rows


STEP_ROWS = 40  # more steps than this: evenly spaced ones, the first and last among them


def _step_table(summary: dict[str, Any]) -> list[str]:
    """One row per step (at most `STEP_ROWS`): sessions, turns, drifted turns and, per strategy,
    coverage with forks per session."""
    items, names = summary["by_step"], list(summary["strategies"])
    shown = (
        [items[round(i * (len(items) - 1) / (STEP_ROWS - 1))] for i in range(STEP_ROWS)]
        if len(items) > STEP_ROWS
        else items
    )
    rows = [
        "| step | sessions | turns | drifted turns | " + " | ".join(map(markdown_cell, names)) + " |",
        "|---:|---:|---:|---:|" + "---:|" * len(names),
    ]
    for item in shown:
        cells = []
        for name in names:
            s = item["strategies"].get(name)
            cells.append(f"{s['coverage']:.1%} ({s['forks']['mean']:.2f})" if s and s["sessions"] else ABSENT)
        rows.append(
            f"| {item['step']} | {item['sessions_replayed']} | {item['turns_replayed']} | {_drifted(item)} | "
            + " | ".join(cells)
            + " |"
        )
    notes = []
    if len(items) > len(shown):
        notes.append(f"{len(shown)} of {len(items)} steps, evenly spaced; every step is in summary.json `by_step`.")
    if summary.get("sessions_without_step"):
        notes.append(f"{summary['sessions_without_step']} sessions have no step and are in no row.")
    return rows + ([""] + notes if notes else [])


def _drifted(item: dict[str, Any]) -> int:
    """Drifted turns of a step: the drift is the dump's, the same under every strategy, so the first one's count."""
    causes: dict[str, dict[str, int]] = next(iter(item["drift_causes"].values()), {})
    return sum(v["turns"] for v in causes.values())


def _causes_table(causes: dict[str, dict[str, dict[str, int]]]) -> list[str]:
    rows = ["| strategy | cause | drifted turns | turns losing tokens | tokens lost |", "|---|---|---:|---:|---:|"]
    for strategy, by_cause in causes.items():
        for cause, v in by_cause.items():
            rows.append(
                f"| {markdown_cell(strategy)} | {markdown_cell(cause)} | {v['turns']} | {v['turns_losing_tokens']} | "
                f"{v['tokens_lost']} |"
            )
    return rows
