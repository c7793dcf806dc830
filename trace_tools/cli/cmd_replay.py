"""`trace-tools replay` and `trace-tools report`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trace_tools.cli._output import TEMPLATE_HELP, TOKENIZER_HELP, TOOL_FORMAT_HELP

StrategyOpt = Annotated[Optional[list[str]], typer.Option("--strategy", "-s", help="Strategy to replay (repeatable; default: all).")]


def replay_cmd(
    dump: Annotated[Optional[Path], typer.Argument(help="Parquet file or directory (default: the bundled sample_traces/).")] = None,
    strategy: StrategyOpt = None,
    out: Annotated[Optional[Path], typer.Option(help="Run directory (default: ./trace-tools-runs/<dump>-<UTC time>/).")] = None,
    prompt_source: Annotated[str, typer.Option(help="auto (recorded ids when present, else render) | recorded | rendered.")] = "auto",
    tokenizer: Annotated[Optional[str], typer.Option(help=TOKENIZER_HELP + " (overrides the dump).")] = None,
    chat_template: Annotated[Optional[str], typer.Option(help=TEMPLATE_HELP + " (overrides the dump).")] = None,
    tool_format: Annotated[Optional[str], typer.Option(help=TOOL_FORMAT_HELP)] = None,
    fork_threshold: Annotated[Optional[int], typer.Option(help="tree: FORK/merge threshold in tokens (default 1024; <= 0 = agentcore CLEAN/FORK).")] = None,
    realign_gate: Annotated[Optional[str], typer.Option(help="tree: REALIGN gate on the incoming `output` length (slime) or the `drift` size (TRL).")] = None,
    realign_from: Annotated[Optional[str], typer.Option(help="tree: REALIGN from the `response` start (slime) or the `divergence` point (TRL).")] = None,
    on_nonlinear: Annotated[Optional[str], typer.Option(help="linear: reset | error | passthrough.")] = None,
    matcher: Annotated[Optional[str], typer.Option(help="session-v1/v2: strict | loose_tool_call | role_content_only.")] = None,
    rollback: Annotated[Optional[bool], typer.Option("--rollback/--no-rollback", help="chains: last-assistant rollback.")] = None,
    retries: Annotated[Optional[str], typer.Option(help="checkpoint-tree: `supersede` an unanswered earlier attempt, or `keep` both.")] = None,
    echo_rules: Annotated[Optional[bool], typer.Option("--echo-rules/--no-echo-rules", help="checkpoint-tree: look past cosmetic echo rewrites.")] = None,
    canonicalization: Annotated[str, typer.Option(help="Adapter translate policy: slime | none | uniagent | miles.")] = "slime",
    samples: Annotated[bool, typer.Option("--samples/--no-samples", help="Write samples.parquet (can be large).")] = True,
    workers: Annotated[Optional[int], typer.Option(help="Processes replaying sessions (default: the machine's cores; 1 = in this process).")] = None,
    executor: Annotated[str, typer.Option(help="local (this machine) | ray (the same session function on a Ray cluster; needs the ray extra).")] = "local",
    address: Annotated[Optional[str], typer.Option(help="ray: cluster address (default: start a local Ray).")] = None,
    strict: Annotated[bool, typer.Option(help="Exit 1 when any session was quarantined.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print summary.json instead of tables.")] = False,
) -> None:
    """Replay a dump through trajectory-management strategies and report what each would train.

    Example: trace-tools replay dump.parquet --strategy tree --strategy linear --out runs/r1
    """
    from trace_tools.cli._output import console, note, print_json
    from trace_tools.cli._progress import progress_bar
    from trace_tools.api import replay

    params = {"fork_threshold": fork_threshold, "realign_gate": realign_gate, "realign_from": realign_from,
              "on_nonlinear": on_nonlinear, "matcher": matcher, "rollback": rollback, "retries": retries,
              "echo_rules": echo_rules}
    with progress_bar("replaying sessions", disable=json_out) as advance:
        result = replay(dump, out=out, strategies=strategy, prompt_source=prompt_source, tokenizer=tokenizer,
                        chat_template=chat_template, canonicalization=canonicalization, params=params,
                        write_samples=samples, workers=workers, executor=executor, address=address,
                        progress=advance, tool_format=tool_format)
    if json_out:
        print_json(result.summary)
    else:
        _print_summary(console, result.summary)
        note(f"run directory: {result.run_dir}")
        note(f"report.html: {result.run_dir / 'report.html'}")
    if strict and result.quarantined:
        raise typer.Exit(1)


def report_cmd(
    run: Annotated[Path, typer.Argument(help="A finished run directory.")],
    html: Annotated[bool, typer.Option("--html", help="Also write RUN/report.html (self-contained; open it in a browser).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print summary.json.")] = False,
) -> None:
    """Re-render the report (report.md, plots, terminal tables; report.html with --html) of a finished run.

    Example: trace-tools report trace-tools-runs/sample_traces-20261130T120000Z --html
    """
    from trace_tools.cli._output import console, note, print_json
    from trace_tools.report.rerender import rerender

    summary = rerender(run, html=html)
    if json_out:
        print_json(summary)
        return
    _print_summary(console, summary)
    if html:
        note(f"report.html: {run / 'report.html'}")


def _print_summary(console, summary: dict) -> None:
    from trace_tools.report.tables import dropped_table, headline_table, tool_table

    fidelity = summary["prompt_fidelity"]
    if summary["quarantined"]:
        console.print(f"[yellow]{summary['quarantined']} session(s) quarantined:[/] {summary['quarantined_by_reason']}")
    if fidelity["rate"] is not None:
        console.print(f"prompt fidelity: {fidelity['exact']}/{fidelity['turns_compared']} turns re-render exactly")
    console.print(headline_table(summary))
    console.print(tool_table(summary))
    console.print(dropped_table(summary))
