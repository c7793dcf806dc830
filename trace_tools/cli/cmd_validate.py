"""`trace-tools validate DUMP`: check a dump against trace schema v1 and show what is quarantined.

Exit codes (docs/commands.md#exit-codes-and-errors): 0 clean, or quarantine without `--strict` (reported, not an error);
1 quarantine with `--strict`; 2 unusable input (one line on stderr, no traceback; the command
handles that itself, so it behaves the same with or without main's error guard).
Library and rich imports happen inside the command so `trace-tools --help` stays fast.
"""

from pathlib import Path
from typing import Annotated, Optional

import typer

from trace_tools.cli._options import json_option, out_option, strict_option, tokenizer_option
from trace_tools.cli._output import TOKENIZER_HELP

SHOWN_ENTRIES = 20


def validate_cmd(
    dump: Annotated[
        str,
        typer.Argument(help="A Parquet file, or a directory of Parquet files (searched recursively); a path or a URI."),
    ],
    out: Annotated[
        Optional[Path],
        out_option("Also write the quarantine list to this Parquet file (quarantine.parquet columns)."),
    ] = None,
    strict: Annotated[bool, strict_option("Exit 1 when anything is quarantined.")] = False,
    tokenizer: Annotated[
        Optional[str],
        tokenizer_option(TOKENIZER_HELP + ", for the out-of-vocab check (overrides the dump's)."),
    ] = None,
    json_out: Annotated[bool, json_option("Print the report as JSON.")] = False,
) -> None:
    """Validate a trace dump: count sessions and turns, list quarantined sessions with reasons.

    DUMP: a Parquet file or a directory of them (searched recursively).

    Example: trace-tools validate dump.parquet --strict --out quarantine.parquet
    """
    from trace_tools.cli._output import error, print_json
    from trace_tools.errors import TraceToolsError
    from trace_tools.pipeline.validate import validate

    try:
        report = validate(dump, quarantine_out=out, tokenizer=tokenizer)
    except TraceToolsError as problem:
        error(str(problem))
        raise typer.Exit(problem.exit_code) from None
    if json_out:
        print_json(report.to_dict())
    else:
        _render(report, out)
    if strict and not report.clean:
        raise typer.Exit(1)


def _data_warnings(report) -> list[str]:
    """Legal but counted (docs/trace_schema.md#loading-validation-and-quarantine): turn_index gaps
    (sessions) and empty generations (turns)."""
    what = {
        "turn_index_gap": "session(s) with a turn_index gap (a dropped request?)",
        "empty_generation": "turn(s) with an empty generation (no output_ids)",
    }
    return [
        f"{count} {what.get(kind, kind)}, e.g. {report.warning_examples.get(kind, '?')}"
        for kind, count in report.data_warnings.items()
    ]


def _render(report, out: Optional[Path]) -> None:
    from rich.markup import escape

    from trace_tools.cli._output import console

    console.print(_summary_table(report))
    if report.entries:
        console.print(_entries_table(report.entries[:SHOWN_ENTRIES]))
        hidden = len(report.entries) - SHOWN_ENTRIES
        if hidden > 0:
            console.print(f"… and {hidden} more entries" + ("" if out else " (pass --out FILE to get them all)"))
    for warning in report.warnings + _data_warnings(report):
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    if out is not None:
        console.print(f"quarantine list written to {out}", highlight=False)
    console.print(_verdict(report))


def _summary_table(report):
    from rich.table import Table

    table = Table(title="validate", show_header=False, title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right", overflow="fold")
    table.add_row("dump", report.path)
    table.add_row("files", str(len(report.files)))
    table.add_row("sessions", str(report.sessions))
    table.add_row("turns", str(report.turns))
    table.add_row("valid sessions", str(report.valid_sessions))
    table.add_row("quarantined sessions", str(report.quarantined))
    for reason, sessions in report.by_reason.items():
        table.add_row(f"  {reason}", str(sessions))
    if report.unattributed:
        table.add_row("entries without a session", str(report.unattributed))
    table.add_row("vocabulary check", _vocab_line(report))
    return table


def _vocab_line(report) -> str:
    if report.vocab_checked:
        source = f" ({report.meta.tokenizer})" if report.meta.tokenizer else ""
        return f"token ids < {report.vocab_size}{source}"
    return "skipped: no tokenizer known (pass --tokenizer)"


def _entries_table(entries):
    from rich.table import Table

    table = Table(title="quarantine", title_justify="left")
    for name in ("session_id", "turn", "reason", "detail"):
        table.add_column(
            name, overflow="fold", no_wrap=name in ("turn", "reason"), justify="right" if name == "turn" else "left"
        )
    for entry in entries:
        turn = "" if entry.turn_index is None else str(entry.turn_index)
        table.add_row(entry.session_id or "(none)", turn, entry.reason, entry.detail)
    return table


def _verdict(report) -> str:
    from trace_tools.report.layout import count

    if report.clean:
        return "[green]clean[/green]: every session passed validation"
    return (
        f"[red]{report.quarantined} of {count(report.sessions, 'session')} quarantined[/red]"
        + (f", {report.unattributed} entries without a session" if report.unattributed else "")
        + " (--strict makes this exit 1)"
    )
