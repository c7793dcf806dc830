#!/usr/bin/env python
"""Benchmark `rescore --samples` scoring against scoring each sample naively, in the same run.

Ours:  `trace_tools.rescore.samples.score_samples` -- every sample of a session planned together
       (prefix sharing across the strategy's samples and across strategies that emit the same
       sequence), length-bucketed batches, the output head over chunks of the trained positions.
Naive: per sample, `model(ids).logits` -> `.float().log_softmax(-1)` -> `gather` over the sequence
       up to its last trained token (`trace_tools.rescore.scoring.naive_logprobs`).

Reports samples scored per second and peak memory of both (on CUDA `max_memory_allocated`, weights
included; on the CPU the growth of the resident set), their ratios, and the largest difference
between the two on the trained tokens (they must agree: same model, same contexts).

Input: a replay run directory (`--run`), or by default one built here from a simulated dump
(`--sessions`, `--profile`, strategies `--strategy`).

Examples:
    python benchmarks/bench_sample_scoring.py                                   # CPU, tiny-qwen3
    python benchmarks/bench_sample_scoring.py --sessions 8 --profile swe-long --device cuda
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_rescore import measure  # noqa: E402 (run as a script: benchmarks/ is on sys.path)

from trace_tools.rescore.models import load_model
from trace_tools.rescore.samples import load_samples, sample_inputs, score_samples
from trace_tools.rescore.scoring import naive_logprobs

DEFAULT_STRATEGIES = ["tree", "linear", "chains", "session-v2", "checkpoint-tree"]


def build_run(root: Path, args: argparse.Namespace) -> Path:
    from trace_tools.api import replay
    from trace_tools.simulate import simulate

    dump = root / "sim.parquet"
    simulate(
        args.sessions, seed=args.seed, template="qwen3", out=str(dump), profile=args.profile, max_turns=args.max_turns
    )
    replay(dump, out=root / "run", strategies=args.strategy, workers=1)
    return root / "run"


def naive_scores(model: Any, samples: Any) -> list[np.ndarray]:
    """Per sample, the naive recipe's logprobs over its response region (NaN before the first trained token)."""
    out = []
    for row, turn in zip(samples.itertuples(index=False), sample_inputs(samples, model.vocab_size)):
        length = int(row.response_length)
        full = np.full(length, np.nan)
        if turn.skip_reason is None:
            values = naive_logprobs(model, turn.sequence)[len(turn.prompt_ids or []) - 1 :]
            offset = len(turn.prompt_ids or []) - (len(row.token_ids) - length)
            full[offset : offset + len(values)] = values
        out.append(full)
    return out


def largest_difference(samples: Any, ours: list[np.ndarray], naive: list[np.ndarray]) -> float:
    worst = 0.0
    for row, a, b in zip(samples.itertuples(index=False), ours, naive):
        trained = np.asarray(row.loss_mask, dtype=np.int8) == 1
        if trained.any():
            worst = max(worst, float(np.nanmax(np.abs(a[trained] - b[trained]))))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="A replay run directory (default: build one from a simulated dump).")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", default="swe", help="Simulator profile: swe | swe-long.")
    parser.add_argument("--max-turns", type=int, help="Most model turns of a simulated session.")
    parser.add_argument("--strategy", action="append", help="Strategies to replay and score (repeatable).")
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--warmup", type=int, default=0, help="Untimed runs first (1 on a GPU: kernels, allocator).")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
    args = parser.parse_args()
    args.strategy = args.strategy or DEFAULT_STRATEGIES

    with tempfile.TemporaryDirectory(prefix="bench-samples-") as scratch:
        run = args.run or build_run(Path(scratch), args)
        samples = load_samples(run, None if args.run else args.strategy)
        model = load_model(args.model, args.device, args.dtype)
        ours_s, ours_bytes, (ours, throughput) = measure(
            lambda: score_samples(model, samples), model.device, args.warmup, args.repeats
        )
        naive_s, naive_bytes, naive = measure(
            lambda: naive_scores(model, samples), model.device, args.warmup, args.repeats
        )
    trained = int(sum(int(np.sum(np.asarray(m) == 1)) for m in samples["loss_mask"]))
    result = {
        "model": model.name,
        "device": str(model.device),
        "dtype": str(model.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "samples": len(samples),
        "trained_tokens": trained,
        "forwarded_tokens": {"ours": throughput["forwarded_tokens"], "naive": throughput["turn_sequence_tokens"]},
        "samples_per_s": {"ours": len(samples) / ours_s, "naive": len(samples) / naive_s},
        "peak_mib": {"ours": ours_bytes / 2**20, "naive": naive_bytes / 2**20},
        "speedup": naive_s / ours_s,
        "memory_ratio": (naive_bytes / ours_bytes) if ours_bytes > 0 else None,
        "max_abs_difference": largest_difference(samples, ours, naive),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{result['samples']} samples, {trained} trained tokens, {model.name} on {result['device']} ({result['dtype']})"
    )
    print(
        f"forwarded tokens: ours {result['forwarded_tokens']['ours']:,}, naive {result['forwarded_tokens']['naive']:,}"
    )
    for name in ("ours", "naive"):
        print(f"{name:>5}: {result['samples_per_s'][name]:8.2f} samples/s, peak {result['peak_mib'][name]:9.1f} MiB")
    ratio = result["memory_ratio"]
    print(f"ratios: {result['speedup']:.2f}x samples/s, {ratio:.2f}x less peak memory" if ratio else "")
    print(f"max |ours - naive| on trained tokens: {result['max_abs_difference']:.2e}")


if __name__ == "__main__":
    main()
