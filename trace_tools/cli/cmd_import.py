"""`trace-tools import FORMAT SRC... --out DUMP`: convert recorded logs into trace schema v1."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trace_tools.cli._options import (
    json_option,
    out_option,
    overwrite_option,
    strict_option,
    template_option,
    tokenizer_option,
)
from trace_tools.cli._output import TOKENIZER_HELP
from trace_tools.importers.formats import FORMATS

FORMAT_HELP = "; ".join(f"{fmt.name} ({fmt.written_by}: {fmt.reads})" for fmt in FORMATS.values()) + "."
SESSION_KEY_REQUIRED = ", ".join(fmt.name for fmt in FORMATS.values() if fmt.needs_session_key)


def import_cmd(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help=FORMAT_HELP)],
    sources: Annotated[list[Path], typer.Argument(metavar="SRC...", help=".json/.jsonl files or directories of them.")],
    out: Annotated[Path, out_option("The dump to write (Parquet, schema v1).")],
    tokenizer: Annotated[
        Optional[str],
        tokenizer_option(TOKENIZER_HELP + ": written into the dump, ids checked against it."),
    ] = None,
    chat_template: Annotated[
        Optional[str],
        template_option(
            "qwen3, qwen3.5, trl:<name>, a .jinja file or a dump embedding one; its text is "
            "written into the dump. Default: the tokenizer's."
        ),
    ] = None,
    session_key: Annotated[
        Optional[str],
        typer.Option(
            "--session-key",
            help=f"Header or field naming the session ({SESSION_KEY_REQUIRED}: required), e.g. x-session-id or "
            "request.metadata.session_id.",
        ),
    ] = None,
    step_key: Annotated[
        Optional[str],
        typer.Option(
            "--step-key",
            help="Field holding the training step of each record or document, e.g. metadata.rollout_id "
            "(default: the format's own step field, if any).",
        ),
    ] = None,
    strict: Annotated[bool, strict_option("Exit 1 when any record was quarantined.")] = False,
    overwrite: Annotated[bool, overwrite_option("Replace an existing --out dump and its quarantine file.")] = False,
    json_out: Annotated[bool, json_option("Print the import report as JSON.")] = False,
) -> None:
    """Import session-server, engine or gateway logs into a schema-v1 dump.

    FORMAT: {formats}

    A malformed record quarantines its session; it is listed with a reason in DUMP.quarantine.jsonl.

    A non-200 request is listed there too, as a rejected request; a clean import writes no such file.

    Example: trace-tools import miles tests/fixtures/import/miles_sessions.json --tokenizer qwen3 --out imported.parquet
    """
    from trace_tools.cli._output import console, print_json
    from trace_tools.cli._progress import progress_bar
    from trace_tools.importers import import_traces

    with progress_bar("importing", "records", disable=json_out) as advance:
        report = import_traces(
            fmt,
            sources,
            out,
            tokenizer=tokenizer,
            chat_template=chat_template,
            session_key=session_key,
            step_key=step_key,
            progress=advance,
            overwrite=overwrite,
        )
    if json_out:
        print_json(report.to_dict())
    else:
        console.print(_table(report))
        for warning in report.warnings:
            console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
        listed = f" and {report.quarantine_file}" if report.quarantine_file else " (nothing to quarantine)"
        console.print(f"wrote {report.out}{listed}", highlight=False)
    if strict and not report.clean:
        raise typer.Exit(1)


# typer shows the docstring but not an argument's help: the formats go in both, from their records.
import_cmd.__doc__ = (import_cmd.__doc__ or "").replace("{formats}", FORMAT_HELP)


def _table(report):
    from rich.table import Table

    table = Table(title=f"import {report.format}", show_header=False, title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right", overflow="fold")
    rows = [
        ("source files", report.files),
        ("records", report.records),
        ("turns written", report.turns),
        ("sessions written", report.sessions),
        ("rejected requests (non-200)", report.rejected_requests),
        ("quarantined records", report.quarantined_records),
        ("quarantined sessions", report.quarantined_sessions),
    ]
    for label, value in rows:
        table.add_row(label, str(value))
    for reason, records in report.by_reason.items():
        table.add_row(f"  {reason}", str(records))
    vocab = f"ids < {report.vocab_size}" if report.vocab_size is not None else "skipped (pass --tokenizer)"
    table.add_row("vocabulary check", vocab)
    table.add_row("chat template", report.chat_template or "none embedded")
    return table
