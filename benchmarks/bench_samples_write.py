"""What writing a replay's samples costs, against the plain way of each step, in the same run.

    python benchmarks/bench_samples_write.py                   # 10 swe-long sessions, all strategies
    python benchmarks/bench_samples_write.py --sessions 4 --rounds 5

The samples are the ones a `replay --workers 1` of every strategy hands to
`io.rundir.samples_table`, session by session (captured as the replay passes them, so their id
lists are the replay's own shared ints). Two steps are timed, each against its plain form, in
interleaved rounds (each step's fastest round kept), on this process's CPU clock:

- a session's rows to an Arrow table: `samples_table` against `pa.Table.from_pylist(rows,
  schema=SAMPLES_SCHEMA)`, the tables checked equal;
- the run's samples to a Parquet part: `SAMPLES_WRITE_OPTIONS` against the same options with
  min/max statistics on every column (Parquet's default).

Prints one Markdown table (docs/performance.md#smaller-measured-changes).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def captured_rows(dump: Path, scratch: Path) -> list[list[dict[str, Any]]]:
    """Each session's sample rows, as the replay passes them to `samples_table`."""
    from trace_tools.api import replay

    session = importlib.import_module("trace_tools.replay.session")
    convert, seen = session.samples_table, []

    def capture(rows: list[dict[str, Any]]) -> Any:
        seen.append(rows)
        return convert(rows)

    session.samples_table = capture
    try:
        replay(dump, out=scratch / "run", workers=1)
    finally:
        session.samples_table = convert
    return seen


def fastest(step: Callable[[], Any], best: float) -> tuple[float, Any]:
    started = time.process_time()
    result = step()
    return min(best, time.process_time() - started), result


def measure(rows: list[list[dict[str, Any]]], rounds: int, scratch: Path) -> dict[str, tuple[float, float, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trace_tools.io.rundir import SAMPLES_SCHEMA, SAMPLES_WRITE_OPTIONS, samples_table

    every_column = {**SAMPLES_WRITE_OPTIONS, "write_statistics": True}
    best = {"ours": float("inf"), "plain": float("inf"), "part": float("inf"), "part plain": float("inf")}
    for round_ in range(rounds):
        order = ["ours", "plain"] if round_ % 2 == 0 else ["plain", "ours"]
        tables: dict[str, list[pa.Table]] = {}
        for name in order:
            convert = samples_table if name == "ours" else lambda r: pa.Table.from_pylist(r, schema=SAMPLES_SCHEMA)
            best[name], tables[name] = fastest(lambda: [convert(session) for session in rows], best[name])
        assert all(a.equals(b) for a, b in zip(tables["ours"], tables["plain"])), "samples_table differs"
        table = pa.concat_tables(tables["ours"]).combine_chunks()
        for name in ("part", "part plain") if round_ % 2 == 0 else ("part plain", "part"):
            options = SAMPLES_WRITE_OPTIONS if name == "part" else every_column
            best[name], _ = fastest(lambda: pq.write_table(table, scratch / f"{name}.parquet", **options), best[name])
    sizes = {name: (scratch / f"{name}.parquet").stat().st_size / 2**20 for name in ("part", "part plain")}
    ids = sum(len(row["token_ids"]) for session in rows for row in session)
    return {
        f"rows to Arrow ({sum(map(len, rows))} samples, {ids / 1e6:.1f} M token ids)": (
            best["ours"],
            best["plain"],
            "`samples_table` / `Table.from_pylist`",
        ),
        f"Parquet part ({sizes['part']:.1f} MiB; {sizes['part plain']:.1f} MiB with every statistic)": (
            best["part"],
            best["part plain"],
            "statistics on one-value columns / on every column",
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from bench_replay import dumps

    from trace_tools.arrow_pool import prefer_jemalloc

    prefer_jemalloc()  # as the command line allocates
    dump, _ = dumps(args.sessions, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        rows = captured_rows(dump, Path(tmp))
        results = measure(rows, args.rounds, Path(tmp))
    print("| step | ours: CPU s | plain: CPU s | ours / plain | compared |")
    print("|---|---:|---:|---:|---|")
    for step, (ours, plain, compared) in results.items():
        print(f"| {step} | {ours:.3f} | {plain:.3f} | {ours / plain:.2f}× | {compared} |")


if __name__ == "__main__":
    main()
