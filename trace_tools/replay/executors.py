"""Where sessions are replayed: in this process, in a local process pool, or on a Ray cluster.

Locally (`run_sessions`), the driver reads the sessions (pass 2 of the stream) and every executor
maps the same `SessionReplayer` over them, yielding results in submission order with a bounded
number of sessions in flight.

On Ray (`ray_results`), the driver reads nothing but the session index (pass 1). A session task
gets a few `SessionSlot`s (each session's position and where its rows are) and references to
their rows, which loader tasks read on the workers, each row group once for all the sessions it
holds (decoding a row group is most of reading it); the task checks the rows exactly as the
stream would (`io.load.read_session`) and replays them. The tasks kept in flight follow the
cluster's CPUs (`ray.cluster_resources()`, re-read as the cluster grows or shrinks); a task takes
several sessions while their turns (counted by pass 1) are a small share of the turns left, so
Ray's cost per task is shared by many short sessions and the end of the run still spreads
evenly. Results are taken as they finish, tagged with their positions, and the engine's shard
writer puts them back in stream order; a task may start at most a window of tasks after the
oldest unfinished one, which bounds what waits there. A task whose worker process or node dies
is retried (`RAY_RETRIES`); replay is deterministic, so a retry gives the same rows.

Either way the run directory does not depend on the executor or the worker count.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Iterator

from trace_tools.data import Session
from trace_tools.errors import TraceToolsError, UnusableInput, UsageError, install_hint
from trace_tools.io.load import DumpContext, SessionSlot, read_row_group, read_session
from trace_tools.io.rundir import SessionRows
from trace_tools.process_pool import IN_FLIGHT_PER_WORKER, can_fork, default_workers
from trace_tools.replay.local_pool import WorkerPool
from trace_tools.replay.session import ReplayOptions, SessionReplayer

EXECUTORS = ("local", "ray")
RAY_RETRIES = 3  # further attempts of a task whose worker process or node died
REORDER_WINDOW_PER_CPU = 4  # how many tasks a finished one may be ahead of the oldest unfinished one
TASKS_PER_CPU = 2  # a task takes more than one session only while the turns left give each CPU this many tasks
TURNS_PER_TASK = 256  # at most, once a task holds more than one session
CLUSTER_CHECK_S = 5.0  # how often the cluster's CPUs are read again
RAY_NICE = 0  # the niceness Ray tasks run at unless $TRACE_TOOLS_RAY_NICE says otherwise (Ray's own default is 15)


def ray_niceness() -> int:
    """`$TRACE_TOOLS_RAY_NICE` (-20..19) when set, else `RAY_NICE`: the priority of the Ray tasks."""
    text = os.environ.get("TRACE_TOOLS_RAY_NICE", "").strip()
    if not text:
        return RAY_NICE
    if not text.lstrip("-").isdigit() or not -20 <= int(text) <= 19:
        raise UsageError(f"TRACE_TOOLS_RAY_NICE={text} is not a niceness; set an integer from -20 to 19 (default 0)")
    return int(text)


# A local dump whose replay is small replays in this process by default: starting the worker pool
# costs time that a small replay never wins back. A replay's work is counted in turn-strategies,
# a turn's shared reading and reconstruction counting as some strategies; a replay is small under
# a threshold of that work. Both are fitted, for each way of starting workers, to where two
# workers start to pay on a 2-core machine (docs/scale.md#streaming-sessions-every-core-ray):
# forked workers start in milliseconds and pay from about 700 turns of one strategy and 150 of
# all twelve; spawned ones import the libraries again (seconds), from about 1,200 and 450.
SMALL_REPLAY = {"fork": (2, 2_200), "spawn": (6, 8_500)}  # start method → (shared turn work, small work)


def auto_workers(dump: Any, strategies: int) -> int:
    """`default_workers()`, except 1 for a local dump whose replay of `strategies` strategies is
    small: `turns × (shared + strategies) < small` (turns: rows, read from the Parquet footers;
    `SMALL_REPLAY` of the start method `process_pool.can_fork` picks), when `$TRACE_TOOLS_WORKERS`
    does not say otherwise."""
    if os.environ.get("TRACE_TOOLS_WORKERS", "").isdigit() or not isinstance(dump, Path):
        return default_workers()
    import pyarrow.parquet as pq

    files = sorted(dump.rglob("*.parquet")) if dump.is_dir() else [dump]
    try:
        rows = sum(pq.read_metadata(file).num_rows for file in files)
    except (OSError, ValueError):  # not Parquet: the loader says so with its own message
        return default_workers()
    shared, small = SMALL_REPLAY["fork" if can_fork() else "spawn"]
    return 1 if rows * (shared + strategies) < small else default_workers()


def check_executor(executor: str, workers: int) -> None:
    if executor not in EXECUTORS:
        raise TraceToolsError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")
    if workers < 1:
        raise TraceToolsError(f"--workers must be at least 1 (got {workers})")


def run_sessions(
    sessions: Iterable[Session],
    options: ReplayOptions,
    workers: int,
    owns_process: bool = False,
    resolved: dict[tuple, Any] | None = None,
    pool: "WorkerPool | None" = None,
) -> Iterator[SessionRows]:
    """Replay `sessions` on this machine (`workers` processes; 1 = this one) and yield their rows
    in the same order. Worker processes run with the cyclic collector off (`trace_tools.collector`);
    this process pauses it during each session only when the caller owns it (`owns_process`: the
    command line, whose run keeps it off throughout, `replay.engine`). `resolved`: the
    render specs the run already resolved (`RendererPool.resolved`), handed to every replayer.
    `pool`: the run's workers, started earlier (`started_workers`); else they start here."""
    check_executor("local", workers)
    if workers == 1:
        results = map(SessionReplayer(options, pause_gc=owns_process, resolved=resolved), sessions)
        return _samples_packed_beside(results) if options.write_samples else results
    return (pool or WorkerPool(workers)).replay(sessions, options, resolved or {})


