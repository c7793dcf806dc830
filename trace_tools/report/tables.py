"""The terminal view of a run summary (replay and report print it; the library builds it).

`summary_view(summary, width)` returns rich renderables: the quarantine (reasons, one example
each, where the full list is), warnings, the headline table with its footnotes, coverage and
dropped turns by tool, and one legend for the strategy labels. Every table goes through
`layout.fit`, so nothing is cut at 80 columns or in a pipe.
"""

from __future__ import annotations

import os
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from rich.text import Text

from trace_tools.io import storage
from trace_tools.io.bundled import shown_dump
from trace_tools.io.rundir import load_run_info, read_arrow
from trace_tools.report.escape import visible
from trace_tools.report.layout import ABSENT, Column, count, fit, label, legend, signed_pct
from trace_tools.report.verdict import upstream_lines, verdict_lines
from trace_tools.strategies.declarations import counter_applies

HEADLINE_NOTE = (
    "coverage = trained / generated tokens. max forks = the most samples one session split into, "
    "minus one. forwarded = tokens of all emitted samples (what the trainer pays for); context = "
    "forwarded - trained."
)
SAVINGS_NOTE = "saved vs tree = 1 - forwarded / forwarded of tree"
TRAINING_LESS_NOTE = "* = saves tokens by training fewer"
# The counters the terminal shows (report.md and report.html show every counter).
TERMINAL_COUNTERS = ("rewrite_merges", "nonlinear", "resets", "close_unresolved")
COUNTERS_NOTE = (
    "rewrite_merges: rewritten assistant echoes absorbed into the tree (that turn no longer trains); "
    "nonlinear: requests that are not an append-only extension the template renders as a prefix; "
    "resets: times the healer re-anchored on such a request; close_unresolved: turns whose closer "
    f"after the last assistant could not be resolved. {ABSENT} = the strategy has no such step."
)


def verdict_view(summary: dict[str, Any], gateway: str | None = None) -> list[Any]:
    """The verdict `replay` and `report` open with (`report.verdict`), narrowed to `gateway`."""
    verdict = [Text(visible(line)) for line in verdict_lines(summary, gateway)]  # names from the dump
    return _section("Verdict", verdict) if verdict else []


def summary_view(summary: dict[str, Any], width: int, run_dir: Path | str | None = None) -> list[Any]:
    """Everything `trace-tools replay` and `report` print for a run after the verdict, fitted to `width` cells."""
    out: list[Any] = [*quarantine_view(summary, run_dir), *notes_view(summary), *upstream_view(summary)]
    out += _section(
        f"What each strategy would train ({_replayed(summary)})",
        headline_tables(summary, width),
    ) + [Text(headline_note(summary))]
    counters = counter_tables(summary, width)
    if counters:
        out += _section("Counters: merges, nonlinear requests, resets, unresolved closers", counters) + [
            Text(COUNTERS_NOTE)
        ]
    out += _section(
        "Coverage by tool: trained / generated tokens of the turns whose first call is that tool",
        tool_tables(summary, width),
    )
    out += _section("Dropped turns by tool: share of turns with no trained token", dropped_tables(summary, width))
    key = legend(summary["strategies"])
    return out + ([Text(""), Text(key)] if key else [])


def _replayed(summary: dict[str, Any]) -> str:
    """`N sessions, M turns` replayed, with the total read when some were quarantined."""
    total, turns = summary.get("sessions_total", 0), summary.get("turns_total", 0)
    replayed = summary.get("sessions_replayed", total)  # runs made before it was counted
    if replayed == total:
        return f"{count(total, 'session')}, {count(turns, 'turn')}"
    return f"{replayed} of {count(total, 'session')} replayed, {count(summary.get('turns_replayed', turns), 'turn')}"


