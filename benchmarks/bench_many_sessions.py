"""Peak memory and shard files of a replay of many one-turn sessions, at several dump sizes.

    python benchmarks/bench_many_sessions.py                      # 25,000 / 50,000 / 100,000 sessions
    python benchmarks/bench_many_sessions.py --sessions 2000 8000 # a quick look

Each dump is N qwen3 sessions of one short turn (`tests/run_support.one_turn_dump`, cached under
`$TRACE_TOOLS_CACHE/bench/`); each replay (`-s tree --workers 1`, a fresh run directory) runs in a
subprocess whose process tree's resident memory is sampled every 50 ms. Memory that stays flat as
N grows is the claim (issue 21: shards sized by rows and bytes, merged streaming); the shard
files and the seconds per 1,000 sessions are printed beside it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dump_of(sessions: int) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from run_support import one_turn_dump
    from trace_tools.io.cache import CacheKey

    path = CacheKey("bench", f"one-turn-{sessions}").path(".parquet")  # a name `cache clear` knows as its own
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        one_turn_dump(path, sessions)
    return path


def measure(dump: Path, out: Path) -> tuple[float, int]:
    """(seconds, peak RSS in bytes of the whole process tree) of one replay."""
    import psutil

    command = [
        sys.executable,
        "-m",
        "trace_tools.cli.main",
        "replay",
        str(dump),
        "-s",
        "tree",
        "--workers",
        "1",
        "--out",
        str(out),
        "--json",
    ]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    root, peak = psutil.Process(process.pid), 0
    while process.poll() is None:
        try:
            peak = max(peak, sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]))
        except psutil.Error:
            pass
        time.sleep(0.05)
    if process.returncode:
        raise SystemExit(process.stderr.read().decode()[-2000:] if process.stderr else "replay failed")
    return time.perf_counter() - started, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[25_000, 50_000, 100_000])
    args = parser.parse_args()
    print("| sessions | shard files | peak RSS | s per 1,000 sessions |")
    print("|---:|---:|---:|---:|")
    for sessions in args.sessions:
        dump = dump_of(sessions)
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "run"
            seconds, peak = measure(dump, out)
            files = sum(1 for _ in (out / "shards").iterdir())
        print(f"| {sessions:,} | {files} | {peak / 2**30:.2f} GiB | {seconds / sessions * 1000:.2f} |", flush=True)


if __name__ == "__main__":
    main()