def _samples_packed_beside(results: Iterator[SessionRows]) -> Iterator[SessionRows]:
    """`results`, each session's samples stream (`SessionRows.samples_stream`, the compressed IPC
    the shard stores) made on a thread of its own while the next session replays, and each
    session's rows handed on once that is done: one session later than they come. Arrow compresses
    without holding the GIL, and on the main thread each release let the run's other threads
    (reading ahead, encoding the samples part) take it: taking it back cost the replay more than
    the compression itself (0.26 s under cProfile of a 3.3 s `-s tree` run of the benchmark, whose
    samples compress in about 0.03 s; docs/performance.md#samples-packed-beside-the-replay)."""
    with ThreadPoolExecutor(1, thread_name_prefix="trace-tools-samples-pack") as packer:
        waiting: tuple[SessionRows, Future] | None = None
        for rows in results:
            packed = packer.submit(rows.samples_stream)
            if waiting is not None:
                yield _with_stream(*waiting)
            waiting = (rows, packed)
        if waiting is not None:
            yield _with_stream(*waiting)


def _with_stream(rows: SessionRows, packed: Future) -> SessionRows:
    rows.samples_ipc = packed.result()  # the table stays too: the samples part encodes from it
    return rows


# -- Ray -------------------------------------------------------------------------------------------
class RayStats:
    """What a Ray replay moved and where it ran: bytes of task arguments the driver sent, bytes of
    rows the session tasks received (from loader tasks, worker to worker), bytes of results the
    driver received (Arrow buffers), the tasks' CPU and the nodes that ran them."""

    def __init__(self) -> None:
        self.sent_bytes = 0
        self.rows_bytes = 0
        self.received_bytes = 0
        self.tasks = 0
        self.worker_cpu_s = 0.0
        self.nodes: set[str] = set()
        self.niceness: set[int] = set()  # what the session tasks ran at (`ray_niceness`)
        self.largest_read_rows = 0  # the most rows one loader task read (a row group, or a range of a large one)


def ray_results(
    slots: Iterable[SessionSlot],
    context: DumpContext,
    options: ReplayOptions,
    workers: int,
    address: str | None,
    stats: RayStats | None = None,
) -> Iterator[tuple[int, SessionRows]]:
    """(position, rows) of every slot, as they finish (see the module docstring). A slot whose
    session pass 1 already quarantined yields its entries without a task."""
    nice = ray_niceness()
    ray = _connect(workers, address, nice)
    yield from _RayReplay(ray, context, options, stats or RayStats(), nice).results(slots)


def _connect(workers: int, address: str | None, nice: int = RAY_NICE) -> Any:
    try:
        import ray
    except ImportError:
        raise TraceToolsError(f"--executor ray needs Ray: {install_hint('ray')}") from None
    if not ray.is_initialized():
        _check_reachable(address)
        # With an address the cluster decides the CPUs; None is ray.init's own default.
        try:
            # A Ray started here runs its workers at `nice`; a cluster's are set by each task (`_renice`).
            ray.init(
                address=address,
                ignore_reinit_error=True,
                log_to_driver=False,
                num_cpus=None if address else workers,
                _system_config=None if address else {"worker_niceness": nice},
            )
        except (ConnectionError, ValueError, RuntimeError, ray.exceptions.RayError) as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UsageError(
                f"cannot start or reach Ray at {address or 'a local instance'} ({reason}); check --address, and "
                "RAY_AUTH_TOKEN where the cluster uses token authentication (`ray get-auth-token` on the head)"
            ) from None
    return ray


