"""The worker processes of a local replay (`process_pool.WorkerPool`, forked once the run has
preloaded its renderers and before it starts a thread, or spawned), each building its replayer
from the first session it is sent (docs/pipeline.md#every-core-and-many-machines).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from trace_tools import process_pool
from trace_tools.collector import session_done
from trace_tools.data import Session
from trace_tools.io.cache import WARNED_VAR
from trace_tools.io.id_columns import ShippedSession
from trace_tools.io.rundir import SessionRows
from trace_tools.replay.session import ReplayOptions, SessionReplayer

_WORKER: SessionReplayer | None = None


def _replay_in_worker(shipped: ShippedSession, setup: "_Setup") -> SessionRows:
    """A session as the driver sent it (token ids as int32 arrays: plain bytes to pickle, each
    prompt as what it adds to the one before, `ShippedSession`), replayed (which makes its ids the
    data model's `list[int]`: `SessionReplayer`); its rows go back packed
    (`SessionRows.pack`), the samples as the compressed IPC stream the shard stores as it is,
    about a hundredth of the table's size. The worker's replayer is built on its first session,
    from `setup` as the run settled it: a forked worker starts before the run has resolved its
    render specs or made its template path absolute."""
    global _WORKER
    if _WORKER is None:
        os.environ.update(setup.environment)
        _WORKER = SessionReplayer(setup.options, pause_gc=True, resolved=setup.resolved)
    rows = _WORKER(shipped.session).pack()
    session_done()
    return rows


@dataclass(frozen=True)
class _Setup:
    """What a worker's replayer is built from: the run's options, the render specs its preflight
    resolved, and the variables the driver set since (`cache.WARNED_VAR`: a forked worker has the
    driver's environment as it was at the fork, and would warn again)."""

    options: ReplayOptions
    resolved: dict[tuple, Any]
    environment: dict[str, str]

    @classmethod
    def now(cls, options: ReplayOptions, resolved: dict[tuple, Any]) -> "_Setup":
        marked = os.environ.get(WARNED_VAR)
        return cls(options, resolved, {WARNED_VAR: marked} if marked is not None else {})


class WorkerPool(process_pool.WorkerPool):
    """The worker processes of a local replay, made before the run renders or reads ahead on a
    thread (`started_workers`), so that they fork. Either way the run directory
    is the same."""

    def replay(
        self, sessions: Iterable[Session], options: ReplayOptions, resolved: dict[tuple, Any]
    ) -> Iterator[SessionRows]:
        """Rows of `sessions` in their order (`process_pool.WorkerPool.ordered`); the sessions'
        reader is closed at the end."""
        tasks = ((ShippedSession(session), _Setup.now(options, resolved)) for session in sessions)
        died = "rerun with --workers 1, or fewer workers; finished shards are kept and the rerun resumes"
        return self.ordered(_replay_in_worker, tasks, died, source=sessions)


@contextmanager
def started_workers(workers: int) -> Iterator[WorkerPool | None]:
    """The worker pool of a local replay on `workers` > 1 processes (else None), made now so that
    its workers fork before the run starts any thread (`WorkerPool`), and stopped on the way out
    if the run did not reach the end of its sessions (a usage error found before, say)."""
    if workers < 2:
        yield None
        return
    pool = WorkerPool(workers)
    try:
        yield pool
    finally:
        pool.stop()
