"""Scaling past one machine: what the Ray driver and its workers cost per turn, and what moves.

    python benchmarks/bench_scale.py                       # 40 swe-long sessions; writes docs/scale.md
    python benchmarks/bench_scale.py --sessions 8 --no-write --cpus 1 2   # a quick look

The dump is bench_replay's (`trace-tools simulate --profile swe-long`, 25–45 turns a session,
contexts ending at 25k–60k tokens), cached under `$TRACE_TOOLS_CACHE/bench/`. Every row runs in a
fresh subprocess on the same dump:

* `workers 1`: the replay in one process (what every turn costs when nothing is distributed);
* `driver reads`: what the driver did before workers read their own rows: pass 2 of the stream
  (read, check, build sessions with their ids as arrays) and pickling each session for a task;
* `ray N`: `--executor ray` on a local Ray started with N logical CPUs (N may exceed the cores:
  the driver's share per turn is what matters, not the wall time on a small machine).

For a Ray row the driver's CPU (this process, its threads included; Ray's own daemons are other
processes) is split into set-up (pass 1, checks, shipping options), the replay loop (submitting
tasks, taking results, writing shards), the encoding of the sample parts (one per shard, on a pool
of driver threads: docs/run_directory.md#samples) and the end of the run
(merging shard tables). Worker CPU is the CPU of every Ray worker process (their start-up, the
row-group loader tasks and the session tasks), read when the run ends. Bytes: task arguments the
driver sent, row data the session tasks received (worker to worker, from the loaders), and
results the driver received. From these, docs/scale.md projects a 170k-turn run and a 1M-turn,
50k-session week of RL onto N workers.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
TARGETS = ((170_000, None), (1_000_000, 50_000))  # (turns, sessions) of the projected runs
MEASURED_RUNS = 3
IDLE_S = 5.0
PROJECTED_WORKERS = (1, 8, 32, 64, 128, 256, 512)


# -- measured in a subprocess --------------------------------------------------------------------
def run_task(task: str, dump: Path, out: Path, strategies: list[str] | None, samples: bool) -> dict:
    if task == "driver-reads":
        return driver_reads(dump)
    from trace_tools.replay.engine import run
    from trace_tools.replay.session import ReplayOptions

    def options() -> ReplayOptions:
        return ReplayOptions(list(strategies or []), write_samples=samples)

    if task == "workers-1":
        run(dump, options(), out / "warm-up", workers=1, finish=_as_is)
        started, cpu = time.perf_counter(), time.process_time()
        result = run(dump, options(), out / "measured", workers=1, finish=_as_is)
        return {"wall": time.perf_counter() - started, "driver_cpu": time.process_time() - cpu, "turns": result.rows}
    return ray_run(int(task.split("-")[1]), dump, out, options)


def _as_is(result):
    """The engine's own result (what the benchmark reads), without the report the API builds."""
    return result


def driver_reads(dump: Path) -> dict:
    """The driver's cost per session before: read and check the rows, pickle the session for a task."""
    from trace_tools.data import Session
    from trace_tools.pipeline import Pipeline

    started = time.process_time()
    stream = Pipeline(dump, id_arrays=True).stream
    sent = sessions = 0
    for _position, item in stream.positioned():
        if isinstance(item, Session):
            sent += len(pickle.dumps(item, protocol=5))
            sessions += 1
    return {"driver_cpu": time.process_time() - started, "turns": stream.rows, "sent_bytes": sent, "sessions": sessions}


