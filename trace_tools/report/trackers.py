"""A run's metrics as scalar series by step, for the experiment trackers users already watch
(docs/trackers.md): TensorBoard event files, a W&B offline run, or JSON lines.

Every numeric metric of a strategy's summary block becomes one series named
`trace_tools/<strategy>/<metric>`, indexed by training step (`summary["by_step"]`); a run whose
dump has no steps is one point at step 0. Mismatch metrics are written a second time under
the names verl and slime log them by (`FRAMEWORK_NAMES`), so a search for the trainer's own
name finds trace-tools' curve beside it; the strategy a trainer runs may have them under those
names alone, in the trainer's own panels (`trained_with`). The tracker clients are optional extras, imported only
when their target is chosen.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_tools.errors import TraceToolsError, UnknownName, UsageError, did_you_mean, install_hint
from trace_tools.io.rundir import check_output_file, load_summary
from trace_tools.io.write import write_text_atomic

PREFIX = "trace_tools"
TARGETS = ("tensorboard", "wandb", "jsonl")
EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}  # target: (module, extra)

# A mismatch metric of `strategies[name]["mismatch"]` -> (verl's name, slime's name); None where
# the framework logs no such number. verl: `rollout_corr/*` (rollout-correction diagnostics);
# slime: the `mismatch_*` metrics and `train_rollout_logprob_abs_diff`, logged under `train/`.
FRAMEWORK_NAMES: dict[str, tuple[str | None, str | None]] = {
    "k1_kl": ("rollout_corr/kl", "train/mismatch_kl"),
    "k3_kl": ("rollout_corr/k3_kl", "train/mismatch_k3_kl"),
    "training_ppl": ("rollout_corr/training_ppl", "train/mismatch_training_ppl"),
    "training_log_ppl": ("rollout_corr/training_log_ppl", "train/mismatch_training_log_ppl"),
    "rollout_ppl": ("rollout_corr/rollout_ppl", "train/mismatch_rollout_ppl"),
    "rollout_log_ppl": ("rollout_corr/rollout_log_ppl", "train/mismatch_rollout_log_ppl"),
    "log_ppl_diff": ("rollout_corr/log_ppl_diff", "train/mismatch_log_ppl_diff"),
    "log_ppl_abs_diff": ("rollout_corr/log_ppl_abs_diff", "train/mismatch_log_ppl_abs_diff"),
    "log_ppl_diff_max": ("rollout_corr/log_ppl_diff_max", None),
    "log_ppl_diff_min": ("rollout_corr/log_ppl_diff_min", None),
    "ppl_ratio": ("rollout_corr/ppl_ratio", "train/mismatch_ppl_ratio"),
    "chi2_token": ("rollout_corr/chi2_token", None),
    "chi2_seq": ("rollout_corr/chi2_seq", None),
    "mean_abs_diff": (None, "train/train_rollout_logprob_abs_diff"),
}


@dataclass(frozen=True)
class MetricsExport:
    """What `export_metrics` wrote: where, how many steps and series, and the sessions left out."""

    target: str
    out: Path
    steps: list[int]
    series: int
    points: int
    sessions_without_step: int


# ---- the series ------------------------------------------------------------------------------


def step_metrics(summary: dict[str, Any], trained_with: str | None = None) -> list[tuple[int, dict[str, float]]]:
    """(step, {series name: value}) in step order: one entry per `by_step` item, or step 0 for
    the whole run when the summary has no steps. `trained_with`: the strategy whose mismatch
    metrics also go under the trainers' names alone (`rollout_corr/k3_kl`), as a trainer logs them."""
    if trained_with is not None and trained_with not in summary.get("strategies", {}):
        raise UnknownName("strategy (--trained-with)", trained_with, list(summary.get("strategies", {})))
    blocks = summary.get("by_step") or [{**summary, "step": 0}]
    return [(int(block["step"]), scalars(block, trained_with)) for block in blocks]


def scalars(block: dict[str, Any], trained_with: str | None = None) -> dict[str, float]:
    """The named scalars of one summary block (the whole run, or one step of it)."""
    out: dict[str, float] = {}
    for key in ("sessions_replayed", "turns_replayed"):
        if _is_number(block.get(key)):
            out[f"{PREFIX}/{key}"] = block[key]
    savings = block.get("token_savings") or {}
    causes = block.get("drift_causes") or {}
    for name, strategy in block.get("strategies", {}).items():
        base = f"{PREFIX}/{_part(name)}"
        out.update(_flatten(base, _strategy_metrics(strategy)))
        out.update(_flatten(f"{base}/token_savings", savings.get(name) or {}))
        out.update(_flatten(f"{base}/drift_causes", causes.get(name) or {}))
        out.update(_framework_aliases(f"{base}/", strategy.get("mismatch") or {}))
        if name == trained_with:
            out.update(_framework_aliases("", strategy.get("mismatch") or {}))
    return out


def _strategy_metrics(strategy: dict[str, Any]) -> dict[str, Any]:
    """A strategy's block with samples per session as its mean (the distribution's counts are
    sessions, kept under their own name) and the mismatch block kept as it is."""
    metrics = {key: value for key, value in strategy.items() if key != "samples_per_session"}
    sessions = strategy.get("sessions") or 0
    metrics["samples_per_session"] = strategy.get("samples", 0) / sessions if sessions else 0.0
    metrics["sessions_by_samples"] = strategy.get("samples_per_session") or {}
    return metrics


