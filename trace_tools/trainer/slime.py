"""slime / miles `.pt` sample dumps: rollout data, joined to the trainer's own logprobs when dumped.

Shapes (slime 624b824a, miles 31f1ca96; docs/trainer_dumps.md):

- rollout data, `--save-debug-rollout-data PATH` or `--dump-details DIR` → `DIR/rollout_data/{id}.pt`:
  `{rollout_id, samples: [Sample.to_dict(), ...]}` (miles adds `metadata`). `eval_{id}.pt` files
  hold evaluation samples, which are not trained: they are passed over with a note.
- train data, `--save-debug-train-data PATH` or `DIR/train_data/{id}.pt` (slime) /
  `{id}_{rank}.pt` (miles): slime writes `{format_version: 2, rollout_id, samples: [{sample_index,
  rollout_position, tokens, log_probs, ...}], dp_shards}`; miles (and slime before format 2)
  writes one rank's columns, `{rollout_id, rank, rollout_data: {sample_indices, tokens, log_probs,
  ...}, cp_size}`. `log_probs` (one per response token) become `trainer_logprobs`, joined to the
  rollout sample at the same `rollout_position` (else the same `Sample.index`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_tools.errors import UnusableInput
from trace_tools.trainer.checks import (
    Item,
    Note,
    ReadOptions,
    Refused,
    attempt,
    checked_sample,
    integer,
    plain,
    required,
    token_ids,
)
from trace_tools.trainer.pt_files import load_pt
from trace_tools.trainer.records import TrainerSample

# Sample fields kept in `metadata` (small facts); token-level ones become TrainerSample fields,
# and the rest (multimodal inputs, routed experts, top-p ids) are dropped as the audit reads none.
KEPT_FIELDS = ("rollout_id", "session_id", "label", "weight_versions", "remove_sample", "routing_key")
# A field of slime's format-2 train rows → the column of a per-rank (miles) train file holding it.
TRAIN_COLUMNS = {
    "tokens": "tokens",
    "response_lengths": "response_lengths",
    "loss_masks": "loss_masks",
    "log_probs": "log_probs",
    "sample_index": "sample_indices",
}


@dataclass(slots=True)
class TrainEntry:
    position: int | None  # index in the rollout file's samples (slime's `partition`)
    sample_index: int | None  # Sample.index
    token_count: int
    token_hash: int
    log_probs: Any


@dataclass(slots=True)
class TrainIndex:
    by_position: dict[int, TrainEntry] = field(default_factory=dict)
    by_index: dict[int, TrainEntry] = field(default_factory=dict)
    used: set[int] = field(default_factory=set)  # id() of entries joined to a rollout sample

    def add(self, entry: TrainEntry) -> None:
        if entry.position is not None:
            self.by_position[entry.position] = entry
        if entry.sample_index is not None:
            self.by_index[entry.sample_index] = entry

    def find(self, position: int, sample_index: Any) -> TrainEntry | None:
        entry = self.by_position.get(position) if self.by_position else self.by_index.get(sample_index)
        if entry is not None:
            self.used.add(id(entry))
        return entry

    def unused(self) -> int:
        entries = {id(e): e for e in [*self.by_position.values(), *self.by_index.values()]}
        return len(entries.keys() - self.used)


def read_slime(files: list[Path], options: ReadOptions) -> Iterator[Item]:
    rollouts, trains, notes = _classify(files, options)
    yield from notes
    for path, step in rollouts:
        payload = load_pt(path, options.max_pickle_bytes)
        samples = _rollout_samples(path, payload)
        step = payload["rollout_id"] if isinstance(payload.get("rollout_id"), int) else step
        index = _train_index(trains.pop(step, []), options) if step is not None else TrainIndex()
        for position, raw in enumerate(samples):
            samples[position] = None  # each converted sample's raw dict is freed as the file is read
            source = f"{path.name}#samples[{position}]"
            yield attempt(source, lambda: _sample(raw, source, step, position, index, options))
        if unused := index.unused():
            yield Note(f"{unused} train-data samples of rollout {step} match no rollout sample (not read)")
    for step, paths in trains.items():
        yield Note(
            f"train data {', '.join(p.name for p in paths)} (rollout {step}) has no rollout-data file: "
            "its samples are read from the train data alone (no rollout logprobs)"
        )
        for path in paths:
            yield from _train_only_samples(path, step, options)


def _classify(files: list[Path], options: ReadOptions) -> tuple[list, dict, list[Note]]:
    """Rollout files in order with their step (from the name, else the content), train files by step."""
    rollouts: list[tuple[Path, int | None]] = []
    trains: dict[int | None, list[Path]] = {}
    notes = []
    for path in files:
        kind, numbers = _kind_by_name(path), [int(n) for n in re.findall(r"\d+", path.stem)]
        if kind == "eval":
            notes.append(Note(f"{path.name} holds evaluation samples, which are not trained: passed over"))
            continue
        step = numbers[-1 if kind == "rollout" else 0] if numbers else None
        if kind is None:  # a --save-debug-* path of the user's own naming: the content says which
            # (and it is loaded again when read, so that one file at a time is in memory)
            payload = load_pt(path, options.max_pickle_bytes)
            kind = "train" if isinstance(payload, dict) and _is_train(payload) else "rollout"
            step = payload["rollout_id"] if kind == "train" and isinstance(payload.get("rollout_id"), int) else step
            del payload
        if kind == "rollout":
            rollouts.append((path, step))
        else:
            trains.setdefault(step, []).append(path)
    return rollouts, trains, notes


def _kind_by_name(path: Path) -> str | None:
    if path.stem.startswith("eval_"):
        return "eval"
    if path.parent.name == "train_data" or path.stem.startswith("train"):
        return "train"
    if path.parent.name == "rollout_data" or path.stem.startswith("rollout"):
        return "rollout"
    return None


def _is_train(payload: dict) -> bool:
    return "format_version" in payload or "rollout_data" in payload


def _rollout_samples(path: Path, payload: Any) -> list:
    if isinstance(payload, dict) and _is_train(payload):
        raise UnusableInput(f"{path} is train data, named as rollout data; rename it train_<id>.pt or pass its folder")
    if not isinstance(payload, dict) or not isinstance(payload.get("samples"), list):
        raise UnusableInput(
            f"{path} is not a slime/miles rollout dump ({{rollout_id, samples: [...]}} expected, "
            f"found a {type(payload).__name__}); pass rollout_data/*.pt or --save-debug-rollout-data files"
        )
    return payload["samples"]


def _train_index(paths: list[Path], options: ReadOptions) -> TrainIndex:
    index = TrainIndex()
    for path in paths:
        for entry in _train_entries(path, load_pt(path, options.max_pickle_bytes)):
            index.add(entry)
    return index


def _train_entries(path: Path, payload: Any) -> Iterator[TrainEntry]:
    for row in _train_rows(path, payload):
        if row.get("log_probs") is not None:  # without log_probs there is nothing to join
            yield _entry(row.get("rollout_position"), row.get("sample_index"), row.get("tokens"), row)


def _train_only_samples(path: Path, step: int | None, options: ReadOptions) -> Iterator[Item]:
    """The samples of a train-data file read without its rollout file: tokens, response length,
    loss mask and the trainer's `log_probs` are all there (`--save-debug-train-data` alone)."""
    for position, row in enumerate(_train_rows(path, load_pt(path, options.max_pickle_bytes))):
        source = f"{path.name}#samples[{position}]"
        yield attempt(
            source,
            lambda: checked_sample(
                source,
                tokens=required(row, "tokens"),
                response_len=required(row, "response_lengths"),
                mask=row.get("loss_masks"),
                vocab_size=options.vocab_size,
                trainer_logprobs=row.get("log_probs"),
                step=step,
                index=_optional_int(row, "sample_index"),
            ),
        )


