"""`export_samples`: the samples one strategy emitted in a run, in the layout trainers load
(docs/commands.md#export-samples-for-a-trainer).

A run's samples (`RUN/samples/`, one part per shard read as one dataset, or an older run's
`RUN/samples.parquet`: docs/run_directory.md#what-the-files-hold) keep every strategy's samples in
slime's layout: `token_ids` is the full sequence, `loss_mask` and `logprobs` cover only the response
region (the last `response_length` tokens), `source_turn` has one entry per token. An export keeps
that layout (it is what slime's `Sample` and miles' merged samples carry) under the trainers' names:

| export column | from the run's samples | length |
|---|---|---|
| `tokens` | `token_ids` | the sequence |
| `loss_mask` | `loss_mask` | `response_length` |
| `rollout_log_probs` | `logprobs`, with 0.0 wherever `loss_mask` is 0 | `response_length` |
| `response_length`, `reward`, `session_id`, `strategy`, `sample_index` | same | — |
| `turn_of_token` | `source_turn`: the producing turn, -1 for context | the sequence |
| `metadata` | the strategy's sample metadata + `trace_tools` (run, trained turns), JSON | — |

The prompt region is `tokens[:len(tokens) - response_length]`. Rows stream through a batch at a
time; Parquet output is written row group by row group, JSON lines one sample a line (there
`metadata` is an object, in Parquet a JSON string). Files appear atomically.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trace_tools.errors import UnknownName, UnusableInput, UsageError
from trace_tools.io import storage
from trace_tools.io.rundir import check_output_file, load_run_info, require_run
from trace_tools.io.sample_parts import samples_files
from trace_tools.io.storage import Location
from trace_tools.io.write import atomic_open

FORMATS = ("parquet", "jsonl")
SAMPLE_COLUMNS = [
    "strategy",
    "session_id",
    "sample_index",
    "token_ids",
    "response_length",
    "loss_mask",
    "logprobs",
    "source_turn",
    "reward",
]
EXPORT_SCHEMA = pa.schema(
    [
        pa.field("tokens", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("rollout_log_probs", pa.list_(pa.float64())),
        pa.field("response_length", pa.int32()),
        pa.field("reward", pa.float64()),
        pa.field("session_id", pa.string()),
        pa.field("strategy", pa.string()),
        pa.field("sample_index", pa.int32()),
        pa.field("turn_of_token", pa.list_(pa.int32())),
        pa.field("metadata", pa.string()),
    ]
)
BATCH_ROWS = 64


@dataclass
class ExportReport:
    out: Location
    strategy: str
    format: str
    samples: int = 0
    tokens: int = 0
    trained_tokens: int = 0


def export_samples(
    run: str | Path, strategy: str, fmt: str = "parquet", out: str | Path | None = None, overwrite: bool = False
) -> ExportReport:
    """Write `strategy`'s samples from `run` to `out` (default `RUN/export/<strategy>.<fmt>`).

    Raises UnusableInput (no run, no samples, an inconsistent sample), UnknownName (a
    format, or a strategy the run did not replay) or UsageError (an `out` that is a directory, the
    run's own samples or dump, a file in a run directory or an existing file without
    `overwrite`), all exit 2 on the command line.
    """
    if fmt not in FORMATS:
        raise UnknownName("export format", fmt, FORMATS)
    run = storage.location(run)
    samples = _samples_files(run)
    target = storage.location(out) if out else storage.join(run, "export", f"{strategy}.{fmt}")
    _check_target(target, [*samples, *_dump_files(run)], overwrite)
    _check_strategy(samples, strategy)
    report = ExportReport(target, strategy, fmt)
    rows = _export_rows(samples, strategy, storage.name(run), report)
    with storage.local_output(target) as local:
        (_write_parquet if fmt == "parquet" else _write_jsonl)(rows, local)
    return report


def _samples_files(run: Location) -> list[Location]:
    if not storage.is_dir(run):
        raise UnusableInput(f"no run directory {run}; pass the --out directory of `trace-tools replay`")
    require_run(run)  # finished, and a replay run (not a rescore output)
    samples = samples_files(run)
    if samples:
        return samples
    info = load_run_info(run)
    why = (
        "was replayed with --no-samples"
        if info.get("options", {}).get("write_samples") is False
        else "has no samples (no samples/manifest.json, no samples.parquet)"
    )
    dump = info.get("inputs", {}).get("dump", "DUMP")
    raise UnusableInput(
        f"{run} {why}, so it holds no samples to export; replay again without --no-samples "
        f"(`trace-tools replay {dump} --out {run} --overwrite`, with the run's other options)"
    )


def _check_target(target: Location, inputs: list[Location], overwrite: bool) -> None:
    """Never write over an input, a run's own file or an existing file unless asked (`rundir.check_output_file`)."""
    if isinstance(target, Path):
        check_output_file(target, [source for source in inputs if isinstance(source, Path)], overwrite)
    elif target in inputs:
        raise UsageError(f"--out {target} is one of this command's inputs; choose another path")
    elif not overwrite and storage.is_file(target):
        raise UsageError(f"--out {target} exists; pass --overwrite to replace it, or choose another path")