def _check_reachable(address: str | None) -> None:
    """Ray retries an address nothing answers on for minutes; one TCP connection says so at once."""

    host, _, port = (address or "").removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # no address (a local Ray), `auto`, or a form Ray itself will judge
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as error:
        raise UsageError(
            f"cannot reach the Ray cluster at --address {address} ({error.strerror or error}); "
            "check that the cluster is running and reachable from here, or drop --address to start a local Ray"
        ) from None


_REMOTE_FUNCTIONS: list[Any] = []


def _remote_functions(ray: Any) -> list[Any]:
    """The loader and the session task as Ray remote functions, made once per process: Ray
    pickles and exports a remote function on its first call in each job, so a driver that
    replays again (a notebook, a benchmark) does not pay that again."""
    if not _REMOTE_FUNCTIONS:
        _REMOTE_FUNCTIONS.extend(ray.remote(max_retries=RAY_RETRIES)(task) for task in (_read_rows, _replay_slots))
    return _REMOTE_FUNCTIONS


class _RayReplay:
    def __init__(self, ray: Any, context: DumpContext, options: ReplayOptions, stats: RayStats, nice: int):
        self.ray, self.stats, self.nice, self.pieces = ray, stats, nice, context.pieces
        self.context, self.options = ray.put(context), ray.put(options)
        self.reader, self.replayer = _remote_functions(ray)
        self.users: dict[tuple[int, int], list[SessionSlot]] = {}  # row group → the slots reading it
        self.slices: dict[tuple[int, int], dict[int, Any]] = {}  # row group → position → its rows, not yet handed on
        self.unsent = 0  # turns of the sessions not yet in a task
        self._cpus, self._checked = 1, 0.0

    def results(self, slots: Iterable[SessionSlot]) -> Iterator[tuple[int, SessionRows]]:
        todo = deque(slots)
        for slot in todo:
            self.unsent += 0 if slot.problems else slot.rows
            for group in slot.row_groups:
                self.users.setdefault(group, []).append(slot)
        running: dict[Any, tuple[int, list[SessionSlot]]] = {}  # task → (its number, its slots), in submission order
        submitted = 0
        while todo or running:
            while todo and self._room(running, submitted):
                if todo[0].problems:
                    slot = todo.popleft()
                    yield slot.position, SessionRows.quarantined(slot.problems)
                    continue
                batch = self._batch(todo)
                running[self._submit(batch)] = (submitted, batch)
                submitted += 1
            if running:
                (done,), _ = self.ray.wait(list(running), num_returns=1)
                _, batch = running.pop(done)
                for slot, rows in zip(batch, self._collect(done, batch)):
                    yield slot.position, rows

    def _room(self, running: dict[Any, tuple[int, list[SessionSlot]]], submitted: int) -> bool:
        """Another task fits: fewer in flight than the cluster keeps busy, and not too many tasks
        after the oldest unfinished one (the shard writer keeps every later result until it is in)."""
        if not running:
            return True
        cpus = self._cluster_cpus()
        oldest, _ = next(iter(running.values()))
        return len(running) < cpus * IN_FLIGHT_PER_WORKER and submitted - oldest < cpus * REORDER_WINDOW_PER_CPU

    def _batch(self, todo: deque[SessionSlot]) -> list[SessionSlot]:
        """The next sessions for one task, in order: one, and more while their turns stay within
        the share of the turns left that keeps every CPU TASKS_PER_CPU tasks busy (and within
        TURNS_PER_TASK). Each task costs the driver about as much as a session of tens of turns
        costs a worker, so many short sessions go together, long ones alone, and the last tasks of
        a run are single sessions; a session pass 1 quarantined ends the batch."""
        size = min(TURNS_PER_TASK, self.unsent // (self._cluster_cpus() * TASKS_PER_CPU))
        batch = [todo.popleft()]
        turns = batch[0].rows
        while todo and not todo[0].problems and turns + todo[0].rows <= size:
            turns += todo[0].rows
            batch.append(todo.popleft())
        self.unsent -= turns
        return batch

    def _cluster_cpus(self) -> int:
        now = time.monotonic()
        if now - self._checked > CLUSTER_CHECK_S:
            self._cpus = max(1, int(self.ray.cluster_resources().get("CPU", 1)))
            self._checked = now
        return self._cpus

    def _submit(self, batch: list[SessionSlot]) -> Any:
        parts = [self._rows(group, slot) for slot in batch for group in slot.row_groups]
        self._count_sent(batch, len(parts) + 2)
        return self.replayer.remote(self.options, self.context, self.nice, batch, *parts)

    def _rows(self, group: tuple[int, int], slot: SessionSlot) -> Any:
        """The reference to `slot`'s rows in row group `group`; the first slot that needs the group
        has one loader task read it for every slot that does."""
        if group not in self.slices:
            users = self.users.pop(group)
            ids = [user.session_id for user in users]
            self._count_sent((group, ids), 1)
            self.stats.largest_read_rows = max(self.stats.largest_read_rows, self.pieces[group[0]][group[1]][2])
            refs = self.reader.options(num_returns=len(users)).remote(self.context, self.nice, group[0], group[1], ids)
            self.slices[group] = dict(zip((user.position for user in users), refs if len(users) > 1 else [refs]))
        waiting = self.slices[group]
        ref = waiting.pop(slot.position)
        if not waiting:
            del self.slices[group]  # the driver holds no reference: Ray frees the rows after their task
        return ref

    def _count_sent(self, arguments: Any, references: int) -> None:
        """Bytes of a task's arguments: its inline values as pickled, and object ids (28 bytes)."""
        self.stats.sent_bytes += len(pickle.dumps(arguments, protocol=5)) + 28 * references
        self.stats.tasks += 1

    def _collect(self, done: Any, batch: list[SessionSlot]) -> list[SessionRows]:
        from ray.exceptions import RayTaskError

        try:
            results, niceness = self.ray.get(done)
        except RayTaskError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, UnusableInput):
                raise UnusableInput(
                    f"{cause} (read on a Ray worker: every node must reach the dump, e.g. an s3:// URI)"
                ) from None
            raise
        except self.ray.exceptions.RayError as error:  # a worker or node died more than RAY_RETRIES times
            raise TraceToolsError(
                f"session {batch[0].session_id}: its Ray task failed {RAY_RETRIES + 1} times "
                f"({type(error).__name__}: a worker process or node died, out of memory?); "
                "finished shards are kept and rerunning the command resumes"
            ) from None
        self.stats.niceness.add(niceness)
        for rows in results:
            self.stats.worker_cpu_s += rows.cpu_s
            self.stats.nodes.add(rows.node)
            self.stats.rows_bytes += rows.input_bytes
            received = sum(buffer.size for buffer in rows.tables.values())
            self.stats.received_bytes += received + (rows.samples_ipc.size if rows.samples_ipc is not None else 0)
        return results


