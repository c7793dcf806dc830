#!/usr/bin/env python
"""Benchmark trace-tools' rescoring against the naive recipe, in the same run.

Ours:  `trace_tools.rescore.scoring.score_requests` -- base model once per length-bucketed batch,
       then the output head + float32 log-normaliser over chunks of positions.
Naive: `model(ids).logits` -> `.float().log_softmax(-1)` -> `gather`, one sequence at a time
       (`trace_tools.rescore.scoring.naive_logprobs`).

Two scenarios:
* `sequence`: S random sequences of L tokens, every position scored (the kernel-level comparison;
  model FLOP utilisation is reported here).
* `session`: one append-only agent session of T turns whose last turn is L tokens long; each turn
  scores its own output (the last quarter of its new tokens). Ours plans it with prefix sharing
  (one forward of L tokens); the naive recipe runs every turn's full prompt + output.

Model FLOPs (docs/rescore.md#benchmark) = 2 * matmul parameters * tokens + causal attention, 2 * layers * heads *
head_dim * L per token. Matmul parameters exclude an untied input embedding (a lookup, no FLOPs);
with tied embeddings the shared matrix counts once, as the output head. MFU = achieved FLOP/s
over the peak (790 TFLOP/s bf16 for one H200 by default; none on CPU unless --peak-tflops).

Peak memory: on CUDA `torch.cuda.max_memory_allocated()` (weights included); on the CPU the
growth of the resident set over the run, sampled every 2 ms (weights already resident).

Examples:
    python benchmarks/bench_rescore.py                    # CPU: tiny Qwen3-shaped model, 512 and 2048 tokens
    python benchmarks/bench_rescore.py --preset qwen3-0.6b --lengths 8192 32768 --check   # one H200
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import torch

from trace_tools.rescore import plan
from trace_tools.rescore.models import ScoringModel, resolve_device, resolve_dtype
from trace_tools.rescore.scoring import (
    DEFAULT_CHUNK_POSITIONS,
    ScoreRequest,
    naive_logprobs,
    score_requests,
)

H200_BF16_TFLOPS = 790.0
QWEN_VOCAB = 151936
PRESETS: dict[str, dict[str, Any]] = {
    # A few-layer Qwen3 shape with the real vocabulary: the output head dominates, as in small models.
    "tiny": dict(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
    "qwen3-0.6b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
    ),
}
# GPU targets (docs/rescore.md#benchmark): MFU, speed vs naive, naive/ours peak memory at the longest length.
TARGET_MFU, TARGET_SPEEDUP, TARGET_MEMORY_RATIO = 0.40, 1.0, 4.0


@dataclass
class Measurement:
    scenario: str
    recipe: str
    length: int
    tokens: int
    seconds: float
    tokens_per_s: float
    peak_bytes: int | None
    model_tflops: float | None
    mfu: float | None
    max_abs_diff_vs_naive: float | None = None
    skipped: str | None = None


# -- model --------------------------------------------------------------------------------------------
def build_model(preset: str, device: torch.device, dtype: torch.dtype, attn: str, seed: int) -> ScoringModel:
    """A randomly initialised Qwen3-shaped model of the preset (built on the CPU, then moved)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=QWEN_VOCAB, tie_word_embeddings=True, max_position_embeddings=40960, **PRESETS[preset]
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype)
    model = model.to(device=device, dtype=dtype).eval()
    return ScoringModel(model, f"random {preset}", device, dtype, None)


def matmul_parameters(model: Any) -> int:
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    tied = embedding.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    return total if tied else total - embedding.numel()


def model_flops(model: Any, lengths: list[int]) -> float:
    """Model FLOPs (docs/rescore.md#benchmark) for forwarding sequences of `lengths` tokens."""
    config = model.config
    params = matmul_parameters(model)
    attention = 2 * config.num_hidden_layers * config.num_attention_heads * config.head_dim
    return float(sum(2 * params * n + attention * n * n for n in lengths))


