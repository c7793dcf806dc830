"""`trace-tools audit-template`: the audit judged for the chosen strategies, and its views.

The checks themselves are the render layer's (`render.audit`); which checks a strategy relies on
is its declaration's (`strategies.declarations`). Here the two meet, and the verdicts become the
terminal tables and the Markdown table docs/templates.md shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from trace_tools.render.audit import CHECKS, Audit, run_audit
from trace_tools.strategies.declarations import relies_on

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
MARK = {"pass": "[green]ok[/]", "fail": "[red]X[/]", "n/a": "[dim]n/a[/]"}


def audit_templates(
    chat_template: str | None = None, tokenizer: str | None = None, strategies: Sequence[str] | None = None
) -> list[Audit]:
    """Audit a template (or `trl:all`), judging `strategies` (default: every built-in one) by the
    checks each declares it relies on. An unknown strategy name is an `UnknownName`."""
    return run_audit(chat_template, tokenizer, relies_on(strategies))


def audit_view(audits: Sequence[Audit]) -> list[Any]:
    """What the terminal shows: one template's checks and strategy verdicts, or one line per template,
    then the line that says why the exit code is what it is."""
    return [*(_one(audits[0]) if len(audits) == 1 else _many(audits)), Text(exit_reason(audits))]


def exit_reason(audits: Sequence[Audit]) -> str:
    """`exit 1: ...` naming the strategies and the failing checks they rely on, or `exit 0: ...`
    saying which failing checks (if any) no chosen strategy relies on (docs/commands.md exit codes)."""
    broken = {name: failing for audit in audits for name, failing in audit.failing.items() if failing}
    if broken:
        causes = "; ".join(f"{name} relies on {', '.join(failing)}" for name, failing in broken.items())
        return f"exit 1: a check a chosen strategy relies on fails ({causes})"
    failed = sorted({c.name for audit in audits for c in audit.checks if c.status == "fail"})
    if failed:
        return f"exit 0: {', '.join(failed)} fail, but no chosen strategy relies on them"
    return "exit 0: every check holds"


def _one(audit: Audit) -> list[Any]:
    lines: list[Any] = [Text.assemble((audit.template, "bold"), f" with tokenizer {audit.tokenizer}")]
    lines += [Text(f"  note: {note}") for note in [audit.tokenizer_note, *audit.notes] if note]
    table = Table()
    table.add_column("check", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("cases", justify="right", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for check in audit.checks:
        table.add_row(check.name, VERDICT[check.status], f"{check.passed}/{check.total}", check.detail)
    used = [name for name in SHORT if any(name in checks for checks in audit.relies_on.values())]
    return [*lines, table, _strategy_table(audit), Text("relies on: " + _codes(used))]


def _codes(checks: Any) -> str:
    """`gen = generation_prompt, pfx = prefix_stability, ...`: the short codes the tables use."""
    return ", ".join(f"{SHORT[name]} = {name}" for name in checks)


def _strategy_table(audit: Audit) -> Table:
    table = Table()
    table.add_column("strategy", no_wrap=True)
    table.add_column("relies on", overflow="fold")
    table.add_column("verdict", overflow="fold")
    for name, failing in audit.failing.items():
        verdict = "[green]ok[/]" if not failing else "[red]fails:[/] " + ", ".join(failing)
        table.add_row(name, ", ".join(SHORT[c] for c in audit.relies_on[name]), verdict)
    return table


def _many(audits: Sequence[Audit]) -> list[Any]:
    table = Table(box=None, padding=(0, 2, 0, 0), pad_edge=False)
    table.add_column("template", no_wrap=True)
    for name in CHECKS:
        table.add_column(SHORT[name], no_wrap=True)
    for audit in audits:
        label = audit.template.split()[0].removeprefix("trl:").removesuffix(".jinja")
        by_name = {c.name: c.status for c in audit.checks}
        table.add_row(label + ("*" if audit.tokenizer_note else ""), *(MARK[by_name[name]] for name in CHECKS))
    return [
        table,
        Text("ok = holds, X = fails, n/a = does not apply; * = audited with a stand-in tokenizer (token check n/a)"),
        Text(_codes(SHORT)),
    ]


def markdown_table(audits: Sequence[Audit]) -> str:
    """One row per template, one column per check (`ok`, `FAIL`, `n/a`): the table docs/templates.md shows."""
    header = "| template | tokenizer | " + " | ".join(f"`{name}`" for name in CHECKS) + " |"
    rows = [header, "|" + "---|" * (len(CHECKS) + 2)]
    for audit in audits:
        name = audit.template.split()[0].removeprefix("trl:")
        status = {c.name: {"pass": "ok", "fail": "FAIL", "n/a": "n/a"}[c.status] for c in audit.checks}
        tokenizer = audit.tokenizer + (" (stand-in)" if audit.tokenizer_note else "")
        rows.append(f"| `{name}` | {tokenizer} | " + " | ".join(status[c] for c in CHECKS) + " |")
    return "\n".join(rows) + "\n"
