"""`trace-tools reconstruct`: re-render every turn's prompt and report fidelity to the recorded ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from trace_tools.cli._options import (
    ChatTemplateOpt,
    DumpArg,
    ReferenceOpt,
    TokenizerOpt,
    ToolFormatOpt,
    VerifyOpt,
    json_option,
    out_option,
)
from trace_tools.cli._render_path import render_path, verify_outcome


def reconstruct_cmd(
    dump: DumpArg,
    out: Annotated[Optional[Path], out_option("Write turns.parquet + summary.json here.")] = None,
    tokenizer: TokenizerOpt = None,
    chat_template: ChatTemplateOpt = None,
    tool_format: ToolFormatOpt = None,
    json_out: Annotated[bool, json_option("Print the summary as JSON instead of a table.")] = False,
    reference: ReferenceOpt = False,
    verify: VerifyOpt = False,
    workers: Annotated[
        Optional[int],
        typer.Option(
            help="Processes reconstructing sessions (default: the machine's cores, 1 for a dump under 400 "
            "turns, or 4,000 where workers are spawned; 1 = in this process). The result is the same."
        ),
    ] = None,
) -> None:
    """Re-render each turn (canonical messages + tools + generation prompt) and compare with prompt_ids.

    DUMP: a Parquet file or a directory of them (searched recursively).

    Example: trace-tools reconstruct dump.parquet --json
    """
    from trace_tools.cli._progress import progress_bar
    from trace_tools.reconstruct import reconstruct

    path = render_path(reference, verify)
    with progress_bar("reconstructing", "sessions", disable=json_out) as advance:
        result = reconstruct(
            dump,
            tokenizer=tokenizer,
            chat_template=chat_template,
            tool_format=tool_format,
            progress=advance,
            render_path=path,
            owns_process=True,
            workers=workers,
        )
    if out is not None:
        result.save(out)
    if json_out:
        typer.echo(json.dumps(result.summary, indent=2))
    else:
        _print_table(result, out)
    verify_outcome(result.summary.get("verify"))


SESSIONS_SHOWN = 20  # a dump of thousands of sessions prints its worst ones, not a page per session


def _print_table(result, out: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    title, every = "Prompt reconstruction fidelity", result.session_rows()  # no pandas: a fast start
    sessions = every
    if len(every) > SESSIONS_SHOWN:  # lowest rate first; sessions with nothing compared last
        title += f" (the lowest {SESSIONS_SHOWN} of {len(every)} sessions)"
        sessions = sorted(every, key=lambda s: (s["rate"] is None, s["rate"] or 0.0))[:SESSIONS_SHOWN]
    table = Table(title=title)
    for name in ("session", "turns", "compared", "exact", "rate"):
        table.add_column(name, justify="left" if name == "session" else "right")
    for row in sessions:
        table.add_row(
            str(row["session_id"]), *(str(row[k]) for k in ("turns", "turns_compared", "exact")), _rate(row["rate"])
        )
    summary = result.summary
    hidden = len(every) - len(sessions)
    if hidden:
        table.add_row(f"… {hidden} more (--out: all)", style="dim")
    table.add_section()
    table.add_row(
        "overall",
        str(summary["turns"]),
        str(summary["turns_compared"]),
        str(summary["exact"]),
        _rate(summary["rate"]),
        style="bold",
    )
    console = Console()
    console.print(table)
    if summary["turns_compared"] == 0:
        console.print("no turn carries recorded prompt_ids: rendered lengths only, nothing to compare")
    if summary.get("render_errors"):
        console.print(f"[yellow]{summary['render_errors']} turn(s) failed to render; see the error column[/]")
    if out is not None:
        console.print(f"wrote {out / 'turns.parquet'} and {out / 'summary.json'}")


def _rate(rate) -> str:
    from trace_tools.report.layout import ABSENT

    return ABSENT if rate is None or rate != rate else f"{rate:.1%}"
