"""Output never depends on the worker count or the executor, and a killed run resumes (docs/pipeline.md#every-core-and-many-machines)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from io_support import run_contents
from run_support import REPORT_COMPILES, process_group
from trace_tools.api import replay
from trace_tools.errors import UsageError
from trace_tools.io import storage


@pytest.fixture(scope="module")
def single_process_run(simulated_dump, tmp_path_factory):
    out = tmp_path_factory.mktemp("w1") / "run"
    replay(simulated_dump, out=out, workers=1)
    return run_contents(out)


def test_two_spawned_workers_give_the_same_run_directory(simulated_dump, tmp_path, single_process_run, monkeypatch):
    monkeypatch.setenv("TRACE_TOOLS_WORKER_START", "spawn")
    replay(simulated_dump, out=tmp_path / "run", workers=2)
    assert run_contents(tmp_path / "run") == single_process_run


def test_two_forked_workers_give_the_same_run_directory(simulated_dump, tmp_path, single_process_run):
    """A fresh process (one thread) forks its workers once it has built its tokenizer's encoder
    and compiled its template, which they share (no worker builds or compiles either), and
    leaves no process behind it (a forked pool starts no resource tracker, which would outlive it)."""
    code = (
        "import os, sys; from pathlib import Path; from trace_tools.api import replay; "
        "from trace_tools.replay import local_pool; made = local_pool.WorkerPool.__init__; "
        "local_pool.WorkerPool.__init__ = lambda self, n: (made(self, n), print(type(self.context).__name__))[0]; "
        "from trace_tools.render import fast_encoder; built = fast_encoder.FastEncoder.__init__; "
        "fast_encoder.FastEncoder.__init__ = lambda self, *a: (built(self, *a), print('encoder', os.getpid(), file=sys.stderr, flush=True))[0]; "
        + REPORT_COMPILES
        + f"replay(Path({str(simulated_dump)!r}), out=Path({str(tmp_path / 'run')!r}), workers=2); print(os.getpid())"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert process_group(process.pid) == []
    fork, driver = stdout.split()
    assert fork == "_QuietFork"
    built = [line.split() for line in stderr.splitlines()]
    assert [pid for what, pid in built if what == "encoder"] == [driver]  # one, built before the fork
    assert {pid for what, pid in built if what == "compile"} == {driver}
    assert run_contents(tmp_path / "run") == single_process_run


def _pool_started(env: dict[str, str], thread: bool = False) -> subprocess.CompletedProcess:
    """What a WorkerPool of two made in a fresh process starts with: its context, and how many
    workers exist before any session was sent."""
    code = (
        "import threading, time; from trace_tools.replay.local_pool import WorkerPool; "
        + ("threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); " if thread else "")
        + "pool = WorkerPool(2); print(type(pool.context).__name__, len(pool.context.started)); pool.stop()"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env})


def test_workers_fork_at_once_only_from_a_single_thread_and_unless_told_to_spawn():
    assert _pool_started({}).stdout.split() == ["_QuietFork", "2"]
    assert _pool_started({}, thread=True).stdout.split() == ["_QuietSpawn", "0"]  # a notebook, a service
    assert _pool_started({"TRACE_TOOLS_WORKER_START": "spawn"}).stdout.split() == ["_QuietSpawn", "0"]
    refused = _pool_started({"TRACE_TOOLS_WORKER_START": "vfork"})
    assert refused.returncode != 0 and "TRACE_TOOLS_WORKER_START=vfork is not a start method" in refused.stderr


@pytest.fixture(scope="module")
def local_ray(s3_server):
    """A local Ray of two CPUs, started once the S3 environment is set (its workers inherit it)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_workers_read_an_s3_dump_and_give_the_same_run_directory(
    s3_server, simulated_dump, single_process_run, local_ray
):
    bucket = s3_server()
    storage.upload(simulated_dump.parent, bucket, [simulated_dump.name])
    result = replay(f"{bucket}/{simulated_dump.name}", out=f"{bucket}/run", executor="ray", workers=2)
    with storage.local_run(result.run_dir) as copy:
        assert run_contents(copy) == single_process_run
    sessions = single_process_run["summary"]["sessions_total"]
    assert result.ray["nodes"] == 1 and result.ray["sent_bytes"] < 1024 * sessions  # descriptions, not rows


