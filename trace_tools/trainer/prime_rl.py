"""prime-rl token exports (`--enable-token-export`): `token_exports/step_<s>/rank_<r>.jsonl`, one
JSON object a line per trained sequence (prime-rl 559b4477, `prime_rl/trainer/rl/token_export.py`,
export schema_version 1).

Every per-token column covers the whole sequence (`token_ids`, `loss_mask` as booleans,
`inference_logprobs`, `trainer_logprobs`, `advantages`, `importance_ratio`, `is_masked`, ...);
the writer turns a non-finite float into null. There is no response length: the response starts
at the first trained token, so `loss_mask`, both logprobs and the other columns are cut there to
follow slime's layout (the prompt's columns are dropped). prime-rl names no environment rollout:
`session_id` is None and `env_name`, rank and micro-step go into `metadata`. Files are read a line
at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trace_tools.trainer.checks import (
    Item,
    Quarantined,
    ReadOptions,
    Refused,
    attempt,
    checked_sample,
    required,
    token_ids,
)
from trace_tools.trainer.records import TrainerSample

SCHEMA_VERSIONS = (1,)
TOKEN_COLUMNS = ("token_ids", "position_ids", "loss_mask", "inference_logprobs", "trainer_logprobs")
KEPT_SCALARS = ("rank", "micro_step", "micro_sequence_idx", "export_sequence_idx", "env_name", "schema_version")


def read_prime_rl(files: list[Path], options: ReadOptions) -> Iterator[Item]:
    for path in files:
        step = _step(path)
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    yield _line(line, f"{path.parent.name}/{path.name}:{number}", step, options)


def _step(path: Path) -> int | None:
    found = re.fullmatch(r"step_(\d+)", path.parent.name)
    return int(found.group(1)) if found else None


def _line(line: str, source: str, step: int | None, options: ReadOptions) -> Item:
    try:
        record = json.loads(line)
    except ValueError as error:
        return Quarantined(source, "bad_json", f"not valid JSON ({getattr(error, 'msg', error)})")
    return attempt(source, lambda: _sample(record, source, step, options))


def _sample(record: Any, source: str, step: int | None, options: ReadOptions) -> TrainerSample:
    if not isinstance(record, dict):
        raise Refused("wrong_type", f"the line holds a {type(record).__name__}, expected a token-export object")
    if record.get("schema_version") not in (None, *SCHEMA_VERSIONS):
        raise Refused("wrong_type", f"export schema_version {record['schema_version']!r}; this reader knows 1")
    tokens = token_ids(required(record, "token_ids"), "token_ids", options.vocab_size)
    mask = required(record, "loss_mask")
    if not isinstance(mask, list) or len(mask) != len(tokens):
        shown = len(mask) if isinstance(mask, list) else type(mask).__name__
        raise Refused("length_mismatch", f"loss_mask has {shown} values for {len(tokens)} token_ids")
    start = next((i for i, trained in enumerate(mask) if trained), len(mask))
    columns = {  # the other per-token columns, over the response; all-null ones (defaults) dropped
        name: values[start:]
        for name, values in record.items()
        if name not in TOKEN_COLUMNS and isinstance(values, list) and len(values) == len(tokens)
        if any(value is not None for value in values[start:])
    }
    return checked_sample(
        source,
        tokens=tokens,
        response_len=len(tokens) - start,
        mask=mask[start:],
        vocab_size=None,  # checked above
        rollout_logprobs=_response(record, "inference_logprobs", start, len(tokens)),
        trainer_logprobs=_response(record, "trainer_logprobs", start, len(tokens)),
        step=record["step"] if isinstance(record.get("step"), int) else step,
        metadata={name: record[name] for name in KEPT_SCALARS if record.get(name) is not None},
        columns=columns,
    )


def _response(record: dict, name: str, start: int, length: int) -> list | None:
    values = record.get(name)
    if values is None:
        return None
    if not isinstance(values, list):
        raise Refused("wrong_type", f"{name} is a {type(values).__name__}, expected a list of numbers")
    if len(values) != length:
        raise Refused("logprobs_length", f"{name} has {len(values)} values for {length} token_ids")
    return values[start:]