def _dump_files(run: Location) -> list[Location]:
    """The dump the run replayed (run.json): an export must never land on it."""

    inputs = load_run_info(run).get("inputs") or {}
    names = [inputs.get("dump"), *(inputs.get("files") or [])]
    return [storage.location(name) for name in names if isinstance(name, str)]


def _check_strategy(samples: list[Location], strategy: str) -> None:
    present: set[str] = set()
    for file in samples:
        with storage.open_input(file) as handle:
            present.update(pc.unique(pq.read_table(handle, columns=["strategy"]).column("strategy")).to_pylist())
    if strategy not in present:
        raise UnknownName("strategy in this run", strategy, sorted(present))


def _export_rows(
    samples: list[Location], strategy: str, run_name: str, report: ExportReport
) -> Iterator[dict[str, Any]]:
    for file in samples:
        yield from _file_rows(file, strategy, run_name, report)


def _file_rows(samples: Location, strategy: str, run_name: str, report: ExportReport) -> Iterator[dict[str, Any]]:
    with storage.open_input(samples) as handle:
        parquet = pq.ParquetFile(handle)
        columns = SAMPLE_COLUMNS + (["metadata"] if "metadata" in parquet.schema_arrow.names else [])
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns):
            chosen = batch.filter(pc.equal(batch.column("strategy"), strategy))
            for sample in chosen.to_pylist():
                row = export_row(sample, run_name)
                report.samples += 1
                report.tokens += len(row["tokens"])
                report.trained_tokens += sum(row["loss_mask"])
                yield row


def export_row(sample: dict[str, Any], run_name: str = "") -> dict[str, Any]:
    """One row of the run's samples in the export layout (see the module docstring)."""
    tokens, mask, logprobs = sample["token_ids"], sample["loss_mask"], sample["logprobs"]
    length = sample["response_length"]
    if not (len(mask) == len(logprobs) == length <= len(tokens) == len(sample["source_turn"])):
        raise UnusableInput(
            f"sample {sample['sample_index']} of session {sample['session_id']} is inconsistent "
            "(mask, logprobs, response_length and token counts disagree); replay the run again"
        )
    region = sample["source_turn"][len(tokens) - length :]
    trained_turns = sorted({turn for turn, m in zip(region, mask) if m and turn >= 0})
    metadata = json.loads(sample.get("metadata") or "{}")
    metadata["trace_tools"] = {"run": run_name, "trained_turns": trained_turns}
    return {
        "tokens": tokens,
        "loss_mask": mask,
        "rollout_log_probs": [lp if m else 0.0 for lp, m in zip(logprobs, mask)],
        "response_length": length,
        "reward": sample["reward"],
        "session_id": sample["session_id"],
        "strategy": sample["strategy"],
        "sample_index": sample["sample_index"],
        "turn_of_token": sample["source_turn"],
        "metadata": json.dumps(metadata, sort_keys=True),
    }


def _write_parquet(rows: Iterator[dict[str, Any]], out: Path) -> None:
    with atomic_open(out, "wb") as handle:
        writer = pq.ParquetWriter(handle, EXPORT_SCHEMA)
        pending: list[dict[str, Any]] = []
        for row in rows:
            pending.append(row)
            if len(pending) == BATCH_ROWS:
                writer.write_table(pa.Table.from_pylist(pending, schema=EXPORT_SCHEMA))
                pending = []
        writer.write_table(pa.Table.from_pylist(pending, schema=EXPORT_SCHEMA))
        writer.close()


def _write_jsonl(rows: Iterator[dict[str, Any]], out: Path) -> None:
    with atomic_open(out, "w") as handle:
        for row in rows:
            handle.write(json.dumps({**row, "metadata": json.loads(row["metadata"])}) + "\n")


def read_export(path: str | Path) -> list[dict[str, Any]]:
    """An export read back (either format) as plain rows, `metadata` parsed: for checks and notebooks."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    rows = pq.read_table(path).to_pylist()
    for row in rows:
        row["metadata"] = json.loads(row["metadata"])
    return rows
