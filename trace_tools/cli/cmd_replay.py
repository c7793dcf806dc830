"""`trace-tools replay` and `trace-tools report`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trace_tools.cli._options import (
    ChatTemplateOpt,
    PromptSourceOpt,
    ReferenceOpt,
    RunArg,
    TokenizerOpt,
    ToolFormatOpt,
    VerifyOpt,
    json_option,
    out_option,
    strategy_option,
)
from trace_tools.cli._render_path import render_path, verify_outcome
from trace_tools.cli._strategies import PARAM_HELP, STRATEGY_NAMES, with_parameter_flags

StrategyOpt = Annotated[
    Optional[list[str]], strategy_option(f"Strategy to replay (repeatable; default: all): {STRATEGY_NAMES}.")
]
DumpArg = Annotated[
    Optional[str],
    typer.Argument(
        help="Parquet file or directory of them, a path or a URI such as s3://bucket/dump/ "
        "(default: the bundled sample_traces/).",
        show_default=False,
    ),
]
GatewayOpt = Annotated[
    Optional[str],
    typer.Option(
        help="Your gateway's system (slime, miles, agentcore, uni-agent, ...: the strategies' upstream "
        "systems): the verdict says what it trains here and what to switch on.",
        show_default=False,
    ),
]
INTERRUPTED = 130  # the shell's code for SIGINT


@with_parameter_flags
def replay_cmd(
    dump: DumpArg = None,
    strategy: StrategyOpt = None,
    out: Annotated[
        Optional[str],
        out_option(
            "Run directory, a path or a URI (default: a new directory in ./trace-tools-runs/ named "
            "after the dump and the UTC time)."
        ),
    ] = None,
    prompt_source: PromptSourceOpt = "auto",
    tokenizer: TokenizerOpt = None,
    chat_template: ChatTemplateOpt = None,
    tool_format: ToolFormatOpt = None,
    param: Annotated[
        Optional[list[str]],
        typer.Option("--param", "-p", help=PARAM_HELP),
    ] = None,
    canonicalization: Annotated[
        str, typer.Option(help="Adapter translate policy: slime | none | uniagent | miles.")
    ] = "slime",
    samples: Annotated[
        bool, typer.Option("--samples/--no-samples", help="Write the samples (RUN/samples/, can be large).")
    ] = True,
    workers: Annotated[
        Optional[int],
        typer.Option(
            help="Processes replaying sessions (default: the machine's cores, 1 for a small replay: under about "
            "700 turns for one strategy, 150 for all, or 1,200 and 450 where workers are spawned; 1 = in this "
            "process); with "
            "--executor ray, the CPUs of the local Ray it starts (with --address, the cluster's CPUs count)."
        ),
    ] = None,
    executor: Annotated[
        str,
        typer.Option(
            help="local (this machine) | ray (the same session function on a Ray cluster; needs the ray extra)."
        ),
    ] = "local",
    address: Annotated[
        Optional[str],
        typer.Option(help="ray: cluster address, e.g. auto or ray://head:10001 (default: start a local Ray)."),
    ] = None,
    # replay alone also takes --no-overwrite and --no-strict (typer's default names); kept for scripts
    overwrite: Annotated[bool, typer.Option(help="Replace a run made with other options in --out.")] = False,
    strict: Annotated[bool, typer.Option(help="Exit 1 when any session was quarantined.")] = False,
    json_out: Annotated[bool, json_option("Print summary.json instead of tables.")] = False,
    gateway: GatewayOpt = None,
    reference: ReferenceOpt = False,
    verify: VerifyOpt = False,
    flags: Optional[dict[str, Any]] = None,
) -> None:
    """Replay a dump through trajectory-management strategies and report what each would train.

    DUMP: a Parquet file or a directory of them (searched recursively); default: the bundled sample_traces/.

    Example: trace-tools replay dump.parquet --strategy tree --strategy linear --out runs/r1
    """
    from trace_tools.api import replay
    from trace_tools.cli._output import console, note, print_json
    from trace_tools.cli._progress import progress_bar
    from trace_tools.options import parse_assignments
    from trace_tools.replay.engine import default_dump, default_run_dir
    from trace_tools.report.tables import next_steps
    from trace_tools.report.verdict import check_gateway

    check_gateway(gateway)  # before any work
    params = {**(flags or {}), **parse_assignments(param)}
    path = render_path(reference, verify)
    out = out or str(default_run_dir(dump or default_dump()))  # known before the run, for the interrupt hint
    try:
        with progress_bar("replaying", "sessions", disable=json_out, still_until_first_call=True) as advance:
            result = replay(
                dump,
                out=out,
                strategies=strategy,
                prompt_source=prompt_source,
                tokenizer=tokenizer,
                chat_template=chat_template,
                canonicalization=canonicalization,
                params=params,
                write_samples=samples,
                progress=advance,
                overwrite=overwrite,
                workers=workers,
                executor=executor,
                address=address,
                tool_format=tool_format,
                render_path=path,
                owns_process=True,
            )
    except KeyboardInterrupt:
        from trace_tools.cli._output import exiting_on_interrupt

        exiting_on_interrupt()
        note(f"interrupted: finished shards are kept in {out}; run the same command with --out {out} to resume")
        raise typer.Exit(INTERRUPTED) from None
    for line in result.notes:
        note(line)
    if json_out:
        print_json(result.summary)
    else:
        _print_summary(console, result.summary, result.run_dir, gateway)
        if result.ray:
            ray, replayed = result.ray, max(result.sessions_replayed, 1)
            note(
                f"ray: {ray['tasks']} tasks on {ray['nodes']} node(s), "
                f"{ray['sent_bytes'] / replayed:,.0f} bytes of task arguments sent per session"
            )
        if result.resumed_shards:
            note(f"resumed: {result.resumed_shards} finished shard(s) of an earlier run with the same options reused")
        for reason in result.redone_shards:
            note(f"replayed again: {reason}")
        note(f"run directory: {result.run_dir}")
        for line in next_steps(result.run_dir):
            note(line)
    verify_outcome(result.reconstruction.get("verify"))
    if strict and result.quarantined:
        raise typer.Exit(1)


def report_cmd(
    run: RunArg,
    html: Annotated[
        bool, typer.Option("--html", help="Also write RUN/report.html (self-contained; open it in a browser).")
    ] = False,
    json_out: Annotated[bool, json_option("Print summary.json.")] = False,
    gateway: GatewayOpt = None,
) -> None:
    """Re-render the report (report.md, plots, terminal tables; report.html with --html) of a finished run.

    RUN: a finished run directory (`replay --out`).

    Example: trace-tools report runs/r1 --html
    """
    from trace_tools.cli._output import console, note, print_json
    from trace_tools.io import storage
    from trace_tools.report.rerender import rerender
    from trace_tools.report.verdict import check_gateway

    check_gateway(gateway)
    summary = rerender(run, html=html)
    if json_out:
        print_json(summary)
        return
    _print_summary(console, summary, run, gateway)
    if html:
        note(f"report.html: {storage.join(storage.location(run), 'report.html')}")


def _print_summary(console, summary: dict, run_dir: Path | str, gateway: str | None = None) -> None:
    from trace_tools.cli._output import print_all
    from trace_tools.report.tables import summary_view, verdict_view

    print_all([*verdict_view(summary, gateway), *summary_view(summary, console.width, run_dir)])
