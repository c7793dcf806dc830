"""`trace-tools audit-template`: check a chat template for what the strategies rely on."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

# Labels of the many-template summary: short enough that the template name and 9 checks fit 80 columns.
SHORT = {
    "generation_prompt": "gen",
    "prefix_stability": "pfx",
    "last_assistant": "last",
    "reasoning_history": "rsn",
    "closer_text": "clT",
    "closer_tool": "clC",
    "tokenizer_merges": "mrg",
    "key_order": "key",
    "whitespace": "ws",
}
VERDICT = {"pass": "[green]ok[/]", "fail": "[red]FAIL[/]", "n/a": "[dim]n/a[/]"}
MARK = {"pass": "[green]ok[/]", "fail": "[red]X[/]", "n/a": "[dim]-[/]"}


def audit_template_cmd(
    chat_template: Annotated[
        Optional[str],
        typer.Option(
            "--chat-template",
            help="qwen3, qwen3.5, trl:<name>, trl:all (every template trl ships), a .jinja file, "
            "or a dump (.parquet) that embeds its template.",
        ),
    ] = None,
    tokenizer: Annotated[
        Optional[str],
        typer.Option(
            "--tokenizer",
            help="qwen3, qwen3.5 or a tokenizer directory; default: the template's own, else qwen3 "
            "as a stand-in (said in the output).",
        ),
    ] = None,
    strategy: Annotated[
        Optional[list[str]],
        typer.Option(
            "--strategy",
            "-s",
            help="Only these strategies' dependencies decide the exit code (repeatable; default all).",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the audit as JSON.")] = False,
) -> None:
    """Audit a chat template: prefix stability, generation prompt, closer probe, reasoning, key order, merges.

    Exit 1 when a check that one of the chosen strategies relies on fails.

    Example: trace-tools audit-template --chat-template sample_traces/qwen3.parquet --strategy linear
    """
    from trace_tools.cli._output import console, print_json
    from trace_tools.render.audit import run_audit

    audits = run_audit(chat_template, tokenizer, strategy)
    ok = all(audit.ok for audit in audits)
    if json_out:
        print_json({"ok": ok, "audits": [audit.to_dict() for audit in audits]})
    elif len(audits) == 1:
        _show_one(console, audits[0])
    else:
        _show_many(console, audits)
    if not ok:
        raise typer.Exit(1)


def _show_one(console, audit) -> None:
    from rich.table import Table

    console.print(f"[bold]{audit.template}[/] with tokenizer {audit.tokenizer}", highlight=False)
    for note in [audit.tokenizer_note, *audit.notes]:
        if note:
            console.print(f"  note: {note}", highlight=False)
    table = Table()
    table.add_column("check", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("cases", justify="right", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for check in audit.checks:
        table.add_row(check.name, VERDICT[check.status], f"{check.passed}/{check.total}", check.detail)
    console.print(table)
    console.print(_strategy_table(audit))


def _strategy_table(audit):
    from rich.table import Table

    from trace_tools.render.audit import STRATEGY_CHECKS

    table = Table()
    table.add_column("strategy", no_wrap=True)
    table.add_column("relies on", overflow="fold")
    table.add_column("verdict", overflow="fold")
    for name, failing in audit.failing.items():
        verdict = "[green]ok[/]" if not failing else "[red]fails:[/] " + ", ".join(failing)
        table.add_row(name, ", ".join(SHORT[c] for c in STRATEGY_CHECKS[name]), verdict)
    return table


def _show_many(console, audits) -> None:
    from rich.table import Table

    from trace_tools.render.audit import CHECKS

    table = Table(box=None, padding=(0, 2, 0, 0), pad_edge=False)
    table.add_column("template", no_wrap=True)
    for name in CHECKS:
        table.add_column(SHORT[name], no_wrap=True)
    for audit in audits:
        label = audit.template.split()[0].removeprefix("trl:").removesuffix(".jinja")
        by_name = {c.name: c.status for c in audit.checks}
        table.add_row(label + ("*" if audit.tokenizer_note else ""), *(MARK[by_name[name]] for name in CHECKS))
    console.print(table)
    console.print("ok = holds, X = fails, - = n/a; * = audited with a stand-in tokenizer (token check n/a)")
    console.print("  ".join(f"{short}={name}" for name, short in SHORT.items()), highlight=False)