def ray_run(cpus: int, dump: Path, out: Path, options) -> dict:
    """A warm-up replay, then MEASURED_RUNS measured ones in the same driver and on the same
    workers (a long run pays imports, renderer set-up and Ray's function export once, not per
    turn); each figure is the median over the measured runs, which this shared machine needs."""
    import ray

    from trace_tools.replay import engine

    started = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    startup = time.perf_counter() - started
    engine.run(dump, options(), out / "warm-up", workers=cpus, executor="ray", finish=_as_is)
    idle_cpu, idle_started = time.process_time(), time.perf_counter()
    time.sleep(IDLE_S)  # what Ray's threads in a connected driver cost when nothing runs
    idle = (time.process_time() - idle_cpu) / (time.perf_counter() - idle_started)
    probe = _DriverProbe(engine)
    runs = [_measured_run(probe, engine, dump, out / f"measured-{n}", options, cpus) for n in range(MEASURED_RUNS)]
    ray.shutdown()
    row = {key: statistics.median(run[key] for run in runs) for key in runs[0] if key != "turns"}
    shares = [run["loop_cpu"] / run["worker_cpu"] for run in runs]
    return {**row, "cpus": cpus, "startup": startup, "idle": idle, "turns": runs[0]["turns"], "shares": shares}


def _measured_run(probe: "_DriverProbe", engine, dump: Path, out: Path, options, cpus: int) -> dict:
    before = _worker_cpu()
    probe.reset()
    cpu, started = time.process_time(), time.perf_counter()
    result = engine.run(dump, options(), out, workers=cpus, executor="ray", finish=_as_is)
    driver_cpu, wall = time.process_time() - cpu, time.perf_counter() - started
    after = _worker_cpu()
    stats = result.ray
    return {
        "wall": wall,
        "turns": result.rows,
        "sessions": result.session_count,
        "driver_cpu": driver_cpu,
        **probe.figures(cpu, driver_cpu),
        "worker_cpu": sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items()),
        "task_cpu": stats.worker_cpu_s,
        "tasks": stats.tasks,
        "nodes": len(stats.nodes),
        "sent_bytes": stats.sent_bytes,
        "rows_bytes": stats.rows_bytes,
        "received_bytes": stats.received_bytes,
    }


def _worker_cpu() -> dict[int, float]:
    """CPU seconds of each Ray worker process of this driver's local Ray."""
    import psutil

    found = {}
    for process in psutil.Process().children(recursive=True):
        try:
            if process.cmdline() and process.cmdline()[0].startswith("ray::"):
                found[process.pid] = sum(process.cpu_times()[:2])
        except psutil.Error:  # gone meanwhile
            continue
    return found


class _DriverProbe:
    """Splits the driver process's CPU of one run into set-up (until the first task is submitted:
    pass 1, checks, shipping options), the loop (from there until the last result is taken:
    submitting tasks, taking results, writing shards, Ray's own threads in the driver), the end
    (after the last result: the last shard, merging shard tables) and the encoding of the sample
    parts (`io.sample_parts.encode`, on a pool of threads), whose thread CPU is summed as each
    part is written, so that the loop excludes what was encoded during it."""

    def __init__(self, engine) -> None:
        from trace_tools.io import sample_parts
        from trace_tools.replay import executors

        self.reset()
        probe = self
        submit, encode, results = executors._RayReplay._submit, sample_parts.encode, engine.ray_results
        lock = threading.Lock()

        def first_submit(replay, batch):
            if probe.loop_start is None:
                probe.loop_start = probe._now()
            return submit(replay, batch)

        def timed_encode(*args):
            started = time.thread_time()
            try:
                encode(*args)
            finally:
                with lock:
                    probe._samples_done += time.thread_time() - started

        def taken(*args, **kwargs):
            yield from results(*args, **kwargs)
            probe.loop_end = probe._now()

        executors._RayReplay._submit, sample_parts.encode, engine.ray_results = first_submit, timed_encode, taken

    def reset(self) -> None:
        self.loop_start: tuple[float, float, float] | None = None  # (process, main thread, sample parts so far)
        self.loop_end: tuple[float, float, float] | None = None
        self._samples_done = 0.0

    def _now(self) -> tuple[float, float, float]:
        return time.process_time(), time.thread_time(), self._samples_done

    def figures(self, run_start: float, driver_cpu: float) -> dict:
        (process0, main0, samples0), (process1, main1, samples1) = self.loop_start, self.loop_end
        loop_samples = samples1 - samples0
        return {
            "setup_cpu": process0 - run_start - samples0,
            "loop_cpu": process1 - process0 - loop_samples,
            "main_cpu": main1 - main0,
            "samples_cpu": self._samples_done,
            "end_cpu": run_start + driver_cpu - process1 - (self._samples_done - samples1),
        }