def _train_rows(path: Path, payload: Any) -> Iterator[dict]:
    """One dict per trained sample (slime format 2's rows, or one rank's columns cut into rows)."""
    if isinstance(payload, dict) and isinstance(payload.get("samples"), list):
        yield from (row for row in payload["samples"] if isinstance(row, dict))
        return
    columns = payload.get("rollout_data") if isinstance(payload, dict) else None
    if not isinstance(columns, dict):
        raise UnusableInput(f"{path} is not slime/miles train data ({{samples}} or {{rollout_data}} expected)")
    if (payload.get("cp_size") or 1) > 1:
        return  # context-parallel slices are not whole responses: neither joined nor read alone
    lists = {name: columns.get(column) for name, column in TRAIN_COLUMNS.items()}
    for i in range(max((len(values) for values in lists.values() if values is not None), default=0)):
        yield {name: _nth(values, i) for name, values in lists.items()}


def _nth(values: Any, i: int) -> Any:
    return values[i] if values is not None and i < len(values) else None


def _entry(position: Any, sample_index: Any, tokens: Any, item: dict) -> TrainEntry:
    ids = plain(tokens) if tokens is not None else []
    return TrainEntry(
        position=int(plain(position)) if position is not None else None,
        sample_index=int(plain(sample_index)) if sample_index is not None else None,
        token_count=len(ids),
        token_hash=hash(tuple(ids)),
        log_probs=item["log_probs"],
    )


