"""`reconstruct` on several processes: each worker reads its own sessions' row groups, checks
their rows as the stream does and compares their renders with the recorded prompts; the calling
process only plans the tasks and gathers the turns' rows, in the order one process gives them
(docs/pipeline.md#reconstruct-on-every-core).

The workers fork once the dump's footers are read and every renderer's encoder is built
(`RendererPool.preload`), so they share it; where they cannot fork (another thread runs, not
Linux) they are spawned and build their own.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from trace_tools.collector import session_done
from trace_tools.data import Session
from trace_tools.io.load import DumpContext, SessionSlot, read_row_group, read_session
from trace_tools.pipeline import Pipeline, RendererPool
from trace_tools.process_pool import WorkerPool, can_fork, default_workers
from trace_tools.reconstruct.rows import session_turn_rows

# A dump of fewer turns reconstructs in this process by default: starting workers costs more than
# they win back. Fitted on the benchmark's 2-core machine (docs/performance.md): forked workers
# break even at about 300 to 450 turns; spawned ones, which import the libraries and build their
# encoder again, were still slower at 1,185 turns (1.8 s against 1.6).
SMALL_RECONSTRUCT = {"fork": 400, "spawn": 4_000}
TASK_TURNS = 256  # the most turns a task holds once it holds more than one session
TASKS_PER_WORKER = 2  # tasks are made small enough that each worker gets this many more


def auto_workers(rows: int) -> int:
    """`process_pool.default_workers()`, except 1 for a dump of fewer than `SMALL_RECONSTRUCT`
    turns (`rows`, from the Parquet footers), unless `$TRACE_TOOLS_WORKERS` says otherwise."""
    if os.environ.get("TRACE_TOOLS_WORKERS", "").isdigit():
        return default_workers()
    return 1 if rows < SMALL_RECONSTRUCT["fork" if can_fork() else "spawn"] else default_workers()


@dataclass(frozen=True)
class _Setup:
    """What a worker builds its renderers from where it was spawned (a forked one has the calling
    process's, encoders built: `_FORKED_POOL`), and how messages are canonicalized. A caller's
    own renderer object is not in it: only forked workers share one (`reconstruct`)."""

    tokenizer: str | None
    chat_template: str | None
    tool_format: str | None
    render_path: str
    resolved: dict[tuple, Any]
    canonicalization: str

    @classmethod
    def of(cls, pool: RendererPool, canonicalization: str) -> "_Setup":
        return cls(
            pool.tokenizer,
            pool.chat_template,
            pool.tool_format,
            pool.render_path,
            pool.resolved,
            canonicalization,
        )

    def pool(self) -> RendererPool:
        return RendererPool(self.tokenizer, self.chat_template, None, self.tool_format, self.render_path, self.resolved)


@dataclass
class Gathered:
    """The turns' rows of every session reconstructed, in the order one process gives them; the
    sessions quarantined; the renderers' identities (keyed as `reconstruct` keys them); each
    worker's render counters (`RendererPool.render_stats`, summed)."""

    rows: list[dict[str, Any]]
    quarantined: set[str]
    identities: dict[str, Any]
    render_stats: dict[str, int]


_FORKED_POOL: RendererPool | None = None  # set while the workers fork: theirs, encoders built
_WORKER_POOL: RendererPool | None = None  # a worker's, once it has one


def reconstruct_in_workers(
    pipeline: Pipeline, workers: int, canonicalization: str, progress: Callable[[int, int], None] | None
) -> Gathered:
    """Every session of `pipeline` (opened, not iterated) reconstructed on `workers` processes."""
    global _FORKED_POOL
    stream = pipeline.stream
    slots = list(stream.slots())
    context = stream.context()
    gathered = Gathered([], {slot.session_id for slot in slots if slot.problems}, {}, {})
    done = len(gathered.quarantined)
    todo = [slot for slot in slots if not slot.problems]
    if not todo:  # every session quarantined by pass 1: nothing for a worker to do
        return gathered
    workers = min(workers, len(todo))  # a worker per session at most: many cores, few sessions
    if can_fork():  # the workers will share what is built now; spawned ones build their own
        pipeline.renderers.preload()
    setup = _Setup.of(pipeline.renderers, canonicalization)
    _FORKED_POOL = pipeline.renderers
    try:
        pool = WorkerPool(workers)
    finally:
        _FORKED_POOL = None
    stats: dict[int, dict[str, int]] = {}  # worker pid → its counters so far (each worker's run)
    tasks = ((context, batch, setup) for batch in _batches(todo, workers))
    for task in pool.ordered(_reconstruct_slots, tasks, died="rerun with --workers 1, or fewer workers"):
        gathered.rows += task.rows
        gathered.quarantined.update(task.quarantined)
        for key, identity in task.identities.items():
            gathered.identities.setdefault(key, identity)
        stats[task.worker] = task.render_stats
        done += task.sessions
        if progress:
            progress(done, stream.session_count)
    total: Counter = Counter()  # summed as `RendererPool.render_stats` sums its renderers'
    for counters in stats.values():
        total.update(counters)
    gathered.render_stats = dict(total)
    return gathered


def _batches(slots: list[SessionSlot], workers: int) -> Iterator[list[SessionSlot]]:
    """Consecutive sessions, one task each: one session, and more while their turns stay within
    the share of the turns left that gives every worker `TASKS_PER_WORKER` more tasks (and within
    `TASK_TURNS`). So the tasks shrink towards the end, and the last are single sessions: no
    worker waits long for another's last task. A row group two tasks share is read by both."""
    left = sum(slot.rows for slot in slots)
    batch: list[SessionSlot] = []
    turns = 0
    for slot in slots:
        if batch and turns + slot.rows > min(TASK_TURNS, left // (workers * TASKS_PER_WORKER)):
            yield batch
            left -= turns
            batch, turns = [], 0
        batch.append(slot)
        turns += slot.rows
    if batch:
        yield batch


@dataclass
class _Task:
    """What a task sends back: its sessions' turns' rows, the sessions quarantined while reading,
    the renderers' identities, how many sessions it had, and its worker's pid and render counters
    so far."""

    rows: list[dict[str, Any]]
    quarantined: list[str]
    identities: dict[str, Any]
    sessions: int
    worker: int
    render_stats: dict[str, int]


def _reconstruct_slots(context: DumpContext, slots: list[SessionSlot], setup: _Setup) -> _Task:
    """A task, in a worker: read, check and reconstruct each slot's session."""
    global _WORKER_POOL
    if _WORKER_POOL is None:
        _WORKER_POOL = _FORKED_POOL if _FORKED_POOL is not None else setup.pool()
    task = _Task([], [], {}, len(slots), os.getpid(), {})
    parts = _read_parts(context, slots)
    for slot in slots:
        # Recorded ids stay int32 arrays: `reconstruct.rows.Comparison` compares them as such.
        item = read_session(context, slot, parts.pop(slot.position), id_arrays=True)
        if isinstance(item, Session):
            task.rows += session_turn_rows(item, _WORKER_POOL, setup.canonicalization, task.identities)
            session_done()
        else:
            task.quarantined.append(slot.session_id)
    task.render_stats = _WORKER_POOL.render_stats()
    return task


def _read_parts(context: DumpContext, slots: list[SessionSlot]) -> dict[int, list[Any]]:
    """Each slot's rows, one table per row group it spans (in file order, as `read_session`
    takes them); each row group is read once for all the slots in it."""
    readers: dict[tuple[int, int], list[SessionSlot]] = {}
    for slot in slots:
        for group in slot.row_groups:
            readers.setdefault(group, []).append(slot)
    parts: dict[int, list[Any]] = {slot.position: [] for slot in slots}
    for group in sorted(readers):  # file order: a slot's tables in the order of its row groups
        users = readers[group]
        for slot, table in zip(users, read_row_group(context, *group, [user.session_id for user in users])):
            parts[slot.position].append(table)
    return parts