def quarantine_view(summary: dict[str, Any], run_dir: Path | str | None = None) -> list[Text]:
    """Quarantined sessions by reason with one example message each, and where the full list is."""
    if not summary.get("quarantined"):
        return []
    examples = summary.get("quarantine_examples") or {}
    lines = [
        Text(
            f"{summary['quarantined']} of {count(summary.get('sessions_total', 0), 'session')} quarantined "
            "(not replayed):",
            style="yellow",
        )
    ]
    for reason, sessions in summary["quarantined_by_reason"].items():
        example = f"  e.g. {examples[reason]}" if reason in examples else ""
        lines.append(Text(f"  {reason}: {sessions}{example}"))
    if run_dir is not None:
        lines.append(Text(f"  every entry: {storage.join(storage.location(run_dir), 'quarantine.parquet')}"))
    return lines


def notes_view(summary: dict[str, Any]) -> list[Text]:
    """Prompt fidelity and the dump's counted warnings (turn_index gaps, empty generations)."""
    lines = []
    fidelity = summary.get("prompt_fidelity") or {}
    if fidelity.get("rate") is not None:
        lines.append(Text(f"prompt fidelity: {fidelity['exact']}/{fidelity['turns_compared']} turns re-render exactly"))
    warnings = {kind: n for kind, n in (summary.get("warnings") or {}).items() if n}
    if warnings:
        lines.append(
            Text(
                "warnings: "
                + ", ".join(f"{kind.replace('_', ' ')}: {n}" for kind, n in warnings.items())
                + " (legal; see `trace-tools validate`)",
                style="yellow",
            )
        )
    return lines


def upstream_view(summary: dict[str, Any]) -> list[Text]:
    """One line per strategy that fails most requests upstream, and per lenient render."""
    return [Text(line, style="yellow") for line in upstream_lines(summary)]


def headline_tables(summary: dict[str, Any], width: int) -> list[Any]:
    strategies, savings = summary["strategies"], summary.get("token_savings") or {}
    names = list(strategies)
    rows = [strategies[name] for name in names]
    values = [
        Column("samples", [_int(s["samples"]) for s in rows]),
        Column("per\nsess.", [f"{s['samples'] / s['sessions']:.2f}" if s["sessions"] else ABSENT for s in rows]),
        Column("max\nforks", [_int(s["forks"]["max"]) for s in rows]),
        Column("coverage", [_pct(s["coverage"], 1) for s in rows]),
        Column("trained", [_int(s["trained_tokens"]) for s in rows]),
        Column("forwarded", [_int(s["forwarded_tokens"]) for s in rows]),
        Column("context", [_int(s["context_tokens"]) for s in rows]),
    ]
    if savings:
        values.append(Column("saved vs\ntree", [_saving(savings.get(name)) for name in names]))
    return fit([Column("strategy", [label(n) for n in names], justify="left")], values, width)


def headline_note(summary: dict[str, Any]) -> str:
    """The headline table's footnote, explaining only the columns and marks it shows."""
    savings = summary.get("token_savings") or {}
    notes = [HEADLINE_NOTE]
    if savings:
        marked = any(entry["saves_by_training_less"] for entry in savings.values())
        notes.append(f"{SAVINGS_NOTE}{'; ' + TRAINING_LESS_NOTE if marked else ''}.")
    return " ".join(notes)


def counter_tables(summary: dict[str, Any], width: int) -> list[Any]:
    """TERMINAL_COUNTERS per strategy that fills at least one of them; n/a where one does not apply."""
    strategies = {
        name: s for name, s in summary["strategies"].items() if any(counter_applies(name, c) for c in TERMINAL_COUNTERS)
    }
    if not strategies:
        return []
    values = [
        Column(
            label(name),
            [_int(v) if counter_applies(name, c, v := s["counters"].get(c, 0)) else ABSENT for c in TERMINAL_COUNTERS],
        )
        for name, s in strategies.items()
    ]
    return fit([Column("counter", list(TERMINAL_COUNTERS), justify="left")], values, width)