def _sample(
    raw: Any, source: str, step: int | None, position: int, index: TrainIndex, options: ReadOptions
) -> TrainerSample:
    if not isinstance(raw, dict):
        raise Refused("wrong_type", f"the sample is a {type(raw).__name__}, expected Sample.to_dict()")
    tokens = token_ids(required(raw, "tokens"), "tokens", options.vocab_size)
    entry = index.find(position, plain(raw.get("index")))
    if (
        entry is not None
        and entry.token_count
        and (entry.token_count, entry.token_hash)
        != (
            len(tokens),
            hash(tuple(tokens)),
        )
    ):
        raise Refused("train_mismatch", f"train data holds other tokens ({entry.token_count}) for this sample")
    metadata = dict(raw["metadata"]) if isinstance(raw.get("metadata"), dict) else {}
    metadata.update({name: plain(raw[name]) for name in KEPT_FIELDS if raw.get(name) is not None})
    reward = plain(raw.get("reward"))
    if isinstance(reward, dict):
        metadata["reward"], reward = reward, None
    return checked_sample(
        source,
        tokens=tokens,
        response_len=required(raw, "response_length"),
        mask=raw.get("loss_mask"),
        vocab_size=None,  # checked above
        rollout_logprobs=raw.get("rollout_log_probs"),
        trainer_logprobs=entry.log_probs if entry is not None else None,
        step=step,
        group_index=_optional_int(raw, "group_index"),
        index=_optional_int(raw, "index"),
        session_id=_session_of(raw, metadata),
        reward=_reward(reward),
        status=_status(raw.get("status")),
        metadata=metadata,
    )


def _optional_int(raw: dict, name: str) -> int | None:
    return None if raw.get(name) is None else integer(raw[name], name)


def _session_of(raw: dict, metadata: dict) -> str | None:
    """The environment rollout a sample came from: `Sample.rollout_id` (shared by every sample one
    agent run was split into), else `Sample.session_id` (the router's per-run key), else
    `metadata["session_id"]`."""
    for value in (plain(raw.get("rollout_id")), raw.get("session_id"), metadata.get("session_id")):
        if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
            return str(value)
    return None


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Refused("wrong_type", f"reward is a {type(value).__name__}, expected a number or a dict of them")
    return float(value)


def _status(value: Any) -> str | None:
    value = getattr(value, "value", value)  # an Enum kept by a custom writer
    return value if isinstance(value, str) else None