# -- driving ----------------------------------------------------------------------------------------
def measure(task: str, dump: Path, scratch: Path, args: argparse.Namespace) -> dict:
    out = scratch / task
    env = {key: value for key, value in os.environ.items() if key != "TRACE_TOOLS_WORKERS"}
    command = [sys.executable, __file__, "--task", task, "--dump", str(dump), "--scratch", str(out)]
    command += [f"--strategy={name}" for name in args.strategy or []] + ([] if args.samples else ["--no-samples"])
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{task} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--cpus", type=int, nargs="+", default=[1, 2, 8], help="logical CPUs of the local Ray")
    parser.add_argument("--strategy", action="append", help="strategies to replay (default: all)")
    parser.add_argument("--samples", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--no-write", action="store_true", help="do not rewrite docs/scale.md")
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.task:
        print(json.dumps(run_task(args.task, Path(args.dump), Path(args.scratch), args.strategy, args.samples)))
        return
    import tempfile

    from bench_replay import _shape, dumps

    dump, _ = dumps(args.sessions, args.seed)
    shape = _shape(dump)
    print(f"dump: {shape['sessions']} sessions, {shape['turns']} turns, {shape['mb']:.0f} MB", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in ["workers-1", "driver-reads", *(f"ray-{n}" for n in args.cpus)]:
            results[task] = measure(task, dump, Path(tmp), args)
            print(f"  {task}: {json.dumps(results[task])}", flush=True)
    text = report(shape, results, args)
    print(text)
    if not args.no_write:
        write_measured(ROOT / "docs" / "scale.md", text)


def write_measured(page: Path, text: str) -> None:
    """Replace the page from its `## Measured` heading on; the hand-written part above stays."""
    marker, old = "\n## Measured\n", page.read_text() if page.exists() else ""
    page.write_text(old.split(marker, 1)[0] + marker + text.split(marker, 1)[1] if marker in old else text)


# -- the report -----------------------------------------------------------------------------------
def per_turn_ms(seconds: float, turns: int) -> float:
    return 1000 * seconds / turns


def costs(row: dict) -> dict:
    """Per-turn costs (ms) of one Ray row."""
    turns = row["turns"]
    return {
        "worker": per_turn_ms(row["worker_cpu"], turns),
        "driver": per_turn_ms(row["loop_cpu"], turns),
        "main": per_turn_ms(row["main_cpu"], turns),
        "samples": per_turn_ms(row["samples_cpu"], turns),
        "setup": per_turn_ms(row["setup_cpu"], turns),
        "end": per_turn_ms(row["end_cpu"], turns),
    }


def report(shape: dict, results: dict, args: argparse.Namespace) -> str:
    import trace_tools

    rays = [results[f"ray-{n}"] for n in args.cpus]
    local, before = results["workers-1"], results["driver-reads"]
    what = "all strategies" if not args.strategy else ", ".join(f"`{s}`" for s in args.strategy)
    lines = [
        "# Scaling past one machine",
        "",
        "`--executor ray` keeps as many tasks in flight as the cluster has CPUs (twice that, re-read "
        "from `ray.cluster_resources()` as the cluster changes); the driver runs pass 1 of the "
        "pipeline only (where each session's rows are) and sends each task a description of its "
        "sessions (a long session alone, many short ones together: a task costs the driver about what "
        "tens of turns cost a worker, so a task takes sessions while their turns, counted by pass 1, "
        "stay a small share of the turns left); loader tasks on the workers decode each Parquet row "
        "group once and hand every session "
        "its own rows, which its task checks exactly as the local reader does; results come back as "
        "they finish and the shard writer puts them back in stream order, so the run directory is the "
        "same as `--workers 1`'s (tested, on a two-raylet cluster too). A task whose worker dies is "
        "retried, up to 3 times; a killed driver resumes from the finished shards, also from a run "
        "directory in object storage. How to run it on a cluster: the next section.",
        "",
        "## Measured",
        "",
        f"**Measured, not generated** ({time.strftime('%Y-%m-%d')}, trace-tools {trace_tools.__version__}): "
        f"`python benchmarks/bench_scale.py{_flags(args)}` on this machine ({os.cpu_count()} cores, shared: "
        f"wall times are indicative only), {what}, {'with' if args.samples else 'without'} samples, on "
        f"{shape['sessions']} simulated `swe-long` sessions ({shape['turns']} turns, {shape['mb']:.0f} MB of "
        "Parquet). Ray rows use a local Ray with that many logical CPUs.",
        "",
        "| | wall | worker CPU / turn | driver CPU / turn | driver share | main thread | sample parts / turn "
        "| sent / session | rows to tasks / session | results / session |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| `--workers 1` (one process) | {local['wall']:.1f} s "
        f"| {per_turn_ms(local['driver_cpu'], local['turns']):.2f} ms | | | | | | | |",
        f"| driver reads rows (before) | | | {per_turn_ms(before['driver_cpu'], before['turns']):.2f} ms "
        f"| {before['driver_cpu'] / local['driver_cpu']:.1%} | | "
        f"| {before['sent_bytes'] / before['sessions'] / 1e6:.2f} MB | | |",
    ]
    for row in rays:
        c = costs(row)
        sessions = row["sessions"]
        lines.append(
            f"| Ray, {row['cpus']} CPU{'s' if row['cpus'] > 1 else ''} | {row['wall']:.1f} s | {c['worker']:.2f} ms "
            f"| {c['driver']:.3f} ms | **{_share(row)}** | {c['main'] / c['worker']:.2%} "
            f"| {c['samples']:.3f} ms "
            f"| {row['sent_bytes'] / sessions:,.0f} B | {row['rows_bytes'] / sessions / 1e6:.2f} MB "
            f"| {row['received_bytes'] / sessions / 1e6:.2f} MB |"
        )
    lines += _notes(rays, before, local)
    for number, (turns, sessions) in enumerate(TARGETS):
        lines += _projection(rays, args, turns, sessions, explain=number == 0)
    return "\n".join(lines) + "\n"


def _share(row: dict) -> str:
    """The median of the measured runs' driver shares, and their range."""
    shares = row["shares"]
    return f"{statistics.median(shares):.2%} ({min(shares):.2%}–{max(shares):.2%})"


def _flags(args: argparse.Namespace) -> str:
    flags = [f"--sessions {args.sessions}"] if args.sessions != 40 else []
    flags += [f"--strategy {s}" for s in args.strategy or []]
    flags += [] if args.samples else ["--no-samples"]
    flags += [] if args.cpus == [1, 2, 8] else ["--cpus " + " ".join(map(str, args.cpus))]
    return "".join(" " + f for f in flags)


def _notes(rays: list[dict], before: dict, local: dict) -> list[str]:
    widest = max(rays, key=lambda r: r["cpus"])
    c = costs(widest)
    return [
        "",
        "*Driver CPU / turn* is the driver process's CPU from the first task submitted to the last "
        "result taken (submitting tasks, taking results, writing the shards, Ray's own threads in the "
        "driver), less the CPU of the threads encoding sample parts meanwhile; "
        "*driver share* divides it by the workers' CPU per turn (the target is ≤ 2 %): the median of "
        f"{MEASURED_RUNS} measured replays after a warm-up, their range in brackets; *main thread* is the "
        "share of the one thread that runs the loop. The *driver reads rows* row is the driver's work "
        "per turn before (reading and checking rows, pickling sessions), its share against "
        "`--workers 1`'s CPU per turn. *Sample parts* is the encoding of the samples, one Parquet part "
        "per shard on a pool of driver threads (io.sample_parts.ENCODERS of them); `--no-samples` "
        "removes it. Once per run, not per turn: set-up before the first task (pass 1, checks, "
        f"shipping options) cost {c['setup'] * widest['turns']:.0f} ms and the end after the last result "
        f"(the last shard, merging shard tables) {c['end'] * widest['turns']:.0f} ms at "
        f"{widest['cpus']} CPUs. *Sent*: task arguments the driver serialised (descriptions and object "
        "ids; before, the driver pickled every session's rows). *Rows to tasks*: row data session "
        "tasks received from the loaders (worker to worker, never through the driver). *Results*: "
        "Arrow buffers of turns, sessions and samples the driver received. Worker CPU counts every "
        "Ray worker process (start-up and loaders included), so it is above `--workers 1`'s at few "
        "sessions per worker.",
    ]


def _projection(
    rays: list[dict], args: argparse.Namespace, turns: int, sessions: int | None, explain: bool
) -> list[str]:
    """Wall time of a `turns`-turn run on N workers from the measured per-turn costs (`explain`:
    say how, the first time)."""
    widest = max(rays, key=lambda r: r["cpus"])
    c = costs(widest)
    share = statistics.median(widest["shares"])
    worker, driver = c["worker"] / 1000, share * c["worker"] / 1000
    from trace_tools.io.sample_parts import ENCODERS

    samples = c["samples"] / 1000 / ENCODERS if args.samples else 0.0  # sample parts encode side by side
    serial = (c["setup"] + c["end"]) / 1000
    of = f"{turns:,}-turn" + (f", {sessions:,}-session" if sessions else "")
    how = (
        "From the widest row's costs per turn: the workers take `turns × worker / N`; the driver's "
        "loop runs beside them and caps the rate at `1 / driver` turns per second; the sample parts "
        "are encoded by ENCODERS threads as shards close and cap it at `ENCODERS / samples`; set-up "
        "(pass 1, planning) and merging shard tables are serial, before and after. Wall ≈ max(workers, "
        "driver loop, samples.parquet) + set-up + end (cluster start-up and the report not included); "
        "*without samples* drops the samples.parquet term (`--no-samples`). The driver figure is "
        f"pessimistic: part of it is Ray's own threads in the driver, which take {1000 * widest['idle']:.1f} ms "
        "of CPU per second even when nothing runs (measured over 5 s idle), so at a cluster's rate of "
        "turns they cost less per turn than here; the main thread alone would saturate far later."
    )
    per_session = (
        f"The same per-turn costs at {turns // sessions} turns a session (the benchmark's sessions average "
        f"{widest['turns'] / args.sessions:.0f}): a task's fixed cost is shared by fewer turns, so the "
        "driver figure is a little low for short sessions; the batching of short sessions into one task "
        "(the top of this page) is what keeps it near the measured one."
        if sessions
        else ""
    )
    lines = [
        "",
        f"## A {of} run, projected",
        "",
        how if explain else per_session,
        "",
        "| workers | workers' time | driver loop | samples.parquet | wall | without samples | limited by |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in PROJECTED_WORKERS:
        parts = {"workers": turns * worker / n, "driver loop": turns * driver, "samples.parquet": turns * samples}
        wall = max(parts.values()) + turns * serial
        bare = max(parts["workers"], parts["driver loop"]) + turns * serial
        limit = max(parts, key=lambda k: parts[k])
        lines.append(
            f"| {n} | {_duration(parts['workers'])} | {_duration(parts['driver loop'])} "
            f"| {_duration(parts['samples.parquet']) if samples else '—'} | {_duration(wall)} | {_duration(bare)} "
            f"| {limit} |"
        )
    lines += [
        "",
        f"The driver's loop saturates at about **{1 / share:,.0f} workers** "
        f"({share:.2%} of a worker's CPU per turn, the median share; its main thread alone at about "
        f"{c['worker'] / c['main']:,.0f})"
        + (
            f"; before that, encoding the sample parts on the driver's encoder threads limits a run that writes samples to "
            f"about **{worker / samples:,.0f} workers** — replay with `--no-samples`, or export only "
            "what a trainer needs, beyond that."
            if samples
            else "."
        ),
        "",
    ]
    return lines


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.1f} s"


if __name__ == "__main__":
    main()
