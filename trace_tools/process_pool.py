"""Worker processes on this machine, for every command that spreads sessions over them (`replay`,
`reconstruct`): forked from the calling process where that is safe (Linux, one Python thread:
`can_fork`), spawned elsewhere, and stopped at once, without a traceback, on Ctrl-C
(docs/pipeline.md#every-core-and-many-machines). The tasks and what the workers build from them
are the commands' own (`replay.local_pool`, `reconstruct.workers`).
"""

from __future__ import annotations

import ast
import multiprocessing.context
import os
import signal
import sys
import threading
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from multiprocessing import resource_tracker
from types import FrameType
from typing import Any, Callable, Iterable, Iterator, NoReturn

from trace_tools.arrow_pool import arrow_without_pandas
from trace_tools.collector import off_for_good
from trace_tools.errors import TraceToolsError, UsageError

IN_FLIGHT_PER_WORKER = 2
MANAGER_EXIT_TIMEOUT_S = 10.0  # how long a stopped pool's manager thread gets to close its pipes
START_VARIABLE = "TRACE_TOOLS_WORKER_START"
START_METHODS = ("auto", "spawn")


def default_workers() -> int:
    """`$TRACE_TOOLS_WORKERS` when set, else the machine's cores (what this process may use)."""
    if os.environ.get("TRACE_TOOLS_WORKERS", "").isdigit():
        return max(1, int(os.environ["TRACE_TOOLS_WORKERS"]))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether worker processes may be forked from this one: on Linux, while this process runs no
    thread of Python's but its main one, unless `$TRACE_TOOLS_WORKER_START` is `spawn`. A fork
    copies only the thread calling it, and every lock another thread held stays held in the
    child; the native threads present by then (numpy's BLAS, Arrow's jemalloc) reset themselves
    in a child. A notebook's kernel or a service runs threads: it spawns."""
    method = os.environ.get(START_VARIABLE, "").strip() or "auto"
    if method not in START_METHODS:
        raise UsageError(f"{START_VARIABLE}={method} is not a start method; set one of: {', '.join(START_METHODS)}")
    return method == "auto" and sys.platform == "linux" and threading.active_count() == 1


def _init_worker() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    off_for_good()  # the process is the run's (`trace_tools.collector`)
    arrow_without_pandas()  # and uses no pandas


def _started() -> None:
    """A task that does nothing: submitting it makes a fork-started pool create its workers."""


class WorkerPool:
    """Worker processes, forked (`can_fork`) as soon as the pool is made, otherwise spawned, each
    when the first tasks reach it. A forked worker shares the modules, and whatever else, this
    process holds at that moment, where a spawned one imports them again (0.45 s of CPU each on
    the benchmark's machine, docs/performance.md): so a command makes its pool before it starts
    any thread, and after it has loaded what every worker needs."""

    def __init__(self, workers: int):
        if can_fork():
            self.context: _QuietFork | _QuietSpawn = _QuietFork()
        else:
            self.context = _QuietSpawn(hide_main=_main_not_reimportable())
        self.workers = workers
        self.executor = ProcessPoolExecutor(workers, mp_context=self.context, initializer=_init_worker)
        self.closed = False
        if isinstance(self.context, _QuietFork):
            try:
                # A fork context starts every worker, then its manager thread, at the first task.
                # Ctrl-C is held until all of them run, so that `stop` finds a whole pool to end.
                with interrupts_held():
                    self.executor.submit(_started)
            except BaseException:  # the Ctrl-C held back strikes here
                self.stop()
                raise

    def ordered(self, task: Callable[..., Any], arguments: Iterable[tuple], died: str, source: Any = None) -> Iterator:
        """`task(*each)` for each of `arguments`, run by the workers and handed back in order, at
        most `IN_FLIGHT_PER_WORKER` per worker queued; the pool is shut down when they are done,
        and stopped at once on an error. `died`: what to do when a worker process dies (the
        error's advice). `source`: what `arguments` reads, closed at the end (a thread reading
        ahead, an open file) when it has `close`."""
        try:
            pending: deque = deque()
            for each in arguments:
                pending.append(self.executor.submit(task, *each))
                if len(pending) >= self.workers * IN_FLIGHT_PER_WORKER:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool:
            self.stop()
            raise TraceToolsError(f"a worker process died (out of memory, or killed); {died}") from None
        except BaseException:  # Ctrl-C, or the caller stopped reading: the workers go at once
            self.stop()
            raise
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        self.executor.shutdown()
        self.closed = True

    def stop(self) -> None:
        """End the workers now, unless the pool was shut down already (`ordered` finished)."""
        if not self.closed:
            _stop(self.executor, self.context)
            self.closed = True


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


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C back while a child process is started, then deliver it (a worker here, a drawer
    in `report.plots`): the child inherits a blocked SIGINT, so a Ctrl-C reaches this process alone
    (which stops the children) instead of interrupting each child's start-up with a traceback, and
    this process is not interrupted half-way through sending a worker its arguments or recording a
    drawer's pid. Blocking the signal is not enough for the latter: another thread of this
    process takes it, and Python raises KeyboardInterrupt in the main thread all the same; so a
    handler records it meanwhile."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets Ctrl-C
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)