def test_a_ray_worker_killed_mid_session_is_retried_with_the_same_result(
    simulated_dump, tmp_path, single_process_run, local_ray
):
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_one_replaying_worker, args=(stop, killed))
    killer.start()
    try:
        replay(simulated_dump, out=tmp_path / "run", executor="ray", workers=2)
    finally:
        stop.set()
        killer.join()
    assert killed, "no Ray worker was caught replaying a session"
    assert run_contents(tmp_path / "run") == single_process_run


def _kill_one_replaying_worker(stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the first Ray worker of this process's own Ray instance seen running a session task."""
    while not stop.is_set():
        for pid in _descendants(os.getpid()):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if title.startswith(b"ray::_replay_slot"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.01)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if entry.name.isdigit():
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_a_killed_run_resumes_to_the_same_result(simulated_dump, tmp_path, single_process_run):
    out = tmp_path / "run"
    env = {**os.environ, "TRACE_TOOLS_SHARD_ROWS": "1", "TRACE_TOOLS_WORKERS": "1"}  # a shard per session
    code = f"from trace_tools.api import replay; replay({str(simulated_dump)!r}, out={str(out)!r})"
    process = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 300
    while len(list((out / "shards").glob("*.done"))) < 2 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.kill()
    process.wait()
    finished = sorted(p.name for p in (out / "shards").glob("*.done"))
    assert "0000000.done" in finished and not (out / "summary.json").exists()
    os.environ["TRACE_TOOLS_SHARD_ROWS"] = "1"
    try:
        result = replay(simulated_dump, out=out, workers=1)
    finally:
        del os.environ["TRACE_TOOLS_SHARD_ROWS"]
    assert result.resumed_shards >= 2
    assert run_contents(out) == single_process_run


def _ray_planner(cpus: int, sizes: list[int]):
    """A Ray replay's task planner over sessions of `sizes` turns, on a cluster of `cpus` CPUs
    (no cluster is asked: the planner keeps the count it read last)."""
    from collections import deque

    from trace_tools.io.load import SessionSlot
    from trace_tools.replay import executors

    planner = executors._RayReplay.__new__(executors._RayReplay)
    planner._cpus, planner._checked = cpus, float("inf")
    planner.unsent = sum(sizes)
    return planner, deque(SessionSlot(n, f"s{n}", 0, [(0, 0)], [], rows) for n, rows in enumerate(sizes))


def _batches(cpus: int, sizes: list[int]) -> list[list[int]]:
    planner, todo = _ray_planner(cpus, sizes)
    batches = []
    while todo:
        batches.append([slot.rows for slot in planner._batch(todo)])
    assert [size for batch in batches for size in batch] == sizes  # every session once, in order
    assert planner.unsent == 0
    return batches


def test_ray_tasks_share_many_short_sessions_and_end_with_single_ones():
    from trace_tools.replay.executors import TURNS_PER_TASK

    tiny = _batches(8, [1] * 2000)
    assert len(tiny) < 200  # not 2,000 tasks: each costs the driver what tens of turns cost a worker
    assert max(map(sum, tiny)) <= TURNS_PER_TASK
    assert tiny[-16:] == [[1]] * 16  # the last tasks are single sessions, so the end spreads evenly
    long = _batches(8, [30] * 40)
    assert len(long[0]) == 2 and max(map(len, long)) == 2 and long[-1] == [30]
    alone = _batches(2, [1000, 1, 1, 1])
    assert alone[0] == [1000]  # a session larger than a task's share goes alone


def test_ray_tasks_start_at_most_a_window_after_the_oldest_unfinished_one():
    from trace_tools.process_pool import IN_FLIGHT_PER_WORKER
    from trace_tools.replay.executors import REORDER_WINDOW_PER_CPU

    planner, _ = _ray_planner(1, [1])
    assert planner._room({}, 0)
    assert planner._room({"task 5": (5, [])}, 5 + IN_FLIGHT_PER_WORKER - 1)
    assert not planner._room({"task 5": (5, []), "task 6": (6, [])}, 7)  # as many in flight as it keeps
    assert not planner._room({"task 5": (5, [])}, 5 + REORDER_WINDOW_PER_CPU)  # the oldest holds the rest back


def test_a_pool_stopped_early_leaves_no_thread_behind(simulated_dump):
    """A caller that stops reading (what Ctrl-C does to the stream) ends the workers and the pool's
    manager thread before the stream closes: a manager thread still closing its pipes when the
    interpreter exits meets concurrent.futures' exit hook writing to them, an EBADF traceback.
    The pool closes the sessions it was given too, so the thread reading the dump ahead ends
    (the sessions are read as the engine reads them, pass 2 with positions)."""
    from trace_tools.pipeline import Pipeline
    from trace_tools.replay.executors import run_sessions
    from trace_tools.replay.session import ReplayOptions

    before = set(threading.enumerate())
    pipeline = Pipeline(simulated_dump, id_arrays=True)
    sessions = (item for _, item in pipeline.stream.positioned() if hasattr(item, "turns"))
    stream = run_sessions(sessions, ReplayOptions(strategies=["tree"], write_samples=False), workers=2)
    assert next(stream).table("turns").num_rows
    stream.close()
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


def test_one_process_packs_each_sessions_samples_on_a_thread_while_the_next_replays(simulated_dump, monkeypatch):
    """With one process, a session's samples stream (the compressed IPC its shard stores) is made
    on a thread of its own while the next session replays; its rows come one session later, in
    order, holding the stream and the table, as a plain replay would make them."""
    from trace_tools.io.rundir import SessionRows
    from trace_tools.pipeline import Pipeline
    from trace_tools.replay.executors import run_sessions
    from trace_tools.replay.session import ReplayOptions, SessionReplayer

    options = ReplayOptions(strategies=["tree"])
    sessions = [s for s in Pipeline(simulated_dump) if hasattr(s, "turns")][:4]
    plain = [SessionReplayer(options)(session).samples_stream() for session in sessions]
    made_on, sent = [], []
    stream = SessionRows.samples_stream
    monkeypatch.setattr(
        SessionRows, "samples_stream", lambda rows: (made_on.append(threading.current_thread().name), stream(rows))[1]
    )

    def sending():
        for session in sessions:
            sent.append(session.session_id)
            yield session

    results = run_sessions(sending(), options, workers=1)
    first = next(results)
    assert len(sent) == 2  # the second session replayed before the first's rows came
    rows = [first, *results]
    assert [r.sessions[0]["session_id"] for r in rows] == [s.session_id for s in sessions]
    assert all(r.samples is not None for r in rows)
    assert [r.samples_ipc.to_pybytes() for r in rows] == [p.to_pybytes() for p in plain]
    assert set(made_on) == {"trace-tools-samples-pack_0"}
    assert not any(t.name.startswith("trace-tools-samples-pack") for t in threading.enumerate())


def _exiting_worker(log: str, code: int) -> None:
    """A worker body: an exit handler and an object freed only by the interpreter's teardown."""
    import atexit

    atexit.register(lambda: Path(log).open("a").write("exit handler;"))
    globals()["_freed_at_teardown"] = _WritesWhenFreed(log)
    raise SystemExit(code)


class _WritesWhenFreed:
    def __init__(self, log: str):
        # what __del__ needs is held here: the teardown clears module globals first
        self.fd, self.write = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), os.write

    def __del__(self) -> None:
        self.write(self.fd, b"teardown;")


