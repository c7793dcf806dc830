"""The driver's peak memory against the size of a run (issue 39): it must not grow with the turns.

    python benchmarks/bench_end_memory.py                          # 1,000 and 4,000 sessions
    python benchmarks/bench_end_memory.py --sessions 200 800 --max-turns 4 --workers 2

For each session count: `trace-tools simulate --sessions N --max-turns T --steps S` writes a dump,
`trace-tools replay DUMP --workers W` replays it through every strategy with samples written, then
`trace-tools report RUN --html` rebuilds report.md, the plots and report.html. Each command runs in
its own process, whose resident memory (the driver's only: replay's worker processes are not
counted) is sampled every 20 ms; the table gives each command's peak, the turns and table rows of
the run, and the growth of the larger peak between the smallest and the largest run (the target:
at most 10 %, and under 1 GiB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SAMPLE_EVERY_S = 0.02


def peak_rss(command: list[str]) -> tuple[int, float]:
    """Run `command`; its own peak resident memory (bytes, sampled) and wall seconds."""
    import psutil

    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watched, peak = psutil.Process(process.pid), [0]

    def sample() -> None:
        while process.poll() is None:
            try:
                peak[0] = max(peak[0], watched.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(SAMPLE_EVERY_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, errors = process.communicate()
    sampler.join()
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{errors[-3000:]}")
    return peak[0], time.perf_counter() - started


def measure(sessions: int, args: argparse.Namespace, scratch: Path) -> dict:
    import pyarrow.parquet as pq

    tool = [sys.executable, "-c", "from trace_tools.cli.main import main; main()"]
    dump, run = scratch / f"sim-{sessions}.parquet", scratch / f"run-{sessions}"
    simulate = [*tool, "simulate", "--sessions", str(sessions), "--seed", "3", "--out", str(dump)]
    simulate += ["--max-turns", str(args.max_turns), "--steps", str(args.steps)]
    subprocess.run(simulate, check=True, stdout=subprocess.DEVNULL)
    replay_rss, replay_s = peak_rss([*tool, "replay", str(dump), "--out", str(run), "--workers", str(args.workers)])
    report_rss, report_s = peak_rss([*tool, "report", str(run), "--html"])
    summary = json.loads((run / "summary.json").read_text())
    return {
        "sessions": sessions,
        "turns": summary["turns_total"],
        "turn_rows": pq.ParquetFile(run / "turns.parquet").metadata.num_rows,
        "strategies": len(summary["strategies"]),
        "replay_rss": replay_rss,
        "replay_s": replay_s,
        "report_rss": report_rss,
        "report_s": report_s,
    }


def table(rows: list[dict]) -> str:
    mib = 2**20
    lines = [
        "| sessions | turns | turn rows | strategies | replay peak RSS | replay wall | report --html peak RSS | report wall |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['sessions']:,} | {r['turns']:,} | {r['turn_rows']:,} | {r['strategies']} | "
            f"{r['replay_rss'] / mib:.0f} MiB | {r['replay_s']:.0f} s | {r['report_rss'] / mib:.0f} MiB | {r['report_s']:.0f} s |"
        )
    first, last = (max(r["replay_rss"], r["report_rss"]) for r in (rows[0], rows[-1]))
    lines.append(f"\nDriver peak: {first / mib:.0f} MiB → {last / mib:.0f} MiB ({last / first - 1:+.1%}).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--max-turns", type=int, default=4, help="most model turns a session (short: a quick run)")
    parser.add_argument("--steps", type=int, default=8, help="training steps the sessions spread over (by_step)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="write the dumps and runs here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-end-memory-") as tmp:
        scratch = args.keep or Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        rows = []
        for sessions in args.sessions:
            rows.append(measure(sessions, args, scratch))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
