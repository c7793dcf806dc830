"""`trace-tools simulate`: write simulated sessions with known harness behaviours and ground truth."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trace_tools.cli._options import json_option, out_option, template_option
from trace_tools.cli._output import FAMILY_CHOICES


def simulate_cmd(
    out: Annotated[Path, out_option("Parquet file to write (schema v1, self-describing).")],
    sessions: Annotated[int, typer.Option("--sessions", help="How many sessions.")] = 16,
    seed: Annotated[int, typer.Option("--seed", help="Same seed and options, same rows.")] = 0,
    template: Annotated[
        str,
        typer.Option("--template", help=f"Model family: {FAMILY_CHOICES}."),
    ] = "qwen3",
    chat_template: Annotated[
        Optional[str],
        template_option(
            "Template file, or a family name / trl:<name>, in the family's tool-call format "
            "(default: the family's TRL template; without trl, the copy the bundled sample carries)."
        ),
    ] = None,
    behaviour: Annotated[
        Optional[list[str]],
        typer.Option(
            "--behaviour",
            help="Behaviour recipe (repeatable; sessions cycle through them). Join names with + to "
            "combine them in one session, e.g. claude-code+retry. Default: every behaviour, then mixes.",
        ),
    ] = None,
    recording: Annotated[
        str, typer.Option("--recording", help="How prompt_ids were recorded: tree | linear | none.")
    ] = "tree",
    max_turns: Annotated[
        Optional[int],
        typer.Option(
            "--max-turns", help="Most model turns of a main conversation (default: 40 for swe, 45 for swe-long)."
        ),
    ] = None,
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            help="Session size: swe (short episodes) | swe-long (Claude-Code-sized prompts, 25-45 turns, "
            "contexts ending at 25k-60k tokens).",
        ),
    ] = "swe",
    harness_profile: Annotated[
        Optional[str],
        typer.Option(
            "--harness-profile",
            help="A harness profile (profile.json from trace-tools probe, or a shipped name such as "
            "claude-code-2.1.332) for the harness-profile behaviour; without --behaviour every session plays it.",
        ),
    ] = None,
    logprobs_model: Annotated[
        Optional[str],
        typer.Option(
            "--logprobs-model",
            help="Fill output_logprobs by teacher-forcing this model (needs torch) instead of seeded values.",
        ),
    ] = None,
    steps: Annotated[
        Optional[int],
        typer.Option(
            "--steps",
            help="Spread the sessions over N training steps (rows get step and weight_version) whose "
            "behaviour mix changes as --growth and --change say; ground truth per step in the file metadata.",
        ),
    ] = None,
    growth: Annotated[
        str,
        typer.Option(
            "--growth",
            help="With --steps: echo behaviour played by a share of each step's sessions growing linearly "
            "from none (first step) to all (last), or none.",
        ),
    ] = "json-reserialize",
    change: Annotated[
        str,
        typer.Option("--change", help="With --change-at: echo behaviour every session plays from that step on."),
    ] = "claude-code",
    change_at: Annotated[
        Optional[int], typer.Option("--change-at", help="With --steps: the step at which --change lands.")
    ] = None,
    json_out: Annotated[bool, json_option("Print the summary as JSON.")] = False,
) -> None:
    """Simulate SWE-agent sessions under chosen harness behaviours, with ground truth in each row's metadata.

    Behaviours: byte-exact, claude-code (the shipped Claude Code 2.1.332 profile), harness-profile (--harness-profile FILE), json-reserialize, reasoning-dropped, reasoning-rekeyed, streaming, retry, subagent, compaction, truncation, history-edit, noncanonical-tokenization.

    Example: trace-tools simulate --sessions 24 --seed 7 --template qwen3.5 --out sim.parquet

    Over training: trace-tools simulate --sessions 40 --steps 10 --behaviour byte-exact --change-at 6 --out run.parquet
    """  # noqa: E501 (typer prints docstring lines as written: the behaviour list stays one line)
    from trace_tools.cli._output import console, note, print_json
    from trace_tools.simulate import simulate, summarize
    from trace_tools.simulate.steps import schedule_from_options

    table = simulate(
        sessions,
        seed,
        template=template,
        behaviours=behaviour,
        recording=recording,
        out=str(out),
        max_turns=max_turns,
        logprobs_model=logprobs_model,
        profile=profile,
        chat_template=chat_template,
        harness_profile=harness_profile,
        steps=schedule_from_options(steps, growth, change, change_at),
    )
    rows = summarize(table)
    if json_out:
        print_json({"out": str(out), "recipes": rows})
        return
    console.print(_table(rows, template, recording))
    from trace_tools.report.layout import count

    written = count(sum(r["sessions"] for r in rows), "session")
    note(f"wrote {count(table.num_rows, 'turn')} of {written} to {out}")


def _table(rows: list[dict], template: str, recording: str):
    from rich.table import Table

    table = Table(title=f"simulated sessions ({template}, recording {recording})", title_justify="left")
    table.add_column("behaviours", overflow="fold")
    for name in ("sessions", "turns", "genuine", "ideal\nsamples", "ideal\ntokens"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(
            row["behaviours"],
            str(row["sessions"]),
            str(row["turns"]),
            str(row["genuine_turns"]),
            str(row["ideal_samples"]),
            str(row["ideal_forwarded_tokens"]),
        )
    return table
