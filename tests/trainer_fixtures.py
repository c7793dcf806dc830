"""Writers of post-manager sample dumps in their upstream shapes, from plain lists (our own code).

Each writer produces the files a framework leaves on disk (docs/trainer_dumps.md has the commits
followed): slime / miles rollout and train `.pt` data, miles' dashboard mirrors, prime-rl token
exports. A sample is given as `spec(...)` (token ids, response length, loss mask, logprobs, ids);
writers fill in the framework's other fields. Hostile variants are made by passing bad values
(writers do not check), or by `write_pickled_class_pt`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


class CustomThing:
    """A class a `.pt` may pickle; loading it would import (and could run) code."""

    def __init__(self, value: int):
        self.value = value


def spec(
    tokens: list[int],
    response_length: int,
    *,
    loss_mask: Any = "ones",
    rollout_log_probs: Any = "default",
    index: int = 0,
    group_index: int = 0,
    rollout_id: int | None = None,
    session_id: str | None = None,
    reward: Any = 1.0,
    status: str = "completed",
    metadata: dict | None = None,
) -> dict[str, Any]:
    """One slime `Sample.to_dict()`: `loss_mask` "ones" = every response token trained, and
    `rollout_log_probs` "default" = -0.5 per response token; other values (None included) are kept."""
    return {
        "group_index": group_index,
        "index": index,
        "rollout_id": rollout_id,
        "prompt": "task",
        "tokens": tokens,
        "multimodal_inputs": None,
        "response": "",
        "response_length": response_length,
        "label": None,
        "reward": reward,
        "loss_mask": [1] * response_length if loss_mask == "ones" else loss_mask,
        "weight_versions": ["3"],
        "rollout_log_probs": [-0.5] * response_length if rollout_log_probs == "default" else rollout_log_probs,
        "remove_sample": False,
        "status": status,
        "metadata": metadata if metadata is not None else {},
        "train_metadata": None,
        "session_id": session_id,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0},
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
    }


def _torch():
    import torch

    return torch


def as_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample with its token-level lists as tensors (as train-side code and custom writers store them)."""
    torch = _torch()
    kinds = {"tokens": torch.long, "loss_mask": torch.int, "rollout_log_probs": torch.float32}
    return {k: torch.tensor(v, dtype=kinds[k]) if k in kinds and isinstance(v, list) else v for k, v in sample.items()}


def write_slime_rollout(path: Path, rollout_id: int, samples: list[dict[str, Any]], *, miles: bool = False) -> Path:
    """slime `save_debug_rollout_data`: `{rollout_id, samples}` (miles adds `metadata`)."""
    payload: dict[str, Any] = {"rollout_id": rollout_id, "samples": samples}
    if miles:
        payload["metadata"] = {}
    path.parent.mkdir(parents=True, exist_ok=True)
    _torch().save(payload, path)
    return path


