"""Check that two run directories hold the same results, timings aside.

    python benchmarks/same_run.py RUN_A RUN_B [--across-render-paths]

Compares every Parquet table of the run (row for row, column for column, `elapsed_s` left out),
`summary.json` and `run.json` (the creation time, Arrow's allocator and the input paths left out) and `report.md`
(its timing lines left out). Exit 0 when they match, 1 with the first differences listed when
they do not. Used to show that a refactoring changed no result (issue 24). With
`--across-render-paths` (a fast run against a `--reference` or `--verify` one) what records how
prompts were rendered is left out too: the render path in run.json's options and renderers, and
the `reconstruction` counters of run.json and summary.json.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq

TIMING_COLUMNS = {"elapsed_s"}
# When the run was made, and which allocator held Arrow's buffers (the command line picks jemalloc,
# `arrow_pool`; a notebook keeps the default): neither changes a result.
RUN_JSON_VOLATILE = {"created_at", "arrow_memory_pool"}
TIMING_LINE = re.compile(r"\d+(\.\d+)?\s*(s|ms|seconds)\b|elapsed|created", re.IGNORECASE)


def table_differences(a: Path, b: Path) -> list[str]:
    left, right = pq.read_table(a), pq.read_table(b)
    if left.column_names != right.column_names:
        return [f"{a.name}: columns {left.column_names} != {right.column_names}"]
    if left.num_rows != right.num_rows:
        return [f"{a.name}: {left.num_rows} rows != {right.num_rows}"]
    found = []
    for name in left.column_names:
        if name in TIMING_COLUMNS:
            continue
        x, y = left.column(name).to_pylist(), right.column(name).to_pylist()
        if x != y:
            row = next(i for i, (p, q) in enumerate(zip(x, y)) if p != q)
            found.append(f"{a.name}: {name} differs first at row {row}: {str(x[row])[:80]} != {str(y[row])[:80]}")
    return found


def json_differences(a: Path, b: Path, across_render_paths: bool = False) -> list[str]:
    return _diff(_load(a, across_render_paths), _load(b, across_render_paths), a.name)


def _load(path: Path, across_render_paths: bool = False) -> object:
    data = json.loads(path.read_text())
    if across_render_paths:
        data.pop("reconstruction", None)
        data.get("options", {}).pop("render_path", None)
        for renderer in data.get("renderers", []):
            renderer.pop("path", None)
    if path.name == "run.json":
        for key in RUN_JSON_VOLATILE:
            data.pop(key, None)
        data.get("inputs", {}).pop("dump", None)
        data.get("inputs", {}).pop("files", None)
    return data


def _diff(x: object, y: object, where: str) -> list[str]:
    if isinstance(x, dict) and isinstance(y, dict):
        found = [f"{where}: keys {sorted(set(x) ^ set(y))} only on one side"] if set(x) != set(y) else []
        for key in x.keys() & y.keys():
            found += _diff(x[key], y[key], f"{where}.{key}")
        return found
    return [] if x == y else [f"{where}: {str(x)[:120]} != {str(y)[:120]}"]


def text_differences(a: Path, b: Path) -> list[str]:
    left = [line for line in a.read_text().splitlines() if not TIMING_LINE.search(line)]
    right = [line for line in b.read_text().splitlines() if not TIMING_LINE.search(line)]
    if left == right:
        return []
    row = next((i for i, (p, q) in enumerate(zip(left, right)) if p != q), min(len(left), len(right)))
    return [f"{a.name}: differs first at line {row}"]


def differences(run_a: Path, run_b: Path, across_render_paths: bool = False) -> list[str]:
    names_a = {p.name for p in run_a.iterdir() if p.is_file()}
    names_b = {p.name for p in run_b.iterdir() if p.is_file()}
    found = [f"files only on one side: {sorted(names_a ^ names_b)}"] if names_a != names_b else []
    for name in sorted(names_a & names_b):
        a, b = run_a / name, run_b / name
        if name.endswith(".parquet"):
            found += table_differences(a, b)
        elif name in ("summary.json", "run.json"):
            found += json_differences(a, b, across_render_paths)
        elif name == "report.md":
            found += text_differences(a, b)
    return found


def main(argv: list[str]) -> int:
    flag = "--across-render-paths"
    run_a, run_b = (Path(arg) for arg in argv if arg != flag)
    found = differences(run_a, run_b, flag in argv)
    for line in found[:40]:
        print(line)
    print("same results" if not found else f"{len(found)} differences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
