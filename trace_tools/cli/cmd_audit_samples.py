"""`trace-tools audit-samples`: what a trainer was actually given, from its own sample dump."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from trace_tools.cli._options import (
    ChatTemplateOpt,
    TokenizerOpt,
    json_option,
    out_option,
    overwrite_option,
    strategy_option,
)


def audit_samples_cmd(
    dump: Annotated[
        list[str],
        typer.Argument(help="Trainer sample dumps: slime/miles rollout_data/*.pt, miles dashboards, prime-rl exports."),
    ],
    out: Annotated[Optional[str], out_option("Run directory to write (report, compare and gate read it).")] = None,
    tokenizer: TokenizerOpt = None,
    chat_template: ChatTemplateOpt = None,
    calls: Annotated[
        Optional[str],
        typer.Option("--calls", help="The same run's per-call dump: compare the samples with a strategy's on it."),
    ] = None,
    strategy: Annotated[str, strategy_option("The strategy replayed on --calls (tree: slime's manager).")] = "tree",
    overwrite: Annotated[bool, overwrite_option("Replace an existing run directory at --out.")] = False,
    json_out: Annotated[
        bool, json_option("Print the audit as JSON: run and per-step totals, rules, comparison.")
    ] = False,
) -> None:
    """Audit what a trainer was given: samples per step and session, re-emitted context, loss-mask rules, tools.

    Exit 1 when a loss-mask rule is broken or (with --calls) the samples differ from the strategy's.

    Example: trace-tools audit-samples rollout_data/ --tokenizer qwen3 --out runs/audit --calls calls.parquet
    """
    from rich.text import Text

    from trace_tools.cli._output import print_all, print_json
    from trace_tools.trainer.audit import audit_dumps
    from trace_tools.trainer.audit_view import audit_lines

    result = audit_dumps(
        dump,
        tokenizer=tokenizer,
        chat_template=chat_template,
        calls=calls,
        strategy=strategy,
        out=out,
        overwrite=overwrite,
    )
    if json_out:
        print_json(result.to_json())
    else:
        print_all(Text(line) for line in audit_lines(result.to_json()))
    if not result.ok:
        raise typer.Exit(1)