def tool_tables(summary: dict[str, Any], width: int) -> list[Any]:
    """Token coverage by tool: one row per tool, one column per strategy."""
    return _per_tool(summary, width, lambda s, tool, tt: _pct(s["coverage_by_tool"][tool]))


def dropped_tables(summary: dict[str, Any], width: int) -> list[Any]:
    """Share of a tool's turns with no trained token, per strategy."""
    return _per_tool(summary, width, lambda s, tool, tt: _pct(tt["dropped_turns"] / tt["turns"] if tt["turns"] else 0))


def _per_tool(summary: dict[str, Any], width: int, cell) -> list[Any]:
    strategies = summary["strategies"]
    tools = sorted({t for s in strategies.values() for t in s["tool_turns"]})
    turns = [max((s["tool_turns"].get(tool) or {}).get("turns", 0) for s in strategies.values()) for tool in tools]
    key = [Column("tool", tools, justify="left"), Column("turns", [_int(n) for n in turns])]
    values = [
        Column(
            label(name), [cell(s, tool, s["tool_turns"][tool]) if tool in s["tool_turns"] else ABSENT for tool in tools]
        )
        for name, s in strategies.items()
    ]
    return fit(key, values, width)


def next_steps(run_dir: Path | str) -> list[str]:
    """The commands worth running after a replay, each under a line saying why: open the report,
    explain the session that drifted most (from the run's drift table), gate the run in CI."""

    run = storage.location(run_dir)
    lines = ["next:", f"  open {storage.join(run, 'report.html')} in a browser"]
    dump = load_run_info(run).get("inputs", {}).get("dump")
    columns = ["session_id", "turn_index", "cause", "token_drift"]
    worst = _most_drifted(read_arrow(run, "drift", columns=columns)) if dump else None
    if worst is not None:
        session, turn, cause = worst
        lines += [
            f"  why the session that drifted most drifted at turn {turn} ({cause}):",
            f"    trace-tools explain {_shown(shown_dump(dump))} --session {_shown(session)} --turn {turn}",
        ]
    lines += [
        "  fail CI when a metric regresses (rules format: trace-tools gate -h):",
        f"    trace-tools gate {_shown(run)} --rules rules.toml",
    ]
    return lines


def _shown(location: Path | str) -> str:
    """A path as short as it can be typed from here (relative below the working directory), quoted
    for the shell where needed."""

    text = str(location)
    if not storage.is_uri(text) and os.path.isabs(text):
        relative = os.path.relpath(text)
        text = relative if not relative.startswith("..") else text
    return shlex.quote(text)


def _most_drifted(drift: Any) -> tuple[str, int, str] | None:
    """The session with the most turns whose ids drifted (first by id on a tie), its first such turn
    and the cause; turns whose drift no token shows (a tool-call id) only where no other drifted.
    `drift`: the drift table as Arrow (or None), read without pandas (`report.finish`)."""
    if drift is None or "cause" not in drift.column_names:
        return None
    drifted = [row for row in drift.to_pylist() if row["cause"] is not None]
    if any(row.get("token_drift") for row in drifted):
        drifted = [row for row in drifted if row.get("token_drift")]
    if not drifted:
        return None
    counts = Counter(row["session_id"] for row in drifted)
    session = min(counts, key=lambda sid: (-counts[sid], sid))
    first = min((row for row in drifted if row["session_id"] == session), key=lambda row: row["turn_index"])
    return str(session), int(first["turn_index"]), str(first["cause"])


def _section(title: str, tables: list[Any]) -> list[Any]:
    """A blank line, the bold title (wrapping at the console, not the table), the tables."""
    return [Text(""), Text(title, style="bold"), *tables]


def _saving(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return ABSENT
    return signed_pct(entry["savings"]) + ("*" if entry["saves_by_training_less"] else "")


def _pct(x: float | None, digits: int = 0) -> str:
    return ABSENT if x is None else f"{100 * x:.{digits}f}%"


def _int(n: int) -> str:
    return f"{int(n):,}"
