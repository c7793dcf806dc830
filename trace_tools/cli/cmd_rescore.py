"""`trace-tools rescore`: teacher-forced logprobs on a model vs the recorded sampling logprobs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trace_tools.cli._options import json_option, out_option, template_option, tokenizer_option
from trace_tools.cli._output import TOKENIZER_HELP

FLAGGED_SHOWN = 10
SYNTHETIC_NOTE = (
    "note: this dump's logprobs are synthetic (seeded by `trace-tools simulate`, not sampled by a "
    "model), so the turns are flagged by design; simulate with --logprobs-model MODEL for a dump that "
    "rescores clean"
)


def rescore_cmd(
    dump: Annotated[
        Path,
        typer.Argument(help="Parquet dump (file or directory) with output_logprobs; with --samples, a replay run."),
    ],
    model: Annotated[
        Optional[str],
        typer.Option("--model", help="tiny-qwen3 | smollm2 | path to a Hugging Face causal-LM directory."),
    ] = None,
    *,  # keyword-only from here, so that the required --out can keep its place in the help
    device: Annotated[str, typer.Option("--device", help="auto (cuda when visible) | cpu | cuda.")] = "auto",
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto (bfloat16 on cuda, float32 on cpu) | bfloat16 | float32.")
    ] = "auto",
    max_batch_tokens: Annotated[
        int, typer.Option("--max-batch-tokens", help="Padded tokens per forward batch; longer sequences run alone.")
    ] = 16384,
    out: Annotated[
        Optional[Path],
        out_option(
            "Output directory: tokens.parquet, turns.parquet, sessions.parquet, summary.json, plots/ "
            "(required without --samples; with --samples the run directory is written)."
        ),
    ] = None,
    threshold: Annotated[
        float,
        typer.Option(
            "--threshold",
            help="Per-token |Δ| (nats) counted as a mismatch; a turn whose mean |Δ| exceeds it is flagged.",
        ),
    ] = 0.05,
    json_out: Annotated[
        bool,
        json_option(
            "Print summary.json instead of tables; with --samples, each strategy's max_abs_diff, k3_kl and "
            "log_ppl_abs_diff, overall and by behaviour (the rest is in the run's summary.json)."
        ),
    ] = False,
    tokenizer: Annotated[
        Optional[str],
        tokenizer_option(
            TOKENIZER_HELP + ", for re-rendered prompts and decoded context (default: the dump's, else the model's)."
        ),
    ] = None,
    chat_template: Annotated[
        Optional[str],
        template_option(
            "Template file, qwen3 / qwen3.5 / trl:<name>, for turns without prompt_ids (default: the dump's)."
        ),
    ] = None,
    max_threshold: Annotated[
        float, typer.Option("--max-threshold", help="A turn is also flagged when one token's |Δ| exceeds this.")
    ] = 1.0,
    tokens: Annotated[
        bool, typer.Option("--tokens/--no-tokens", help="Write tokens.parquet (one row per compared token).")
    ] = True,
    samples: Annotated[
        bool,
        typer.Option(
            "--samples",
            help="Score the trained tokens of a replay run's samples in their own context: mismatch per "
            "strategy, attributed, with a correction preview.",
        ),
    ] = False,
    strategy: Annotated[
        Optional[list[str]],
        typer.Option("--strategy", "-s", help="With --samples: strategies to score (default: all)."),
    ] = None,
    tis_cap: Annotated[float, typer.Option("--tis-cap", help="Truncated IS cap C (token and sequence).")] = 2.0,
    mis_low: Annotated[float, typer.Option("--mis-low", help="Masked IS: lower bound on ρ.")] = 0.5,
    mis_high: Annotated[float, typer.Option("--mis-high", help="Masked IS: upper bound on ρ.")] = 2.0,
    icepop_low: Annotated[float, typer.Option("--icepop-low", help="IcePop band: lower bound on ρ.")] = 0.5,
    icepop_high: Annotated[float, typer.Option("--icepop-high", help="IcePop band: upper bound on ρ.")] = 2.0,
    k3_threshold: Annotated[
        float, typer.Option("--k3-threshold", help="k3 rejection: largest mean k3 a sample may have.")
    ] = 0.01,
    trainer_logprobs: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--trainer-logprobs",
            help="With --samples, instead of --model: a trainer's sample files (slime/miles train_data/, "
            "prime-rl token_exports/), aligned to the samples by token ids. Repeatable.",
        ),
    ] = None,
    trainer_format: Annotated[
        Optional[str],
        typer.Option("--trainer-format", help="With --trainer-logprobs: slime | miles-dashboard | prime-rl."),
    ] = None,
) -> None:
    """Rescore every turn's output on a model and compare with the recorded sampling logprobs.

    DUMP: a Parquet file or a directory of them (searched recursively), with output_logprobs.

    Example: trace-tools rescore dump.parquet --model tiny-qwen3 --out runs/rescore1

    With --samples, DUMP is a replay run: trace-tools rescore runs/r1 --samples --model tiny-qwen3

    Trainer logprobs instead: trace-tools rescore runs/r1 --samples --trainer-logprobs train_data/
    """
    from trace_tools.cli._output import console, note, print_json
    from trace_tools.cli._progress import progress_bar
    from trace_tools.errors import TraceToolsError
    from trace_tools.rescore import rescore

    if samples:
        from trace_tools.rescore.corrections import CorrectionOptions

        if out is not None:
            raise TraceToolsError("--samples writes into the run directory it reads; drop --out")
        if (model is None) == (trainer_logprobs is None):
            raise TraceToolsError("--samples takes one of --model M (to score the samples) and --trainer-logprobs PATH")
        options = CorrectionOptions(tis_cap, mis_low, mis_high, icepop_low, icepop_high, k3_threshold)
        source = {"model": model} if model else {"trainer_dump": trainer_logprobs, "trainer_format": trainer_format}
        _rescore_samples(dump, source, strategy, device, dtype, max_batch_tokens, options, json_out)
        return
    if model is None or trainer_logprobs is not None:
        raise TraceToolsError("rescore DUMP needs --model M; --trainer-logprobs goes with --samples")
    if out is None:
        raise TraceToolsError("rescore needs --out DIR (or --samples, to score a replay run's samples into it)")

    with progress_bar("rescoring", "tokens", disable=json_out) as advance:
        result = rescore(
            dump,
            model,
            device=device,
            dtype=dtype,
            max_batch_tokens=max_batch_tokens,
            out=out,
            threshold=threshold,
            max_threshold=max_threshold,
            tokenizer=tokenizer,
            chat_template=chat_template,
            write_tokens=tokens,
            on_progress=advance,
        )
    if json_out:
        print_json(result.summary)
        return
    console.print(_summary_table(result.summary))
    if result.summary.get("logprobs_source") == "synthetic":
        note(SYNTHETIC_NOTE)
    if result.summary["flagged"]:
        console.print(_flagged_table(result.summary["flagged"][:FLAGGED_SHOWN]))
    note(f"output directory: {out}")


def _summary_table(summary: dict[str, Any]) -> Any:
    from rich.table import Table

    model, turns, delta = summary["model"], summary["turns"], summary["delta"]
    table = Table(title=f"Rescore on {model['model']} ({model['device']}, {model['dtype']})", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    reasons = ", ".join(f"{k} {v}" for k, v in turns["not_comparable_by_reason"].items())
    rows = [
        ("turns compared", f"{turns['comparable']} of {turns['total']}"),
        ("not comparable", f"{turns['not_comparable']}" + (f" ({reasons})" if reasons else "")),
        ("flagged turns", str(turns["flagged"])),
        ("recorded logprobs", summary.get("logprobs_source", "recorded")),
        ("tokens compared", str(summary["tokens"])),
        ("mean Δ (recorded − recomputed)", _num(delta["mean_delta"])),
        (
            "mean |Δ| / p99 |Δ| / max |Δ|",
            " / ".join(_num(delta[k]) for k in ("mean_abs_delta", "p99_abs_delta", "max_abs_delta")),
        ),
        (f"tokens with |Δ| > {summary['options']['threshold']:g}", _fraction(summary["frac_above_threshold"])),
        ("KL(sampler‖model) k1 / k3", f"{_num(summary['kl']['k1'])} / {_num(summary['kl']['k3'])}"),
        ("turn log-ratio min / max", f"{_num(summary['log_ratio']['min'])} / {_num(summary['log_ratio']['max'])}"),
        (
            "throughput",
            f"{summary['throughput']['tokens_per_s'] or 0:,.0f} tokens/s, prefix sharing saved "
            f"{_fraction(summary['throughput']['prefix_sharing_saving'])}",
        ),
    ]
    if summary["quarantined"]:
        rows.append(("quarantined sessions", str(summary["quarantined"])))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _flagged_table(flagged: list[dict[str, Any]]) -> Any:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="Flagged turns (largest max |Δ| first)")
    for name in ("session", "turn", "max |Δ|", "mean |Δ|", "context around the worst token"):
        table.add_column(name, justify="left" if name in ("session", "context around the worst token") else "right")
    for row in flagged:
        table.add_row(
            escape(str(row["session_id"])),
            str(row["turn_index"]),
            _num(row["max_abs_delta"]),
            _num(row["mean_abs_delta"]),
            escape(_one_line(row["context"])),
        )
    return table


def _one_line(text: Any) -> str:
    # Chat-template text is full of newlines; a table row reads better with them shown, not taken.
    return text.replace("\n", "↵") if isinstance(text, str) else ""


def _num(value: Any) -> str:
    from trace_tools.report.layout import ABSENT

    return ABSENT if value is None else f"{value:.3g}"


def _fraction(value: Any) -> str:
    from trace_tools.report.layout import ABSENT

    return ABSENT if value is None else f"{value:.1%}"


def _rescore_samples(
    run: Path,
    source: dict[str, Any],
    strategies: Optional[list[str]],
    device: str,
    dtype: str,
    max_batch_tokens: int,
    options: Any,
    json_out: bool,
) -> None:
    from trace_tools.cli._output import console, note, print_json
    from trace_tools.cli._progress import progress_bar
    from trace_tools.rescore.samples import rescore_samples

    with progress_bar("scoring samples", "tokens", disable=json_out) as advance:
        result = rescore_samples(
            run,
            **source,
            strategies=strategies,
            device=device,
            dtype=dtype,
            max_batch_tokens=max_batch_tokens,
            options=options,
            on_progress=advance,
        )
    if json_out:
        print_json(result.headlines())
        return
    for table in _samples_tables(result.strategies):
        console.print(table)
    if "alignment" in result.run:
        note(_alignment_line(result.run["alignment"]))
    page = "; report.html rendered again, with the token strips" if (run / "report.html").exists() else ""
    note(f"wrote mismatch_*.parquet and strategies.NAME.mismatch in {run}/summary.json{page}")


def _alignment_line(alignment: dict[str, Any]) -> str:
    reasons = ", ".join(f"{reason} {n}" for reason, n in alignment["by_reason"].items())
    refused = alignment["read"].get("quarantined", 0)
    return (
        f"trainer logprobs: {alignment['aligned']} of {alignment['trainer_samples']} trainer samples aligned, "
        f"covering {alignment['run_samples_with_trainer_logprobs']} of {alignment['run_samples']} run samples"
        + (f"; not aligned: {reasons}" if reasons else "")
        + (f"; {refused} refused by the reader" if refused else "")
    )


def _samples_tables(strategies: dict[str, Any]) -> list[Any]:
    """The mismatch of each strategy, then what each correction mode would do to its tokens."""
    from rich.markup import escape
    from rich.table import Table

    from trace_tools.rescore.corrections import MODES

    measured = Table(title="Training–inference mismatch of each strategy's trained tokens")
    for name in ("strategy", "tokens", "served context", "max |Δ|", "k3_kl", "log_ppl_abs_diff", "worst context (k3)"):
        measured.add_column(name, justify="left" if name in ("strategy", "worst context (k3)") else "right")
    fixes = Table(title="Correction preview: masked / clipped share of trained tokens, turns losing all gradient")
    fixes.add_column("strategy")
    for mode in MODES:
        fixes.add_column(mode, justify="right")
    for name, entry in strategies.items():
        by_context = entry["by_context"]
        served = by_context.get("served", {}).get("tokens", 0)
        worst = max(by_context.items(), key=lambda item: item[1]["k3_kl"] or 0, default=None)
        measured.add_row(
            escape(name),
            str(entry["tokens"]),
            _fraction(served / entry["tokens"] if entry["tokens"] else None),
            _num(entry["max_abs_diff"]),
            _num(entry["k3_kl"]),
            _num(entry["log_ppl_abs_diff"]),
            escape(f"{worst[0]} ({_num(worst[1]['k3_kl'])})") if worst else "",
        )
        previews = [entry["corrections"][mode] for mode in MODES]
        fixes.add_row(
            escape(name),
            *(
                f"{_fraction(p['masked_fraction'])} / {_fraction(p['clipped_fraction'])}, "
                f"{p['turns_losing_all_gradient']}"
                for p in previews
            ),
        )
    return [measured, fixes]
