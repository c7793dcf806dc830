"""An audit as a run directory (docs/run_directory.md): tables, summary.json (last), report.md, report.html.

The audit's run has one strategy, `trainer`, so `report`, `compare` and `gate` read it as they
read a replay: `turns.parquet` has one row per trained span (its `tool` is the span's first tool
call, or `text`), `sessions.parquet` one row per session, `quarantine.parquet` one row per sample
set aside. summary.json's `strategies.trainer` holds the replay metrics computed by the same
code (`report.metrics.summarize`) plus `reemitted_tokens`, `one_sample_tokens`,
`trained_tokens_by_tool` and `loss_mask_rules`; its `audit` block holds the per-step numbers, the
rules with examples and the comparison with a strategy.

Without a per-call dump a span's generated tokens are its trained tokens (a trainer's samples
show no output the trainer was not given), so coverage is 1 by construction; with one, every
tool's generated tokens are the per-call dump's and coverage is what the trainer trained of them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

from trace_tools.errors import UsageError
from trace_tools.io.rundir import QUARANTINE_COLUMNS, directory_kind, remove_outputs
from trace_tools.io.write import write_json_atomic, write_parquet_atomic
from trace_tools.report.metrics import summarize
from trace_tools.trainer.audit_rules import TRAINER


def prepare_run_dir(out: Path, overwrite: bool) -> None:
    """Refuse an `--out` that is a file, or a non-empty directory without `overwrite` (where the
    earlier run's files are removed first, as `replay --overwrite` does)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; pass a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            what = "a run directory" if directory_kind(out) == "run" else "not empty"
            raise UsageError(f"--out {out} is {what}; pass --overwrite to replace it, or choose another directory")
        if directory_kind(out) == "run":
            shutil.rmtree(out / "shards", ignore_errors=True)  # a replay's shards must not resume into an audit
        remove_outputs(out)
    out.mkdir(parents=True, exist_ok=True)


# turns.parquet: replay's columns (docs/run_directory.md), then where each trained span sits
TURN_COLUMNS = (
    "strategy session_id turn_index tool tool_names generated_tokens trained_tokens event prompt_event "
    "step sample_index span_start"
).split()


def tables(audit: Any) -> dict[str, pd.DataFrame]:
    """turns, sessions and quarantine as the run directory holds them."""
    turns = pd.DataFrame(
        [
            (TRAINER, span.session, index, span.tool, span.tool_names, span.tokens, span.tokens)
            + ("trained", "trainer_sample", span.step, span.sample, span.start)
            for index, span in _numbered(audit.spans)
        ],
        columns=TURN_COLUMNS,
    )
    sessions = pd.DataFrame(
        [
            {
                "strategy": TRAINER,
                "session_id": key,
                "step": t.step,
                "samples": t.samples,
                "forks": t.samples - 1,
                "generated_tokens": t.trained_tokens,
                "trained_tokens": t.trained_tokens,
                "forwarded_tokens": t.forwarded_tokens,
                "context_tokens": t.forwarded_tokens - t.trained_tokens,
                "reemitted_tokens": t.reemitted_tokens,
                "one_sample_tokens": t.forwarded_tokens - t.reemitted_tokens,
            }
            for key, t in audit.session_totals.items()
        ]
    )
    quarantine = pd.DataFrame(audit.quarantine, columns=list(QUARANTINE_COLUMNS))
    return {"turns": turns, "sessions": sessions, "quarantine": quarantine}


def _numbered(spans: list[Any]) -> list[tuple[int, Any]]:
    """Each span with its position among its session's spans (the `turn_index` of turns.parquet)."""
    counts: dict[str, int] = {}
    out = []
    for span in spans:
        out.append((counts.get(span.session, 0), span))
        counts[span.session] = counts.get(span.session, 0) + 1
    return out


def build_summary(audit: Any, frames: dict[str, pd.DataFrame], comparison: dict[str, Any] | None) -> dict[str, Any]:
    quarantined_only = set(frames["quarantine"]["session_id"]) - set(audit.session_totals)
    loaded = SimpleNamespace(
        session_count=len(audit.session_totals) + len(quarantined_only), rows=len(audit.spans), vocab_checked=True
    )
    summary = summarize({**frames, "fidelity": pd.DataFrame({"exact": []})}, loaded, [TRAINER])
    trainer = summary["strategies"][TRAINER]
    run = audit.run.to_dict()
    trainer.update(
        reemitted_tokens=run["reemitted_tokens"],
        one_sample_tokens=run["one_sample_tokens"],
        trained_tokens_by_tool=run["trained_tokens_by_tool"],
        loss_mask_rules={
            name: {"checked": r.checked, "violations": r.violations} for name, r in audit.tally.rules.items()
        },
    )
    if comparison is not None:
        _coverage_from_calls(trainer, comparison["generated_by_tool"])
    summary["audit"] = {
        "ok": audit.tally.ok,
        "family": audit.markers.family,
        "run": run,
        "steps": {step: totals.to_dict() for step, totals in sorted(audit.steps.items(), key=_step_order)},
        **audit.tally.to_dict(),
        "quarantined_samples": audit.set_aside,
        "comparison": comparison,
    }
    return summary


def _step_order(item: tuple[str, Any]) -> tuple[int, int]:
    step = item[0]
    return (1, 0) if step == "none" else (0, int(step))


def _coverage_from_calls(trainer: dict[str, Any], generated_by_tool: dict[str, dict[str, int]]) -> None:
    """Coverage against the output the per-call dump records: what the trainer trained of it, by tool."""
    tool_turns = trainer["tool_turns"]
    for tool, recorded in generated_by_tool.items():
        entry = tool_turns.setdefault(
            tool, {"turns": 0, "dropped_turns": 0, "generated_tokens": 0, "trained_tokens": 0}
        )
        entry["dropped_turns"] = max(recorded["turns"] - entry["turns"], 0)
        entry["turns"] = max(recorded["turns"], entry["turns"])
        entry["generated_tokens"] = recorded["generated_tokens"]
    generated = sum(v["generated_tokens"] for v in tool_turns.values())
    trainer["generated_tokens"] = generated
    trainer["coverage"] = trainer["trained_tokens"] / generated if generated else 0.0
    trainer["coverage_by_tool"] = {
        tool: v["trained_tokens"] / v["generated_tokens"] if v["generated_tokens"] else 0.0
        for tool, v in sorted(tool_turns.items())
    }


def write_run(out: Path, frames: dict[str, pd.DataFrame], summary: dict[str, Any]) -> Path:
    """The run directory: tables, run.json, report.md, report.html, summary.json last."""
    from trace_tools.report.html import write_html_report
    from trace_tools.report.render import write_report

    for name, frame in frames.items():
        write_parquet_atomic(frame, out / f"{name}.parquet")
    run_info = {"kind": "audit-samples", "family": summary["audit"]["family"], "strategies": [TRAINER]}
    write_json_atomic(run_info, out / "run.json")
    write_report(out, summary, frames)
    write_html_report(out, summary=summary)
    write_json_atomic(summary, out / "summary.json")
    return out
