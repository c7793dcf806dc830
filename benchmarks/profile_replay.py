"""Where the CPU time of a replay goes, phase by phase, on the benchmark's workload.

    python benchmarks/profile_replay.py                         # 10 swe-long sessions: tree, then all strategies
    python benchmarks/profile_replay.py --sessions 40 --runs tree

Runs `replay --workers 1`, each run in a fresh process after one uncounted run, with a CPU-time
stopwatch (the thread's own clock, `time.thread_time`, so a helper thread's work is not charged
to the call it overlaps) around the functions that make up each phase (a generator's steps,
not the call that creates it), and prints one Markdown table
(docs/performance.md#where-the-time-goes). A phase's time is its own: what runs inside another
timed function (a render inside a strategy, an encode inside a render) is charged to the inner
one, and the renders and encodes are split by who asked for them (the shared reconstruction, or
a strategy of its own). Unlike cProfile, which hooks every call and inflates small Python
functions several times, a stopwatch costs two clock reads per timed call. What no phase covers
(the engine's loop, garbage collection) is the `other` row; imports are counted where they happen.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]

# (module, attribute path, phase); "{owner}" in a phase is the strategy or reconstruction that asked.
TIMED = [
    ("trace_tools.io.load", "read_row_group", "read the dump (Parquet)"),
    ("trace_tools.io.load", "read_session", "read the dump (sessions)"),
    # `--workers 1` reads in this process, through the stream, not through the two above; the
    # stream decodes its batches on its reading-ahead thread (`other threads`).
    ("trace_tools.io.load", "iter_batches", "read the dump (Parquet)"),
    ("trace_tools.io.load", "SessionStream._read_rows", "read the dump (checks, Arrow to Python)"),
    ("trace_tools.io.load", "SessionStream._take_row", "read the dump (rows to turns)"),
    ("trace_tools.io.load", "SessionStream._finish", "read the dump (rows to turns)"),
    ("trace_tools.replay.session", "SessionReplayer.prepare", "reconstruction: prepare"),
    ("trace_tools.replay.session", "session_facts", "reconstruction: fidelity, drift"),
    ("trace_tools.replay.session", "drift_rows", "rows: drift"),
    ("trace_tools.strategies.base", "Strategy.replay", "strategy logic: {owner}"),
    ("trace_tools.render.renderer", "Renderer._apply_template", "{owner}: template render"),
    ("trace_tools.render.tokenizer", "Tokenizer.encode", "{owner}: encode"),
    ("trace_tools.render.limits", "_Watchdog.arm", "template limits (watchdog)"),
    ("trace_tools.render.limits", "_Watchdog.disarm", "template limits (watchdog)"),
    ("trace_tools.replay.session", "check_trained_once", "rows: trained-once check"),
    ("trace_tools.replay.session", "turn_rows", "rows: turns, sessions"),
    ("trace_tools.replay.session", "session_row", "rows: turns, sessions"),
    ("trace_tools.replay.session", "sample_rows", "rows: samples"),
    ("trace_tools.replay.session", "samples_table", "Arrow: samples table"),
    ("trace_tools.io.shards", "ShardWriter.add", "Arrow: shard tables"),
    ("trace_tools.io.shards", "write_parquet_atomic", "shards: Parquet write"),
    ("trace_tools.io.shards", "file_entry", "shards: sha256"),
    ("trace_tools.io.shards", "merge", "merge"),
    ("trace_tools.report.metrics", "summarize", "summary"),
    ("trace_tools.report.render", "write_report", "report.md"),
    ("trace_tools.report.html", "write_html_report", "report.html"),
    ("trace_tools.report.plots", "write_plots", "plots"),
]


class Stopwatch:
    """Exclusive CPU time per phase: entering a timed call pauses the one it runs inside."""

    def __init__(self) -> None:
        self.spent: Counter = Counter()
        self.calls: Counter = Counter()
        self._stack: list[list[Any]] = []  # [phase, started, time of inner calls, owner to restore]
        self.owner = "reconstruction"

    def wrap(self, function: Callable, phase: str) -> Callable:
        if inspect.isgeneratorfunction(function):
            return self._wrap_steps(function, phase)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._enter(phase, args)
            try:
                return function(*args, **kwargs)
            finally:
                self._leave()

        return timed

    def _wrap_steps(self, function: Callable, phase: str) -> Callable:
        """A generator's time is spent in its steps, not in the call that creates it."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            steps = function(*args, **kwargs)
            while True:
                self._enter(phase, args)
                try:
                    item = next(steps)
                except StopIteration:
                    return
                finally:
                    self._leave()
                yield item

        return timed

    def _enter(self, phase: str, args: tuple) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # other threads' CPU is their own row: a timed call there is not nested in ours
        outer = None
        if phase.startswith("strategy logic"):
            outer, self.owner = self.owner, args[0].name
        name = phase.format(owner=self.owner) if "{owner}" in phase else phase
        self._stack.append([name, time.thread_time(), 0.0, outer])

    def _leave(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        name, started, inner, outer = self._stack.pop()
        elapsed = time.thread_time() - started
        self.spent[name] += elapsed - inner
        self.calls[name] += 1
        if self._stack:
            self._stack[-1][2] += elapsed
        if outer is not None:
            self.owner = outer

    def install(self) -> None:
        for module_name, path, phase in TIMED:
            owner: Any = importlib.import_module(module_name)
            *parents, attribute = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            setattr(owner, attribute, self.wrap(getattr(owner, attribute), phase))


def profile(dump: Path, strategies: list[str] | None, out: Path) -> tuple[Counter, float, int]:
    from trace_tools.arrow_pool import prefer_jemalloc

    prefer_jemalloc()  # Arrow's allocator as the command line chooses it
    watch = Stopwatch()
    watch.install()
    from trace_tools.api import replay

    started, started_here = time.process_time(), time.thread_time()
    result = replay(dump, out=out, strategies=strategies, workers=1)
    total, here = time.process_time() - started, time.thread_time() - started_here
    watch.spent["other (engine loop, gc, imports elsewhere)"] = here - sum(watch.spent.values())
    watch.spent["other threads (samples writer, reading ahead, template watchdog)"] = total - here
    return watch.spent, total, result.summary["turns_total"]


def by_phase(spent: Counter) -> Counter:
    """The strategies' rows summed: strategy logic, and the renders and encodes strategies ask for."""
    merged: Counter = Counter()
    for phase, seconds in spent.items():
        owner, _, what = phase.rpartition(": ")
        if phase.startswith("strategy logic: "):
            merged["strategy logic (all strategies)"] += seconds
        elif owner and owner != "reconstruction" and what in ("template render", "encode"):
            merged[f"strategies' own {what}s"] += seconds
        else:
            merged[phase] += seconds
    return merged


def per_strategy(spent: Counter) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for phase, seconds in spent.items():
        owner, _, what = phase.rpartition(": ")
        if phase.startswith("strategy logic: "):
            owner, what = what, "logic"
        if owner and owner != "reconstruction" and what in ("logic", "template render", "encode"):
            rows.setdefault(owner, {})[what] = seconds
    return rows


def table(results: dict[str, tuple[Counter, float, int]]) -> str:
    runs = list(results)
    merged = {run: by_phase(spent) for run, (spent, _, _) in results.items()}
    phases = sorted({p for spent in merged.values() for p in spent}, key=lambda p: -merged[runs[-1]][p])
    lines = [
        "| phase: CPU ms per turn (share) | " + " | ".join(f"`{run}`" for run in runs) + " |",
        "|---|" + "---:|" * len(runs),
    ]
    for phase in phases:
        cells = []
        for run in runs:
            _, total, turns = results[run]
            seconds = merged[run][phase]
            cells.append(f"{1000 * seconds / turns:.2f} ({seconds / total:.0%})" if seconds > 0 else "")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    lines.append(
        "| **total** | "
        + " | ".join(f"**{1000 * total / turns:.2f}** ({total:.1f} s)" for _, total, turns in results.values())
        + " |"
    )
    spent, _, turns = results[runs[-1]]
    rows = per_strategy(spent)
    lines += ["", f"Per strategy, in `{runs[-1]}` (CPU ms per turn):", ""]
    lines += ["| strategy | logic | its own template renders | its own encodes | in all |", "|---|---:|---:|---:|---:|"]
    for owner, parts in sorted(rows.items(), key=lambda item: -sum(item[1].values())):
        cells = [1000 * parts.get(what, 0.0) / turns for what in ("logic", "template render", "encode")]
        lines.append(f"| {owner} | " + " | ".join(f"{cell:.2f}" for cell in cells) + f" | {sum(cells):.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--runs", nargs="+", default=["tree", "all"], help="'all' or a comma-separated list each")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_replay import compile_bytecode, dumps

    dump, _ = dumps(args.sessions, args.seed)
    if args.run is not None:  # the measured process
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(profile(dump, None if args.run == "all" else args.run.split(","), Path(tmp) / "run")))
        return
    compile_bytecode()
    results = {}
    # Each run in a fresh process, so imports and in-process caches start cold alike. One run is
    # thrown away first: it pays for reading the dump and the libraries from disk into the page
    # cache (1.5 s more CPU in the dump's reads on this machine), which would fall on whichever
    # run came first.
    for position, run in enumerate([args.runs[0], *args.runs]):
        command = [sys.executable, __file__, "--sessions", str(args.sessions), "--seed", str(args.seed), "--run", run]
        printed = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout
        spent, total, turns = json.loads(printed.strip().splitlines()[-1])
        if position:
            results[run] = (Counter(spent), total, turns)
    print(table(results))


if __name__ == "__main__":
    main()
