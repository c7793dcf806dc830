"""miles `--dump-details` dashboard mirrors: `dashboard_columns/rollout_{id}.parquet` (one row per
sample: `sample_index`, `response_length`, `total_length`, `tokens`, `loss_mask`,
`rollout_log_probs`), joined by `sample_index` to `trajectory/{id}.jsonl` (`group_index`, `status`,
`reward`, `prompt`, `messages`, written only for samples that recorded a conversation). miles
31f1ca96, `miles/ray/rollout/debug_data.py`.

The Parquet file is streamed a few rows at a time; the step's trajectory lines are held while its
file is read (one object per sample: its messages). Read these when `rollout_data/*.pt` is gone;
where both are there the `.pt` files are the fuller record (docs/trainer_dumps.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trace_tools.errors import UnusableInput
from trace_tools.trainer.checks import Item, ReadOptions, Refused, attempt, checked_sample, integer, required
from trace_tools.trainer.records import TrainerSample

BATCH_ROWS = 64
COLUMNS = ("sample_index", "response_length", "tokens", "loss_mask", "rollout_log_probs")


def read_miles_dashboard(files: list[Path], options: ReadOptions) -> Iterator[Item]:
    for path in files:
        step = _step(path)
        rows = _trajectory_rows(path.parent.parent / "trajectory" / f"{'' if step is None else step}.jsonl")
        for position, row in enumerate(_rows(path)):
            source = f"{path.name}#row[{position}]"
            yield attempt(source, lambda: _sample(row, rows, source, step, options))


def _step(path: Path) -> int | None:
    found = re.fullmatch(r"rollout_(\d+)", path.stem)
    return int(found.group(1)) if found else None


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    try:
        parquet = pq.ParquetFile(path)
        missing = [name for name in ("tokens", "response_length") if name not in parquet.schema_arrow.names]
        if missing:
            raise UnusableInput(
                f"{path} has no {', '.join(missing)} column: not a miles dashboard_columns file; "
                "pass dashboard_columns/rollout_<id>.parquet"
            )
        wanted = [name for name in COLUMNS if name in parquet.schema_arrow.names]
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=wanted, use_threads=False):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UnusableInput(f"{path} is not a readable Parquet file ({reason}); re-export it or leave it out") from None


def _trajectory_rows(path: Path) -> dict[int, dict]:
    """The step's trajectory lines by sample_index; {} where miles wrote none (no conversations)."""
    if not path.is_file():
        return {}
    rows = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                row = json.loads(line) if line.strip() else None
            except ValueError:
                continue  # a torn last line: its sample keeps its tokens, without group and reward
            if isinstance(row, dict) and isinstance(row.get("sample_index"), int):
                rows[row["sample_index"]] = row
    return rows


def _sample(
    row: dict, trajectory: dict[int, dict], source: str, step: int | None, options: ReadOptions
) -> TrainerSample:
    index = None if row.get("sample_index") is None else integer(row["sample_index"], "sample_index")
    extra = trajectory.get(index, {}) if index is not None else {}
    reward = extra.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise Refused("wrong_type", f"trajectory reward is a {type(reward).__name__}, expected a number")
    return checked_sample(
        source,
        tokens=required(row, "tokens"),
        response_len=required(row, "response_length"),
        mask=row.get("loss_mask"),
        vocab_size=options.vocab_size,
        rollout_logprobs=row.get("rollout_log_probs"),
        step=step,
        index=index,
        group_index=extra.get("group_index") if isinstance(extra.get("group_index"), int) else None,
        reward=None if reward is None else float(reward),
        status=extra.get("status") if isinstance(extra.get("status"), str) else None,
        metadata={k: extra[k] for k in ("prompt", "messages") if k in extra},
    )
