"""`trace-tools compare`, `gate` and `explain`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trace_tools.cli._output import TOOL_FORMAT_HELP
from trace_tools.cli._render_path import ReferenceOpt, VerifyOpt, render_path, verify_outcome
from trace_tools.cli._strategies import STRATEGY_NAMES as NAMES


def compare_cmd(
    run_a: Annotated[str, typer.Argument(help="A finished run directory, a path or a URI.")],
    run_b: Annotated[
        Optional[str], typer.Argument(help="A second run (omit to compare two strategies of RUN_A).")
    ] = None,
    strategy: Annotated[
        Optional[list[str]],
        typer.Option("--strategy", "-s", help=f"Strategies to compare (two, with one run): {NAMES}."),
    ] = None,
    by: Annotated[
        Optional[str], typer.Option(help="`behaviour`: behaviour × strategy table from simulator ground truth.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Compare two runs, two strategies of one run, or every strategy by simulated behaviour.

    RUN_A, RUN_B: finished run directories (`replay --out`); with RUN_A alone, name two strategies.

    Example: trace-tools compare runs/before runs/after   |   trace-tools compare runs/r1 -s tree -s linear
    """
    from trace_tools.cli._output import console, print_all, print_json
    from trace_tools.options import parse_choice
    from trace_tools.report import compare as lib
    from trace_tools.report.compare_tables import behaviour_view, comparison_view

    if by is not None:
        parse_choice(by, ["behaviour"], "--by")
        frame = lib.compare_by_behaviour(run_a)
        if json_out:
            print_json(frame.to_dict("records"))
        else:
            print_all(behaviour_view(frame, console.width))
        return
    result = lib.compare(run_a, run_b, strategy)
    if json_out:
        print_json(
            {
                "a": result.label_a,
                "b": result.label_b,
                "metrics": result.metrics.to_dict("records"),
                "tools": result.tools.to_dict("records"),
                "sessions": result.sessions.to_dict("records"),
                "only_in_a": result.only_a,
                "only_in_b": result.only_b,
            }
        )
        return
    print_all(comparison_view(result, console.width))


def gate_cmd(
    run: Annotated[str, typer.Argument(help="A finished run directory, a path or a URI.")],
    rules: Annotated[
        Path,
        typer.Option(
            help="Rules TOML file: one 'rule' table per rule with metric, strategy, op and value (or max_regression)."
        ),
    ],
    baseline: Annotated[Optional[str], typer.Option(help="Baseline run for max_regression rules.")] = None,
    junit: Annotated[Optional[Path], typer.Option(help="Also write JUnit XML here (one testcase per rule).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print results as JSON.")] = False,
) -> None:
    """Check a run against regression rules: exit 0 when all pass, 1 when one fails, 2 on a malformed file.

    RUN: a finished run directory (`replay --out`).

    Example: trace-tools gate runs/r1 --rules docs/gate-rules.example.toml --baseline runs/main
    """
    from trace_tools.cli._output import console, print_all, print_json
    from trace_tools.io.write import write_text_atomic
    from trace_tools.report.compare_tables import gate_view
    from trace_tools.report.gate import gate, junit_xml

    results = gate(run, rules, baseline)
    if junit is not None:
        write_text_atomic(junit_xml(results), junit)
    if json_out:
        print_json(
            [
                {
                    "rule": r.label,
                    "strategy": r.strategy,
                    "actual": r.actual,
                    "expected": r.expected,
                    "passed": r.passed,
                    "message": r.message,
                }
                for r in results
            ]
        )
    else:
        print_all(gate_view(results, console.width))
    if not all(r.passed for r in results):
        raise typer.Exit(1)


def explain_cmd(
    dump: Annotated[str, typer.Argument(help="Parquet file or directory, a path or a URI.")],
    session: Annotated[str, typer.Option(help="Session id to explain.")],
    turn: Annotated[
        Optional[int], typer.Option(help="Turn whose echo drifted (default: the first drifted turn).")
    ] = None,
    strategy: Annotated[
        Optional[str], typer.Option(help=f"Also show what this strategy made of the turn: {NAMES}.")
    ] = None,
    tokenizer: Annotated[Optional[str], typer.Option(help="Override the dump's tokenizer.")] = None,
    chat_template: Annotated[Optional[str], typer.Option(help="Override the dump's chat template.")] = None,
    prompt_source: Annotated[str, typer.Option(help="auto | recorded | rendered.")] = "auto",
    tool_format: Annotated[Optional[str], typer.Option(help=TOOL_FORMAT_HELP)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
    reference: ReferenceOpt = False,
    verify: VerifyOpt = False,
) -> None:
    """Show why a turn drifted: served vs re-rendered ids around the first divergence, the message diff, the cause.

    DUMP: a Parquet file or a directory of them (searched recursively).

    Example: trace-tools explain dump.parquet --session s0003 --turn 4 --strategy tree
    """
    from trace_tools.cli._output import console, print_json
    from trace_tools.replay.explain import explain
    from trace_tools.report.explain_view import explanation_renderables

    result = explain(
        dump,
        session,
        turn=turn,
        strategy=strategy,
        tokenizer=tokenizer,
        chat_template=chat_template,
        prompt_source=prompt_source,
        tool_format=tool_format,
        render_path=render_path(reference, verify),
    )
    if json_out:
        print_json(result.to_dict())
    else:
        for renderable in explanation_renderables(result):
            console.print(renderable)
    verify_outcome(result.verify)