def _framework_aliases(prefix: str, mismatch: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, names in FRAMEWORK_NAMES.items():
        if _is_number(mismatch.get(key)):
            out.update({prefix + name: mismatch[key] for name in names if name})
    return out


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, float]]:
    """Every number under `value` as (`prefix/key/...`, value); strings, flags and nulls are not series."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flatten(f"{prefix}/{_part(key)}", inner)
    elif _is_number(value):
        yield prefix, value


def _is_number(value: Any) -> bool:
    """A finite int or float (a flag is not a number; NaN and infinity have no point on a curve)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _part(key: Any) -> str:
    """A name part: `/` separates levels in every tracker, so one inside a key (a tool name) would split it."""
    return str(key).replace("/", "_")


# ---- the targets ----------------------------------------------------------------------------


def export_metrics(
    run_dir: str | Path,
    target: str,
    out: str | Path | None = None,
    *,
    name: str | None = None,
    project: str = "trace-tools",
    trained_with: str | None = None,
    overwrite: bool = False,
) -> MetricsExport:
    """Write a run's per-step series to `target` (docs/trackers.md#where-the-files-go).

    tensorboard: event files in `out/<name>/` (`out` is a TensorBoard logdir); wandb: an offline
    run under `out/wandb/` (default: the working directory, as `wandb` itself does), for `wandb
    sync`; jsonl: the file `out`, one object per step. `name` defaults to the run directory's name."""
    if target not in TARGETS:
        raise UsageError(f"unknown --to {target!r}{did_you_mean(target, TARGETS)}; choose one of: {', '.join(TARGETS)}")
    if target != "wandb" and out is None:
        raise UsageError(f"--to {target} needs --out ({'a directory' if target == 'tensorboard' else 'a file'})")
    run = Path(run_dir)
    summary = load_summary(run)
    _require_extra(target)
    series = step_metrics(summary, trained_with)
    label = name or run.resolve().name
    if target == "tensorboard":
        written = _write_tensorboard(series, Path(str(out)) / label, overwrite)
    elif target == "wandb":
        written = _write_wandb(series, Path(out or "."), label, project, summary)
    else:
        written = _write_jsonl(series, Path(str(out)), run, overwrite)
    return MetricsExport(
        target=target,
        out=written,
        steps=[step for step, _ in series],
        series=len({key for _, values in series for key in values}),
        points=sum(len(values) for _, values in series),
        sessions_without_step=int(summary.get("sessions_without_step") or 0),
    )


def _require_extra(target: str) -> None:
    import importlib.util

    if target in EXTRAS and importlib.util.find_spec(EXTRAS[target][0]) is None:
        module, extra = EXTRAS[target]
        raise TraceToolsError(f"--to {target} needs the {module} package: {install_hint(extra)}")


def _write_jsonl(series: list[tuple[int, dict[str, float]]], out: Path, run: Path, overwrite: bool) -> Path:
    check_output_file(out, [run / "summary.json"], overwrite)
    lines = [json.dumps({"step": step, **values}, allow_nan=False) for step, values in series]
    return write_text_atomic("".join(line + "\n" for line in lines), out)


def _write_tensorboard(series: list[tuple[int, dict[str, float]]], logdir: Path, overwrite: bool) -> Path:
    """Scalar events through TensorBoard's own event-file writer (no TensorFlow needed)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    old = sorted(logdir.glob("events.out.tfevents.*")) if logdir.is_dir() else []
    if old and not overwrite:
        raise UsageError(f"{logdir} already holds TensorBoard event files; pass --overwrite to replace them")
    for path in old:
        path.unlink()
    writer = EventFileWriter(str(logdir))
    try:
        for step, values in series:
            tags = [summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in values.items()]
            writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=tags)))
    finally:
        writer.close()
    return logdir


# Set while wandb runs, restored after: offline, silent, no error reports (Sentry), no code or git capture.
WANDB_ENV = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_ERROR_REPORTING": "false",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_CONSOLE": "off",
}


def _write_wandb(
    series: list[tuple[int, dict[str, float]]], out: Path, label: str, project: str, summary: dict[str, Any]
) -> Path:
    """An offline W&B run (never a network call) whose history holds the series; returns its directory."""
    out.mkdir(parents=True, exist_ok=True)
    with _environment(WANDB_ENV):
        import wandb

        options: dict[str, Any] = {
            "mode": "offline",
            "console": "off",
            "silent": True,
            "disable_git": True,
            "save_code": False,
            "disable_job_creation": True,
            "reinit": "create_new",  # beside a run the caller has open (a training script's), never ending it
        }
        # wandb's private switches for its system probes, where this wandb version has them
        probes = {"x_disable_stats": True, "x_disable_meta": True, "x_save_requirements": False}
        options |= {key: value for key, value in probes.items() if key in wandb.Settings.model_fields}
        settings = wandb.Settings(**options)
        caller_run = wandb.run
        run = wandb.init(
            project=project,
            name=label,
            dir=str(out),
            config={"strategies": list(summary.get("strategies", {}))},
            settings=settings,
        )
        try:
            for step, values in series:
                run.log(values, step=step)
        finally:
            run.finish()
            if caller_run is None:
                # finish() returns before wandb's service has written the run's last record;
                # stopping the service waits for it (a caller's open run keeps it running)
                wandb.teardown()
    return Path(run.dir).parent


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
