"""Reading a multi-GB slime sample dump: tokens per second and peak memory of `read_samples`.

    python benchmarks/bench_trainer_read.py               # a 2 GiB dump of 64 MiB rollout files
    python benchmarks/bench_trainer_read.py --gib 0.1     # a quick look

The dump is slime's `rollout_data/{id}.pt` (`{rollout_id, samples: [Sample.to_dict()]}`, token ids,
loss masks and logprobs as Python lists, as slime saves them), agent-shaped samples of
`PROMPT` + `RESPONSE` tokens with a multi-turn loss mask, written once into the `bench` cache
(`$TRACE_TOOLS_CACHE/bench/`). Three reads run, each in its own process, peak RSS from
`tests/io_support.measured`:

- `stream`: `read_samples` over the whole dump (every check, a vocabulary bound), counting tokens;
- `stream-subset` and `naive-subset`: the first `--baseline-mib` of files, read by `read_samples`
  and naively (`torch.load(weights_only=True)` of every file into one list first, then counted;
  no checks). The naive read is not run on the whole dump: it holds every file's objects at once,
  about 7x the dump's size, more than the machine has.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

PROMPT, RESPONSE, VOCAB = 4096, 12288, 151_936
TURNS = 6  # assistant spans in a response; the tool output between them is not trained


def dump_dir(gib: float, file_mib: int) -> Path:
    """The cached dump of `gib` GiB in files of about `file_mib` MiB (written on first use)."""
    from trace_tools.io.cache import CacheKey

    folder = CacheKey("bench", f"slime-rollouts-{gib}g", (file_mib, PROMPT, RESPONSE, TURNS)).path()
    if not (folder / "DONE").exists():
        write_dump(folder, int(gib * 2**30), file_mib * 2**20)
        (folder / "DONE").touch()
    return folder


def write_dump(folder: Path, total_bytes: int, file_bytes: int) -> None:
    import numpy as np

    from trainer_fixtures import spec, write_slime_rollout

    rng = np.random.default_rng(32)
    span = RESPONSE // (2 * TURNS)
    mask = ([1] * span + [0] * span) * TURNS
    per_sample = PROMPT * 4 + RESPONSE * 15  # pickled bytes: ~4 per id, +2 per mask value, +9 per logprob
    written, rollout_id, index = 0, 0, 0
    while written < total_bytes:
        samples = []
        for _ in range(max(1, file_bytes // per_sample)):
            tokens = rng.integers(0, VOCAB, PROMPT + RESPONSE).tolist()
            logprobs = (-rng.exponential(0.3, RESPONSE)).tolist()
            # eight samples a prompt group; each agent run (rollout_id) split into two samples
            samples.append(
                spec(
                    tokens,
                    RESPONSE,
                    loss_mask=mask,
                    rollout_log_probs=logprobs,
                    index=index,
                    group_index=index // 8,
                    rollout_id=index // 2,
                )
            )
            index += 1
        path = write_slime_rollout(folder / "rollout_data" / f"{rollout_id}.pt", rollout_id, samples)
        written += path.stat().st_size
        rollout_id += 1
        print(f"  wrote {path.name}: {written / 2**30:.2f} GiB", file=sys.stderr, flush=True)


def child(mode: str, folder: Path, mib: float, out: Path) -> None:
    """One read, its counts written to `out` (the launcher measures this process's peak RSS)."""
    files = sorted((folder / "rollout_data").glob("*.pt"), key=lambda p: int(p.stem))
    if mode != "stream":
        files = _first_mib(files, mib)
    import resource

    import torch

    from trace_tools.trainer.read import ReadReport, read_samples

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # interpreter, torch, trace_tools
    started = time.perf_counter()
    if mode == "naive-subset":
        samples = [s for f in files for s in torch.load(f, weights_only=True)["samples"]]
        tokens = sum(len(s["tokens"]) for s in samples)
        count, quarantined = len(samples), 0
    else:
        report = ReadReport()
        tokens = count = 0
        for sample in read_samples(files, vocab_size=VOCAB, report=report):
            tokens += len(sample.tokens)
            count += 1
        quarantined = report.quarantined
    seconds = time.perf_counter() - started
    size = sum(f.stat().st_size for f in files)
    out.write_text(
        json.dumps(
            dict(
                mode=mode,
                files=len(files),
                bytes=size,
                samples=count,
                tokens=tokens,
                seconds=seconds,
                quarantined=quarantined,
                before=before,
            )
        )
    )


def _first_mib(files: list[Path], mib: float) -> list[Path]:
    chosen, size = [], 0
    for path in files:
        if chosen and size + path.stat().st_size > mib * 2**20:
            break
        chosen.append(path)
        size += path.stat().st_size
    return chosen


def measure(mode: str, folder: Path, mib: float) -> dict:
    from io_support import measured

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        command = measured([sys.executable, __file__, "--child", mode, str(folder), str(mib), str(out)])
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        code, peak_kib = (int(v) for v in done.stdout.split())
        if code:
            raise SystemExit(f"{mode} read failed:\n{done.stderr[-2000:]}")
        return json.loads(out.read_text()) | {"peak_rss": peak_kib * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.0, help="dump size (GiB)")
    parser.add_argument("--file-mib", type=int, default=64, help="size of one rollout file (MiB)")
    parser.add_argument("--baseline-mib", type=float, default=256, help="how much the naive baseline reads (MiB)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, folder, mib, out = args.child
        child(mode, Path(folder), float(mib), Path(out))
        return
    folder = dump_dir(args.gib, args.file_mib)
    print("| read | files | dump | samples | tokens | s | tokens/s | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for mode in ("stream", "stream-subset", "naive-subset"):
        row = rows[mode] = measure(mode, folder, args.baseline_mib)
        print(
            f"| {mode} | {row['files']} | {row['bytes'] / 2**30:.2f} GiB | {row['samples']:,} | {row['tokens']:,} | "
            f"{row['seconds']:.1f} | {row['tokens'] / row['seconds']:,.0f} | {row['peak_rss'] / 2**30:.2f} GiB |",
            flush=True,
        )
    stream, naive, subset = rows["stream"], rows["naive-subset"], rows["stream-subset"]
    growth = (naive["peak_rss"] - naive["before"]) / naive["bytes"]
    # on the same files, read one after the other: the fairest pair on a machine shared with other work
    speed = (subset["tokens"] / subset["seconds"]) / (naive["tokens"] / naive["seconds"])
    print(
        f"\nstreaming vs naive on the same files: {speed:.2f}x the tokens/s; peak RSS {subset['peak_rss'] / 2**20:,.0f} MiB vs "
        f"{naive['peak_rss'] / 2**20:,.0f} MiB on the same {naive['bytes'] / 2**20:,.0f} MiB "
        f"(naive holds ~{growth:.1f} bytes per dump byte beyond its imports: "
        f"~{growth * stream['bytes'] / 2**30:.1f} GiB for the whole dump); "
        f"full dump {stream['peak_rss'] / 2**30:.2f} GiB, quarantined {stream['quarantined']}"
    )


if __name__ == "__main__":
    main()