class _QuietProcess(multiprocessing.context.SpawnProcess):
    """A spawned worker that never sees Ctrl-C (`interrupts_held`), started without importing the
    program's main module where that would re-run it (`_main_not_reimportable`)."""

    hide_main = False
    held_popen: Any = None

    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 - multiprocessing's name
        # Spawning starts multiprocessing's resource tracker on first use, and that start unblocks
        # SIGINT on its way out, which the worker would inherit: start it first. (A forked pool
        # needs no tracker: its locks are unlinked at once, never registered.)
        resource_tracker.ensure_running()
        with interrupts_held(), _main_hidden() if process_obj.hide_main else nullcontext():
            # Kept before the block ends: a Ctrl-C held back strikes right then, before
            # multiprocessing records the child, and `_stop` must still find it.
            process_obj.held_popen = multiprocessing.context.SpawnProcess._Popen(process_obj)
            return process_obj.held_popen

    def _bootstrap(self, parent_sentinel: Any = None) -> int:
        """In the worker: run it, then exit without the interpreter's teardown. Freeing a worker's
        caches (every session's token lists, its tokenizer) object by object held the pool's
        shutdown, and so the end of the run, for about half a second. Multiprocessing's own exit
        work (the result queue flushed) has run inside `_bootstrap`; the exit handlers still run."""
        code = super()._bootstrap(parent_sentinel)  # type: ignore[misc]
        _exit_now(code)


def _exit_now(code: int) -> NoReturn:
    import atexit

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    atexit._run_exitfuncs()
    os._exit(code)


class _QuietSpawn(multiprocessing.context.SpawnContext):
    """Spawns `_QuietProcess`es and remembers every one it started."""

    def __init__(self, hide_main: bool) -> None:
        super().__init__()
        self.hide_main = hide_main
        self.started: list[_QuietProcess] = []

    def Process(self, *args: Any, **kwargs: Any) -> _QuietProcess:  # type: ignore[override]  # noqa: N802
        process = _QuietProcess(*args, **kwargs)
        process.hide_main = self.hide_main
        self.started.append(process)
        return process


class _QuietForkProcess(multiprocessing.context.ForkProcess):
    """A forked worker that never sees Ctrl-C: a fork pool starts all its workers at its first task,
    which `WorkerPool` submits with Ctrl-C held (`interrupts_held`), so each inherits a blocked
    SIGINT. It ends as every forked child of multiprocessing does, with `os._exit` after its work:
    the exit handlers it inherited are this process's, and none of them may run there."""

    held_popen: Any = None

    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 - multiprocessing's name
        # Kept as soon as it exists, for `_stop`: the held Ctrl-C strikes before the pool records it.
        process_obj.held_popen = multiprocessing.context.ForkProcess._Popen(process_obj)
        return process_obj.held_popen


class _QuietFork(multiprocessing.context.ForkContext):
    """Forks `_QuietForkProcess`es and remembers every one it started."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[_QuietForkProcess] = []

    def Process(self, *args: Any, **kwargs: Any) -> _QuietForkProcess:  # type: ignore[override]  # noqa: N802
        process = _QuietForkProcess(*args, **kwargs)
        self.started.append(process)
        return process


def _stop(pool: Any, context: "_QuietSpawn | _QuietFork") -> None:
    """Cancel what is queued and end the workers without waiting for their sessions, including
    one whose start a Ctrl-C cut short (the pool never learnt of it)."""
    manager, results = pool._executor_manager_thread, pool._result_queue  # shutdown forgets both
    pool.shutdown(wait=False, cancel_futures=True)
    started = [process.held_popen for process in context.started if process.held_popen is not None]
    for popen in started:
        if popen.poll() is None:
            popen.terminate()
    for popen in started:
        popen.wait(MANAGER_EXIT_TIMEOUT_S)
    # A worker ended while it sent a result leaves half a message in the results pipe, and the
    # manager thread waits for the rest. This process holds the pipe's writing end too, so neither
    # the rest nor an end of file would ever come: closing it, now that no worker is left to
    # write, ends that wait (the manager then finds the pool broken and cleans up).
    results._writer.close()
    # The pool's manager thread closes its wake-up pipe once it sees the workers gone. If it is
    # still at it when the interpreter exits, concurrent.futures' exit hook writes to that pipe
    # without a lock and prints an EBADF traceback; so let it finish first (quick: the workers
    # are terminated).
    if manager is not None and manager.ident is not None:  # started
        manager.join(timeout=MANAGER_EXIT_TIMEOUT_S)