def write_slime_train(path: Path, rollout_id: int, samples: list[dict[str, Any]], log_probs: list[list[float]]) -> Path:
    """slime `save_debug_train_data` (format_version 2): one dict per trained sample, in rollout
    order, with `rollout_position`, `sample_index`, tokens and the trainer's `log_probs` as tensors."""
    torch = _torch()
    rows = [
        {
            "data_parallel_rank": 0,
            "sample_index": sample["index"],
            "rollout_position": position,
            "tokens": torch.tensor(sample["tokens"], dtype=torch.long),
            "total_lengths": len(sample["tokens"]),
            "response_lengths": sample["response_length"],
            "loss_masks": torch.tensor(sample["loss_mask"] or [1] * sample["response_length"], dtype=torch.int),
            "log_probs": torch.tensor(values, dtype=torch.float32),
            "advantages": torch.zeros(len(values)),
        }
        for position, (sample, values) in enumerate(zip(samples, log_probs, strict=True))
    ]
    payload = {"format_version": 2, "rollout_id": rollout_id, "rank": 0, "samples": rows, "dp_shards": []}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def write_miles_train(
    path: Path, rollout_id: int, samples: list[dict[str, Any]], log_probs: list[list[float]], *, cp_size: int = 1
) -> Path:
    """miles `save_debug_train_data_for_rank`: one rank's columns under `rollout_data`."""
    torch = _torch()
    columns = {
        "tokens": [torch.tensor(s["tokens"], dtype=torch.long) for s in samples],
        "response_lengths": [s["response_length"] for s in samples],
        "total_lengths": [len(s["tokens"]) for s in samples],
        "sample_indices": [s["index"] for s in samples],
        "loss_masks": [torch.tensor(s["loss_mask"], dtype=torch.int) for s in samples],
        "log_probs": [torch.tensor(v, dtype=torch.float32) for v in log_probs],
        "rewards": [1.0 for _ in samples],
    }
    payload = {
        "rollout_id": rollout_id,
        "rank": 0,
        "rollout_data": columns,
        "cp_rank": 0,
        "cp_size": cp_size,
        "qkv_format": "thd",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def write_miles_dump(
    root: Path,
    rollout_id: int,
    samples: list[dict[str, Any]],
    *,
    log_probs: list[list[float]] | None = None,
    with_pt: bool = True,
    messages: bool = True,
) -> Path:
    """miles `--dump-details DIR` for one rollout: `rollout_data/{id}.pt`, `dashboard_columns/
    rollout_{id}.parquet`, `trajectory/{id}.jsonl` (samples with `metadata["messages"]`, which miles
    moves out of the .pt) and, with `log_probs`, `train_data/{id}_0.pt`."""
    (root / "dashboard_columns").mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "sample_index": s["index"],
            "response_length": s["response_length"],
            "total_length": len(s["tokens"]),
            "tokens": s["tokens"],
            "loss_mask": s["loss_mask"],
            "rollout_log_probs": s["rollout_log_probs"],
        }
        for s in samples
    ]
    schema = pa.schema(
        [
            ("sample_index", pa.int32()),
            ("response_length", pa.int32()),
            ("total_length", pa.int32()),
            ("tokens", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("rollout_log_probs", pa.list_(pa.float32())),
        ]
    )
    pq.write_table(
        pa.Table.from_pylist(rows, schema=schema),
        root / "dashboard_columns" / f"rollout_{rollout_id}.parquet",
        row_group_size=8,
    )
    if messages:
        (root / "trajectory").mkdir(exist_ok=True)
        lines = [
            {
                "sample_index": s["index"],
                "group_index": s["group_index"],
                "status": s["status"],
                "reward": s["reward"],
                "prompt": s["prompt"],
                "messages": [{"role": "user", "content": "task"}, {"role": "assistant", "content": "done"}],
            }
            for s in samples
        ]
        text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        (root / "trajectory" / f"{rollout_id}.jsonl").write_text(text)
    if with_pt:
        write_slime_rollout(root / "rollout_data" / f"{rollout_id}.pt", rollout_id, samples, miles=True)
    if log_probs is not None:
        write_miles_train(root / "train_data" / f"{rollout_id}_0.pt", rollout_id, samples, log_probs)
    return root


def prime_rl_record(
    tokens: list[int],
    loss_mask: list[bool],
    *,
    inference_logprobs: list[Any] | None = None,
    trainer_logprobs: list[Any] | None = None,
    env_name: str = "swe",
    sequence: int = 0,
) -> dict[str, Any]:
    """One token-export line (schema_version 1): every column over the whole sequence; logprobs
    default to -0.25 (inference) and -0.3 (trainer) on trained tokens, 0 elsewhere."""
    n = len(tokens)
    inference = inference_logprobs if inference_logprobs is not None else [-0.25 if m else 0.0 for m in loss_mask]
    trainer = trainer_logprobs if trainer_logprobs is not None else [-0.3 if m else -1.0 for m in loss_mask]
    return {
        "schema_version": 1,
        "step": 0,  # write_prime_rl_exports sets the folder's step and rank
        "rank": 0,
        "micro_step": 0,
        "micro_sequence_idx": sequence,
        "export_sequence_idx": sequence,
        "env_name": env_name,
        "token_ids": tokens,
        "position_ids": list(range(n)),
        "loss_mask": loss_mask,
        "advantages": [0.5] * n,
        "inference_logprobs": inference,
        "trainer_logprobs": trainer,
        "entropy": [0.1] * n,
        "mismatch_kl": [0.0] * n,
        "log_importance_ratio": [0.0] * n,
        "importance_ratio": [1.0] * n,
        "prob_delta": [0.0] * n,
        "is_masked": [False] * n,
        "is_masked_high": [False] * n,
        "is_masked_low": [False] * n,
        "rl_weights": [None] * n,
        "ce_weights": [None] * n,
        "ref_kl_weights": [None] * n,
    }


def write_prime_rl_exports(root: Path, step: int, records: list[Any], *, rank: int = 0) -> Path:
    """prime-rl's TokenExporter: `token_exports/step_<s>/rank_<r>.jsonl` (a record may be a str, written as is)."""
    folder = root / "token_exports" / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        r if isinstance(r, str) else json.dumps({**r, "step": step, "rank": rank}, separators=(",", ":"))
        for r in records
    ]
    (folder / f"rank_{rank}.jsonl").write_text("".join(line + "\n" for line in lines))
    (folder / "STABLE").touch()
    return folder / f"rank_{rank}.jsonl"


def write_pickled_class_pt(path: Path) -> Path:
    """A rollout dump whose sample holds a pickled custom class."""
    sample = spec([1, 2, 3, 4], 2)
    sample["metadata"] = {"thing": CustomThing(3)}
    return write_slime_rollout(path, 0, [sample])
