"""`trace-tools compare`, `gate` and `explain`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trace_tools.cli._options import (
    ChatTemplateOpt,
    DumpArg,
    JsonOpt,
    PromptSourceOpt,
    ReferenceOpt,
    RunArg,
    TokenizerOpt,
    ToolFormatOpt,
    VerifyOpt,
    json_option,
    strategy_option,
)
from trace_tools.cli._render_path import render_path, verify_outcome
from trace_tools.cli._strategies import STRATEGY_NAMES as NAMES


def compare_cmd(
    run_a: RunArg,
    run_b: Annotated[
        Optional[str], typer.Argument(help="A second run (omit to compare two strategies of RUN_A).")
    ] = None,
    strategy: Annotated[
        Optional[list[str]],
        strategy_option(f"Strategies to compare (two, with one run): {NAMES}."),
    ] = None,
    by: Annotated[
        Optional[str],
        typer.Option(
            help="`behaviour`: behaviour × strategy table from simulator ground truth; `step`: the pair "
            "(two strategies of RUN_A, or RUN_A and RUN_B) step by step, for runs of dumps with steps."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Compare two runs, two strategies of one run, or every strategy by simulated behaviour.

    RUN_A, RUN_B: finished run directories (`replay --out`); with RUN_A alone, name two strategies.

    Example: trace-tools compare runs/before runs/after   |   trace-tools compare runs/r1 -s tree -s linear
    """
    from trace_tools.cli._output import console, print_all, print_json
    from trace_tools.options import parse_choice
    from trace_tools.report import compare as lib
    from trace_tools.report.compare_tables import behaviour_view, comparison_view, step_view

    if by == "step":
        steps = lib.compare_by_step(run_a, run_b, strategy)
        if json_out:
            print_json({"a": steps.label_a, "b": steps.label_b, "steps": steps.steps.to_dict("records")})
        else:
            print_all(step_view(steps, console.width))
        return
    if by is not None:
        parse_choice(by, ["behaviour", "step"], "--by")
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
    run: RunArg,
    rules: Annotated[
        Path,
        typer.Option(
            help="Rules TOML file: one 'rule' table per rule with metric, strategy, op and value (or max_regression)."
        ),
    ],
    baseline: Annotated[Optional[str], typer.Option(help="Baseline run for max_regression rules.")] = None,
    junit: Annotated[Optional[Path], typer.Option(help="Also write JUnit XML here (one testcase per rule).")] = None,
    json_out: Annotated[bool, json_option("Print results as JSON.")] = False,
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
                    **({"steps": r.steps} if r.steps else {}),
                }
                for r in results
            ]
        )
    else:
        print_all(gate_view(results, console.width))
    if not all(r.passed for r in results):
        raise typer.Exit(1)


def explain_cmd(
    dump: DumpArg,
    session: Annotated[str, typer.Option(help="Session id to explain.")],
    turn: Annotated[
        Optional[int], typer.Option(help="Turn whose echo drifted (default: the first drifted turn).")
    ] = None,
    strategy: Annotated[
        Optional[str], strategy_option(f"Also show what this strategy made of the turn: {NAMES}.")
    ] = None,
    tokenizer: TokenizerOpt = None,
    chat_template: ChatTemplateOpt = None,
    prompt_source: PromptSourceOpt = "auto",
    tool_format: ToolFormatOpt = None,
    json_out: JsonOpt = False,
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