# -- measuring ----------------------------------------------------------------------------------------
class PeakRSS:
    """Peak resident-set growth of this process while the block runs (CPU runs; Linux /proc)."""

    def __enter__(self) -> "PeakRSS":
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def growth(self) -> int:
        return self.peak - self.base


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(run: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> tuple[float, int, Any]:
    """(median wall time of `repeats` runs after `warmup` runs, peak memory over the timed runs, last result)."""
    result = None
    for _ in range(warmup):
        result = run()
    _sync(device)
    times = []
    with PeakMemory(device) as meter:
        for _ in range(repeats):
            start = time.perf_counter()
            result = run()
            _sync(device)
            times.append(time.perf_counter() - start)
    return statistics.median(times), meter.peak_bytes, result


class PeakMemory:
    """CUDA: `max_memory_allocated` over the block (weights included). CPU: `PeakRSS` growth."""

    def __init__(self, device: torch.device):
        self.device, self.peak_bytes, self._rss = device, 0, None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._rss = PeakRSS().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            _sync(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self._rss.__exit__(*exc)
            self.peak_bytes = self._rss.growth


def naive_bytes(model: ScoringModel, length: int) -> int:
    """The naive recipe's vocabulary-sized tensors: logits (model dtype) + float32 copy + log-softmax."""
    element = torch.finfo(model.dtype).bits // 8
    return length * model.vocab_size * (element + 4 + 4)


def naive_fits(model: ScoringModel, length: int) -> str | None:
    """None when the naive recipe should fit in memory, else why it is skipped."""
    need = naive_bytes(model, length)
    if model.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(model.device)
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > 0.8 * free:
        return f"needs ~{need / 2**30:.1f} GiB for [L, V] tensors, {free / 2**30:.1f} GiB free"
    return None


# -- scenarios ----------------------------------------------------------------------------------------
def sequence_scenario(model: ScoringModel, length: int, args: argparse.Namespace) -> list[Measurement]:
    rng = np.random.default_rng(length)
    sequences = [rng.integers(0, model.vocab_size, size=length).tolist() for _ in range(args.sequences)]
    requests = [ScoreRequest(s, np.arange(1, length)) for s in sequences]
    flops = model_flops(model.model, [length] * len(sequences))

    def ours():
        return score_requests(
            model, requests, max_batch_tokens=args.max_batch_tokens, chunk_positions=args.chunk_positions
        )

    def naive():
        return [naive_logprobs(model, s) for s in sequences]

    return _compare("sequence", model, length, length * len(sequences), flops, ours, naive, args)


def session_plans(length: int, turns: int, vocab: int) -> tuple[list[int], list[plan.TurnInput]]:
    """An append-only session: turn k ends at k/T of the sequence; its output is the last quarter of its new tokens."""
    rng = np.random.default_rng(turns * 1000 + length)
    ids = rng.integers(0, vocab, size=length).tolist()
    inputs = []
    for k in range(1, turns + 1):
        end, start = length * k // turns, length * (k - 1) // turns
        output_start = end - max(1, (end - start) // 4)
        inputs.append(
            plan.TurnInput(
                "bench", k - 1, ids[output_start:end], [0.0] * (end - output_start), ids[:output_start], "recorded"
            )
        )
    return ids, inputs


def session_scenario(model: ScoringModel, length: int, args: argparse.Namespace) -> list[Measurement]:
    _, inputs = session_plans(length, args.turns, model.vocab_size)
    plans = plan.plan_sequences(inputs)
    requests = [ScoreRequest(p.ids, p.positions()) for p in plans]
    turn_lengths = [len(t.sequence) for t in inputs]

    def ours():
        scores = score_requests(
            model, requests, max_batch_tokens=args.max_batch_tokens, chunk_positions=args.chunk_positions
        )
        return plan.read_spans(plans, scores, len(inputs))

    def naive():
        return [naive_logprobs(model, t.sequence)[-len(t.output_ids) :] for t in inputs]

    scored = sum(len(t.output_ids) for t in inputs)
    return _compare("session", model, length, scored, None, ours, naive, args, naive_length=max(turn_lengths))


def _compare(
    scenario: str,
    model: ScoringModel,
    length: int,
    tokens: int,
    flops: float | None,
    ours: Callable[[], Any],
    naive: Callable[[], Any],
    args: argparse.Namespace,
    naive_length: int | None = None,
) -> list[Measurement]:
    results = []
    ours_time, ours_peak, ours_values = measure(ours, model.device, args.warmup, args.repeats)
    results.append(_measurement(scenario, "ours", length, tokens, ours_time, ours_peak, flops, args))
    reason = "--no-naive" if args.no_naive else naive_fits(model, naive_length or length)
    if reason:
        results.append(
            Measurement(scenario, "naive", length, tokens, float("nan"), float("nan"), None, None, None, skipped=reason)
        )
        return results
    naive_time, naive_peak, naive_values = measure(naive, model.device, args.warmup, args.repeats)
    results.append(_measurement(scenario, "naive", length, tokens, naive_time, naive_peak, flops, args))
    results[0].max_abs_diff_vs_naive = float(max(np.max(np.abs(a - b)) for a, b in zip(ours_values, naive_values)))
    return results


def _measurement(
    scenario: str,
    recipe: str,
    length: int,
    tokens: int,
    seconds: float,
    peak: int,
    flops: float | None,
    args: argparse.Namespace,
) -> Measurement:
    achieved = flops / seconds / 1e12 if flops else None
    mfu = achieved / args.peak_tflops if achieved and args.peak_tflops else None
    return Measurement(scenario, recipe, length, tokens, seconds, tokens / seconds, peak, achieved, mfu)


# -- report -------------------------------------------------------------------------------------------
def print_header(model: ScoringModel, args: argparse.Namespace) -> None:
    import transformers

    device = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else platform.processor() or "cpu"
    print(
        f"rescore benchmark: preset {args.preset}, {matmul_parameters(model.model) / 1e6:.1f}M matmul parameters, "
        f"vocab {model.vocab_size}, {model.dtype}, attention {args.attn}"
    )
    print(
        f"device {model.device} ({device}), torch {torch.__version__}, transformers {transformers.__version__}, "
        f"threads {torch.get_num_threads()}, chunk {args.chunk_positions} positions, "
        f"max batch {args.max_batch_tokens} tokens, peak {args.peak_tflops or 'n/a'} TFLOP/s"
    )


def print_rows(rows: list[Measurement]) -> None:
    print(
        f"{'scenario':9} {'recipe':6} {'L':>6} {'tokens':>7} {'seconds':>9} {'tokens/s':>11} {'peak MiB':>10} "
        f"{'TFLOP/s':>8} {'MFU':>6} {'max|ours-naive|':>15}"
    )
    for r in rows:
        if r.skipped:
            print(f"{r.scenario:9} {r.recipe:6} {r.length:>6} {'':>7} skipped: {r.skipped}")
            continue
        print(
            f"{r.scenario:9} {r.recipe:6} {r.length:>6} {r.tokens:>7} {r.seconds:>9.4f} {r.tokens_per_s:>11,.0f} "
            f"{_mib(r.peak_bytes):>10} {_opt(r.model_tflops, '.2f'):>8} {_opt(r.mfu, '.1%'):>6} "
            f"{_opt(r.max_abs_diff_vs_naive, '.2e'):>15}"
        )


def ratios(rows: list[Measurement]) -> list[dict[str, Any]]:
    """Per scenario and length: naive time / ours time and naive peak / ours peak."""
    out = []
    by_key = {(r.scenario, r.length, r.recipe): r for r in rows}
    for (scenario, length, recipe), ours in by_key.items():
        naive = by_key.get((scenario, length, "naive"))
        if recipe != "ours" or naive is None or naive.skipped:
            continue
        memory = naive.peak_bytes / ours.peak_bytes if ours.peak_bytes and naive.peak_bytes else None
        out.append(
            {
                "scenario": scenario,
                "length": length,
                "speedup": naive.seconds / ours.seconds,
                "memory_ratio": memory,
                "mfu": ours.mfu,
            }
        )
    return out


def print_ratios(found: list[dict[str, Any]]) -> None:
    for r in found:
        print(
            f"{r['scenario']:9} L={r['length']:>6}: ours is {r['speedup']:.2f}x the naive speed, "
            f"naive peak memory / ours = {_opt(r['memory_ratio'], '.1f')}"
        )


def check_targets(rows: list[Measurement], found: list[dict[str, Any]]) -> list[str]:
    """The GPU targets of docs/rescore.md#benchmark that are not met (empty when all are)."""
    failures = []
    sequence = [r for r in rows if r.scenario == "sequence" and r.recipe == "ours"]
    for r in sequence:
        if r.mfu is None or r.mfu < TARGET_MFU:
            failures.append(f"MFU {_opt(r.mfu, '.1%')} < {TARGET_MFU:.0%} at L={r.length}")
    for r in found:
        if r["speedup"] < TARGET_SPEEDUP:
            failures.append(f"{r['scenario']} L={r['length']}: slower than naive ({r['speedup']:.2f}x)")
    longest = max((r for r in found if r["scenario"] == "sequence"), key=lambda r: r["length"], default=None)
    if longest is None:
        failures.append("no naive measurement to compare memory with")
    elif longest["memory_ratio"] is None or longest["memory_ratio"] < TARGET_MEMORY_RATIO:
        failures.append(
            f"naive/ours peak memory {_opt(longest['memory_ratio'], '.1f')} < {TARGET_MEMORY_RATIO:g} "
            f"at L={longest['length']}"
        )
    return failures


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def _opt(value: float | None, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


# -- main ---------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="model shape (default: qwen3-0.6b on cuda, tiny on cpu)"
    )
    parser.add_argument(
        "--lengths", type=int, nargs="+", help="tokens per sequence (default: 8192 32768 on cuda, 512 2048 on cpu)"
    )
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"))
    parser.add_argument("--attn", default="sdpa", help="attention implementation: sdpa | flash_attention_2 | eager")
    parser.add_argument("--scenario", default="both", choices=("sequence", "session", "both"))
    parser.add_argument("--sequences", type=int, default=1, help="sequences per length in the sequence scenario")
    parser.add_argument("--turns", type=int, default=8, help="turns of the session scenario")
    parser.add_argument("--max-batch-tokens", type=int, default=32768)
    parser.add_argument(
        "--chunk-positions",
        type=int,
        default=None,
        help="positions per head chunk (default: 4096 on cuda, 1024 on cpu)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed runs per measurement (default: 5 on cuda, 1 on cpu)"
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help=f"for MFU (default: {H200_BF16_TFLOPS:g} on cuda)"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the base model (both recipes)")
    parser.add_argument("--no-naive", action="store_true", help="measure ours only")
    parser.add_argument("--allow-large-cpu", action="store_true", help="allow lengths above 2048 on the CPU")
    parser.add_argument("--check", action="store_true", help="exit 1 when a GPU target of docs/rescore.md is missed")
    parser.add_argument("--json", dest="json_path", help="also write the measurements as JSON here")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def apply_device_defaults(args: argparse.Namespace, device: torch.device) -> None:
    gpu = device.type == "cuda"
    args.preset = args.preset or ("qwen3-0.6b" if gpu else "tiny")
    args.lengths = args.lengths or ([8192, 32768] if gpu else [512, 2048])
    args.chunk_positions = args.chunk_positions or (4096 if gpu else DEFAULT_CHUNK_POSITIONS)
    args.repeats = args.repeats or (5 if gpu else 1)
    args.peak_tflops = args.peak_tflops or (H200_BF16_TFLOPS if gpu else None)
    if not gpu and max(args.lengths) > 2048 and not args.allow_large_cpu:
        raise SystemExit(
            "on the CPU the benchmark runs at <= 2048 tokens (docs/rescore.md#benchmark); pass --allow-large-cpu to insist"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    apply_device_defaults(args, device)
    model = build_model(args.preset, device, resolve_dtype(args.dtype, device), args.attn, args.seed)
    if args.compile:
        model.model.model = torch.compile(model.model.model)
    print_header(model, args)
    rows: list[Measurement] = []
    scenarios = ("sequence", "session") if args.scenario == "both" else (args.scenario,)
    with torch.inference_mode():
        for length in args.lengths:
            for scenario in scenarios:
                run = sequence_scenario if scenario == "sequence" else session_scenario
                rows.extend(run(model, length, args))
    print_rows(rows)
    found = ratios(rows)
    print_ratios(found)
    failures = check_targets(rows, found) if device.type == "cuda" else []
    if device.type == "cuda":
        print("targets: " + ("all met" if not failures else "; ".join(failures)))
    else:
        print(
            "targets (MFU >= 40 %, >= naive speed, <= 1/4 naive memory at 32k) apply to a GPU run; "
            "this CPU run only shows the script works"
        )
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump(
                {"args": vars(args), "rows": [asdict(r) for r in rows], "ratios": found, "failures": failures},
                handle,
                indent=2,
                default=str,
            )
    return 1 if args.check and failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