@pytest.mark.parametrize("code", [0, 3])
def test_a_worker_process_exits_with_its_code_and_handlers_but_without_the_teardown(tmp_path, code):
    """Freeing a worker's caches object by object held the pool's shutdown (docs/performance.md)."""
    from trace_tools.process_pool import _QuietSpawn

    log = tmp_path / "log"
    process = _QuietSpawn(hide_main=False).Process(target=_exiting_worker, args=(str(log), code))
    process.start()
    process.join(60)
    assert process.exitcode == code
    assert log.read_text() == "exit handler;"


# -- a dump written as one huge row group; the tasks' priority ------------------------------------
# These run last in the module: they renice the shared Ray's workers.


def _one_row_group_of_small_rows(simulated_dump: Path, out: Path, rows: int, turns: int) -> Path:
    """`rows` small rows (a 9-token prompt, a 2-token output) in sessions of `turns` turns, all in
    one row group: the layout a writer that ignores row groups produces."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pq.read_table(simulated_dump)
    row = source.slice(0, 1).to_pylist()[0]
    row.update(
        messages=json.dumps([{"role": "user", "content": "hi"}]),
        tools=None,
        metadata=None,
        prompt_ids=[151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198],
        output_ids=[562, 151645],
        output_logprobs=[-0.1, -0.01],
        response=json.dumps({"role": "assistant", "content": "ok"}),
        finish_reason="stop",
    )
    table = pa.concat_tables([pa.Table.from_pylist([row], schema=source.schema)] * rows)
    table = table.set_column(0, "session_id", pa.array([f"s{i // turns:06d}" for i in range(rows)]))
    turn_type = table.schema.field("turn_index").type
    table = table.set_column(1, "turn_index", pa.array([i % turns for i in range(rows)], turn_type))
    pq.write_table(table, out, row_group_size=rows)
    assert pq.ParquetFile(out).metadata.num_row_groups == 1
    return out


@pytest.mark.slow
def test_a_dump_of_one_huge_row_group_replays_on_ray_without_any_task_reading_it_whole(
    simulated_dump, tmp_path, local_ray
):
    """100k rows in one row group: loader tasks read row ranges (`io.dump_files.PIECE_ROWS`), so no task
    holds the file; the session tasks' inputs stay a small share of it; every turn is replayed."""
    from trace_tools.io.dump_files import PIECE_ROWS
    from trace_tools.io.validate import validate

    rows = int(os.environ.get("TRACE_TOOLS_TEST_HUGE_ROWS", "100000"))
    dump = _one_row_group_of_small_rows(simulated_dump, tmp_path / "one-group.parquet", rows, turns=100)
    result = replay(dump, out=tmp_path / "run", strategies=["tree"], executor="ray", workers=2, write_samples=False)
    assert result.summary["turns_total"] == rows and result.summary["sessions_total"] == rows // 100
    assert result.ray["largest_read_rows"] <= PIECE_ROWS <= rows // 4
    hint = [warning for warning in validate(dump).warnings if "row group 0 holds" in warning]
    assert len(hint) == 1 and "row_group_size=256" in hint[0]  # `trace-tools validate` prints it


def test_ray_tasks_run_at_the_chosen_niceness(simulated_dump, tmp_path, local_ray, monkeypatch):
    """The fixture's Ray starts its workers at Ray's default (15); the tasks run at the default
    of trace-tools (0: this test runs as root, allowed to lower it) or at TRACE_TOOLS_RAY_NICE."""
    from trace_tools.replay.executors import RAY_NICE

    if os.geteuid() == 0:
        result = replay(simulated_dump, out=tmp_path / "default", strategies=["tree"], executor="ray", workers=2)
        assert result.ray["niceness"] == [RAY_NICE] == [0]
    monkeypatch.setenv("TRACE_TOOLS_RAY_NICE", "17")
    result = replay(simulated_dump, out=tmp_path / "nice", strategies=["tree"], executor="ray", workers=2)
    assert result.ray["niceness"] == [17]
    monkeypatch.setenv("TRACE_TOOLS_RAY_NICE", "high")
    with pytest.raises(UsageError, match="TRACE_TOOLS_RAY_NICE=high is not a niceness; set an integer from -20 to 19"):
        replay(simulated_dump, out=tmp_path / "bad", strategies=["tree"], executor="ray", workers=2)
