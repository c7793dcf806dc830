"""`trace-tools export RUN --strategy NAME`: one strategy's samples in the layout trainers load."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from trace_tools.cli._options import json_option, out_option, overwrite_option, strategy_option


def export_cmd(
    run: Annotated[
        str, typer.Argument(help="A run directory written by `trace-tools replay` (with samples), a path or a URI.")
    ],
    strategy: Annotated[str, strategy_option("The strategy whose samples to export.")],
    fmt: Annotated[str, typer.Option("--format", help="parquet | jsonl.")] = "parquet",
    out: Annotated[
        Optional[str],
        out_option("Output file, a path or a URI; default RUN/export/<strategy>.<format>."),
    ] = None,
    overwrite: Annotated[
        bool, overwrite_option("Replace an existing --out file (never the run's own inputs).")
    ] = False,
    json_out: Annotated[bool, json_option("Print what was written as JSON.")] = False,
) -> None:
    """Export a strategy's samples: tokens, loss_mask, rollout_log_probs, response_length, reward, provenance.

    Example: trace-tools export runs/r1 --strategy checkpoint-tree --format parquet --out samples.parquet
    """
    from trace_tools.cli._output import console, print_json
    from trace_tools.io.export import export_samples

    report = export_samples(run, strategy, fmt, out, overwrite=overwrite)
    if json_out:
        print_json(
            {
                "out": str(report.out),
                "strategy": report.strategy,
                "format": report.format,
                "samples": report.samples,
                "tokens": report.tokens,
                "trained_tokens": report.trained_tokens,
            }
        )
        return
    from trace_tools.report.layout import count

    console.print(
        f"wrote {count(report.samples, 'sample')} of {report.strategy} ({count(report.tokens, 'token')}, "
        f"{report.trained_tokens:,} with loss) to {report.out}",
        highlight=False,
    )