# Runs in Ray workers: one replayer (and its renderers) per worker process and options.
_RAY_REPLAYERS: dict[str, SessionReplayer] = {}


def _renice(nice: int) -> int:
    """Run this worker process at `nice` where allowed (raising it always is; lowering it needs
    privileges, else Ray's own setting, `RAY_worker_niceness`, decides); returns what it runs at."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) != nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    except (PermissionError, AttributeError):  # not permitted, or not on a POSIX system
        pass
    return os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else nice


def _read_rows(context: DumpContext, nice: int, number: int, group: int, session_ids: list[str]) -> Any:
    _renice(nice)
    tables = read_row_group(context, number, group, session_ids)
    return tables if len(tables) > 1 else tables[0]  # one object per return, as num_returns says


def _replay_slots(
    options: ReplayOptions, context: DumpContext, nice: int, slots: list[SessionSlot], *parts: Any
) -> tuple[list[SessionRows], int]:
    """A task: read, check and replay each slot's session (`parts` are their rows, slot by slot),
    at niceness `nice`; returns their rows and the niceness it ran at."""
    import ray

    niceness = _renice(nice)
    replayer = _RAY_REPLAYERS.get(options.key())
    if replayer is None:
        replayer = _RAY_REPLAYERS[options.key()] = SessionReplayer(options, pause_gc=True)
    node, results, start = ray.get_runtime_context().get_node_id(), [], 0
    for slot in slots:
        started = time.process_time()
        mine, start = parts[start : start + len(slot.row_groups)], start + len(slot.row_groups)
        item = read_session(context, slot, list(mine))
        rows = replayer(item) if isinstance(item, Session) else SessionRows.quarantined(item)
        rows.pack()
        rows.input_bytes = sum(part.nbytes for part in mine)
        rows.cpu_s, rows.node = time.process_time() - started, node
        results.append(rows)
    return results, niceness
