"""`trace-tools audit-template`: check a chat template for what the strategies rely on."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from trace_tools.cli._options import json_option, strategy_option, template_option, tokenizer_option
from trace_tools.cli._output import TOKENIZER_HELP


def audit_template_cmd(
    chat_template: Annotated[
        Optional[str],
        template_option(
            "qwen3, qwen3.5, trl:<name>, trl:all (every template trl ships), a .jinja file, "
            "or a dump (.parquet) that embeds its template."
        ),
    ] = None,
    tokenizer: Annotated[
        Optional[str],
        tokenizer_option(
            TOKENIZER_HELP + "; default: the template's own, else qwen3 as a stand-in (said in the output)."
        ),
    ] = None,
    strategy: Annotated[
        Optional[list[str]],
        strategy_option("Only these strategies' dependencies decide the exit code (repeatable; default all)."),
    ] = None,
    json_out: Annotated[bool, json_option("Print the audit as JSON.")] = False,
) -> None:
    """Audit a chat template: prefix stability, generation prompt, closer probe, reasoning, key order, merges.

    Exit 1 when a check that one of the chosen strategies relies on fails.

    Example: trace-tools audit-template --chat-template sample_traces/qwen3.parquet --strategy linear
    """
    from trace_tools.cli._output import print_all, print_json
    from trace_tools.report.audit_view import audit_templates, audit_view

    audits = audit_templates(chat_template, tokenizer, strategy)
    ok = all(audit.ok for audit in audits)
    if json_out:
        print_json({"ok": ok, "audits": [audit.to_dict() for audit in audits]})
    else:
        print_all(audit_view(audits))
    if not ok:
        raise typer.Exit(1)
