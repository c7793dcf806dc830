"""Where sessions are replayed: in this process, in a local process pool, or on a Ray cluster.

Every executor maps the same `SessionReplayer` over the session stream and yields results in
submission order, keeping a bounded number of sessions in flight, so memory follows the
concurrency and the run directory does not depend on the executor or the worker count.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Iterable, Iterator

from trace_tools.data import Session
from trace_tools.errors import TraceToolsError
from trace_tools.io.rundir import SessionRows
from trace_tools.replay.session import ReplayOptions, SessionReplayer

EXECUTORS = ("local", "ray")
IN_FLIGHT_PER_WORKER = 2


def default_workers() -> int:
    """`$TRACE_TOOLS_WORKERS` when set, else the machine's cores (what this process may use)."""
    if os.environ.get("TRACE_TOOLS_WORKERS", "").isdigit():
        return max(1, int(os.environ["TRACE_TOOLS_WORKERS"]))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def run_sessions(
    sessions: Iterable[Session],
    options: ReplayOptions,
    workers: int,
    executor: str = "local",
    address: str | None = None,
) -> Iterator[SessionRows]:
    """Replay `sessions` and yield their rows in the same order."""
    if executor not in EXECUTORS:
        raise TraceToolsError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")
    if workers < 1:
        raise TraceToolsError(f"--workers must be at least 1 (got {workers})")
    if executor == "ray":
        return _ray(sessions, options, workers, address)
    if workers == 1:
        return map(SessionReplayer(options), sessions)
    return _pool(sessions, options, workers)


# -- local process pool --------------------------------------------------------------------------
_WORKER: SessionReplayer | None = None


def _init_worker(options: ReplayOptions) -> None:
    global _WORKER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _WORKER = SessionReplayer(options)


def _replay_in_worker(session: Session) -> SessionRows:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER(session)


def _pool(sessions: Iterable[Session], options: ReplayOptions, workers: int) -> Iterator[SessionRows]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # spawn, not fork: the parent runs Arrow's and the tokenizers' threads, which fork would copy
    # in whatever state they are in.
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(options,)) as pool:
            pending: deque = deque()
            for session in sessions:
                pending.append(pool.submit(_replay_in_worker, session))
                if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
    except BrokenProcessPool:
        raise TraceToolsError(
            "a worker process died (out of memory, or a program started from stdin that "
            "worker processes cannot re-import); rerun with --workers 1, or fewer workers; "
            "finished shards are kept and the rerun resumes"
        ) from None


# -- Ray -------------------------------------------------------------------------------------------
def _ray(
    sessions: Iterable[Session], options: ReplayOptions, workers: int, address: str | None
) -> Iterator[SessionRows]:
    try:
        import ray
    except ImportError:
        raise TraceToolsError('--executor ray needs Ray; install it with `pip install "trace-tools[ray]"`') from None
    if not ray.is_initialized():
        # With an address the cluster decides the CPUs; None is ray.init's own default.
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, num_cpus=None if address else workers)
    task = ray.remote(_ray_replay)
    shared = ray.put(options)
    pending: deque = deque()
    limit = workers * IN_FLIGHT_PER_WORKER
    for session in sessions:
        pending.append(task.remote(shared, session))
        if len(pending) >= limit:
            yield ray.get(pending.popleft())
    while pending:
        yield ray.get(pending.popleft())


_RAY_REPLAYERS: dict[str, SessionReplayer] = {}


def _ray_replay(options: ReplayOptions, session: Session) -> SessionRows:
    """Runs in a Ray worker: one replayer (and its renderers) per worker process and options."""
    replayer = _RAY_REPLAYERS.get(options.key())
    if replayer is None:
        replayer = _RAY_REPLAYERS[options.key()] = SessionReplayer(options)
    return replayer(session)
