"""`trace-tools export-metrics RUN --to tensorboard|wandb|jsonl`: per-step series for experiment trackers."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from trace_tools.cli._options import RunArg, json_option, out_option, overwrite_option


def export_metrics_cmd(
    run: RunArg,
    to: Annotated[str, typer.Option("--to", help="tensorboard | wandb | jsonl.")],
    out: Annotated[
        Optional[str],
        out_option(
            "tensorboard: a logdir (the run goes to OUT/NAME/); wandb: the folder for wandb/ (default: here); "
            "jsonl: the file."
        ),
    ] = None,
    name: Annotated[
        Optional[str], typer.Option("--name", help="Run name in the tracker; default: the run directory's name.")
    ] = None,
    project: Annotated[str, typer.Option("--project", help="W&B project of the offline run.")] = "trace-tools",
    trained_with: Annotated[
        Optional[str],
        typer.Option(
            "--trained-with",
            help="The strategy your trainer runs: its mismatch metrics also go under verl's and slime's names "
            "alone (rollout_corr/k3_kl), in the same panels as the trainer's own.",
        ),
    ] = None,
    overwrite: Annotated[bool, overwrite_option("Replace an existing JSONL file or TensorBoard event files.")] = False,
    json_out: Annotated[bool, json_option("Print what was written as JSON.")] = False,
) -> None:
    """Write every metric of a run, per strategy and per step, as tracker series (docs/trackers.md).

    Series are named trace_tools/<strategy>/<metric>; a run whose dump has no steps is one point at step 0. W&B runs offline and never calls the network: upload later with `wandb sync OUT/wandb/offline-run-*`. TensorBoard and W&B need the tensorboard or wandb extra of trace-tools (pip install, docs/trackers.md).

    Example: trace-tools export-metrics runs/r1 --to tensorboard --out tb && tensorboard --logdir tb
    """  # noqa: E501 (typer prints docstring lines as written: one line per paragraph)
    from trace_tools.cli._output import console, print_json
    from trace_tools.report.trackers import export_metrics

    report = export_metrics(run, to, out, name=name, project=project, trained_with=trained_with, overwrite=overwrite)
    if json_out:
        print_json(
            {
                "to": report.target,
                "out": str(report.out),
                "steps": report.steps,
                "series": report.series,
                "points": report.points,
                "sessions_without_step": report.sessions_without_step,
            }
        )
        return
    steps = report.steps
    span = f"step {steps[0]}" if len(steps) == 1 else f"{len(steps)} steps ({steps[0]}..{steps[-1]})"
    console.print(f"wrote {report.series:,} series over {span} to {report.out}", highlight=False, soft_wrap=True)
    if report.sessions_without_step:
        console.print(
            f"  {report.sessions_without_step:,} sessions without a step are in no series",
            highlight=False,
            soft_wrap=True,
        )
    if report.target == "wandb":
        console.print(f"  upload it with: wandb sync {report.out}", highlight=False, soft_wrap=True)
