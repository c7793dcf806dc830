"""Where sessions are replayed: in this process, in a local process pool, or on a Ray cluster.

Every executor maps the same `SessionReplayer` over the session stream and yields results in
submission order, keeping a bounded number of sessions in flight, so memory follows the
concurrency and the run directory does not depend on the executor or the worker count.
"""

from __future__ import annotations

import multiprocessing.context
import os
import sys
from collections import deque
from contextlib import contextmanager
from types import FrameType
from typing import Any, Iterable, Iterator

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
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # spawn, not fork: the parent runs Arrow's and the tokenizers' threads, which fork would copy
    # in whatever state they are in.
    context = _WithoutMain() if _main_not_reimportable() else multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(options,))
    try:
        pending: deque = deque()
        for session in sessions:
            with _interrupts_held():  # a worker may be started here
                pending.append(pool.submit(_replay_in_worker, session))
            if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool:
        _stop(pool)
        raise TraceToolsError(
            "a worker process died (out of memory, or killed); rerun with --workers 1, or fewer workers; "
            "finished shards are kept and the rerun resumes"
        ) from None
    except BaseException:  # Ctrl-C, or the caller stopped reading: the workers go at once
        _stop(pool)
        raise
    pool.shutdown()


def _main_not_reimportable() -> bool:
    """True when a spawned worker must not import the program's main module, as spawn does: it
    was read from stdin (there is no file), or this call runs at the top level of the script
    outside an `if __name__ == "__main__":` block, so importing it would start the replay again
    in every worker. The workers need nothing from it (they run trace-tools functions only)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(getattr(main, "__spec__", None), "name", None):
        return False  # -c, a notebook or `python -m`: spawn imports nothing from a script
    if not os.path.isfile(path):
        return True
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            return not _under_main_guard(path, frame.f_lineno)
        frame = frame.f_back
    return False


def _under_main_guard(path: str, line: int) -> bool:
    """Whether `line` of the script lies in a top-level `if __name__ == "__main__":` block."""
    import ast

    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) and "__name__" in ast.unparse(node.test):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                return True
    return False


@contextmanager
def _main_hidden() -> Iterator[None]:
    """Spawn's preparation reads `__main__.__spec__` and `__file__` to re-import it in the child;
    without them it imports nothing."""
    main = sys.modules["__main__"]
    saved: dict[str, Any] = {name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


class _ProcessWithoutMain(multiprocessing.context.SpawnProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 - multiprocessing's name
        with _main_hidden():
            return multiprocessing.context.SpawnProcess._Popen(process_obj)


class _WithoutMain(multiprocessing.context.SpawnContext):
    """The spawn context, whose workers start without importing the main module."""

    Process = _ProcessWithoutMain


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Block SIGINT while worker processes may be started: they inherit the blocked mask, so a
    Ctrl-C reaches this process alone (which stops them) instead of interrupting each worker's
    start-up with a traceback; here it is delivered as soon as the block ends."""
    import signal

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _stop(pool: Any) -> None:
    """Cancel what is queued and end the workers without waiting for their sessions."""
    pool.shutdown(wait=False, cancel_futures=True)
    for process in list((getattr(pool, "_processes", None) or {}).values()):  # no public way before 3.14
        process.terminate()


# -- Ray -------------------------------------------------------------------------------------------
def _ray(
    sessions: Iterable[Session], options: ReplayOptions, workers: int, address: str | None
) -> Iterator[SessionRows]:
    try:
        import ray
    except ImportError:
        raise TraceToolsError('--executor ray needs Ray; install it with `pip install "trace-tools[ray]"`') from None
    if not ray.is_initialized():
        _check_reachable(address)
        # With an address the cluster decides the CPUs; None is ray.init's own default.
        try:
            ray.init(
                address=address, ignore_reinit_error=True, log_to_driver=False, num_cpus=None if address else workers
            )
        except Exception as error:  # Ray raises ConnectionError, ValueError, RuntimeError, its own types...
            raise TraceToolsError(_ray_start_failed(address, error)) from None
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


def _check_reachable(address: str | None) -> None:
    """Ray retries an address nothing answers on for minutes; one TCP connection says so at once."""
    import socket

    host, _, port = (address or "").removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # no address (a local Ray), `auto`, or a form Ray itself will judge
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as error:
        raise TraceToolsError(
            f"cannot reach the Ray cluster at --address {address} ({error.strerror or error}); "
            "check that the cluster is running and reachable from here, or drop --address to start a local Ray"
        ) from None


def _ray_start_failed(address: str | None, error: Exception) -> str:
    """One line saying why Ray did not start or connect, and what to do about it."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    where = f"the Ray cluster at --address {address}" if address else "a local Ray"
    if any(word in reason.lower() for word in ("authenticat", "token")):
        fix = (
            "the cluster requires an auth token: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (see `ray get-auth-token`)"
        )
    elif address:
        fix = "check that the cluster is running and reachable from here, or drop --address to start a local Ray"
    else:
        fix = "use --executor local"
    return f"could not start {where} ({reason}); {fix}"


_RAY_REPLAYERS: dict[str, SessionReplayer] = {}


def _ray_replay(options: ReplayOptions, session: Session) -> SessionRows:
    """Runs in a Ray worker: one replayer (and its renderers) per worker process and options."""
    replayer = _RAY_REPLAYERS.get(options.key())
    if replayer is None:
        replayer = _RAY_REPLAYERS[options.key()] = SessionReplayer(options)
    return replayer(session)
