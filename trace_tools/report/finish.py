"""The end of a replay: summary, report.html, report.md and plots, from the run's merged tables.

`write_run_report(job)` writes them in this process. The command line hands the job to a helper
process instead (`ReportHelper`), started when the replay starts: it imports pandas, matplotlib
and the report's modules on the other core while the sessions replay, then, once handed the job,
draws the three figures in processes it forks while it builds the summary and the pages. The
replaying process never imports pandas (about 0.2 s of a 3 s run, docs/performance.md), and its
result is the same: the helper's summary comes back pickled, unchanged, and where the helper
cannot start or fails the report is written here instead.

Nothing at this module's top imports pandas or matplotlib.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from trace_tools.collector import off_for_good
from trace_tools.render.renderer import verify_summary

STOP_GRACE_S = 2.0  # how long an interrupted helper may take to end its drawers
# The forked helper's process name (`ps`, /proc/PID/comm): its command line is the replay's own.
HELPER_NAME = "tt-report"


@dataclass(frozen=True)
class RunFacts:
    """What the summary takes from the replay besides its tables (`report.aggregate`)."""

    session_count: int
    rows: int
    vocab_checked: bool
    data_warnings: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, loaded: Any) -> "RunFacts":
        warnings = getattr(loaded, "data_warnings", {}) or {}
        return cls(int(loaded.session_count), int(loaded.rows), bool(loaded.vocab_checked), dict(warnings))


@dataclass
class ReportJob:
    """Everything the end of a run needs, picklable: the helper is sent one."""

    run_dir: Path
    facts: RunFacts
    strategies: list[str]
    reconstruction: dict[str, Any]
    gathered: Any = None  # the sample bars gathered while the samples were written (`report.sample_bars`)


def write_run_report(job: ReportJob, fork_plots: bool = False) -> dict[str, Any]:
    """report.html, report.md and the plots of `job.run_dir`; returns the summary (summary.json is
    the caller's to write, last: it marks the run finished). `fork_plots`: draw every figure in a
    process forked from this one while the summary and the pages are built (the helper's way)."""
    from trace_tools.arrow_pool import pandas_interop
    from trace_tools.report.html import write_html_report
    from trace_tools.report.metrics import summarize_run
    from trace_tools.report.plots import FIGURES, PendingPlots, plot_tables
    from trace_tools.report.render import write_report

    pandas_interop()  # here too where the replay kept pyarrow from pandas (a helper that failed)
    run_dir = Path(job.run_dir)
    # One bounded pass over the merged tables each (summarize_run, plot_tables): the end of a
    # run holds sums and the sessions' ids, never the turns.
    fork = [name for name, _ in FIGURES] if fork_plots else []
    plots = PendingPlots(run_dir / "plots", plot_tables(run_dir), fork=fork)
    try:
        summary = summarize_run(run_dir, job.facts, job.strategies)
        summary["reconstruction"] = job.reconstruction
        drawn: list[str] = []
        write_html_report(
            run_dir, plots_drawn=lambda: drawn.extend(plots.result()), summary=summary, gathered=job.gathered
        )
        write_report(run_dir, summary, {}, drawn)
    finally:
        plots.close()
    return summary


def reconstruction_summary(stats: dict[str, int]) -> dict[str, Any]:
    """How the run's prompts were rendered: incrementally, or in full and why (`render.incremental`).

    `full_renders_by_reason["no_cached_prefix"]` counts the first render of each conversation;
    the other reasons are fallbacks from the incremental path (e.g. `history_rewrite` where a
    template re-renders earlier turns, `appended_role` for a new user or system message)."""

    reasons = {key.split(":", 1)[1]: int(value) for key, value in sorted(stats.items()) if key.startswith("full:")}
    return {
        "incremental_renders": int(stats.get("incremental", 0)),
        "full_renders": int(stats.get("full", 0)),
        "full_renders_by_reason": reasons,
        "cache_hits": int(stats.get("cache_hits", 0)),
        "tokens_encoded": int(stats.get("tokens_encoded", 0)),
        "tokens_reused": int(stats.get("tokens_reused", 0)),
        "templates_not_incremental": int(stats.get("template_not_incremental", 0)),
        # only on the other render paths, so a default run's summary is what it was
        **({"reference_renders": int(stats["reference_renders"])} if stats.get("reference_renders") else {}),
        **({"verify": verify_summary(stats)} if stats.get("verify:checked") else {}),
    }


class ReportHelper:
    """The end of a run written by a helper process started when the replay starts (see the module's
    docstring). `report(job)` returns the summary: the helper's, or, where it cannot start or
    fails, written in this process. Use it as a context manager: leaving it stops an unused
    helper.

    `fork`: fork the helper from this process, which the caller says is safe (the replay passes
    `process_pool.can_fork()`, as for its workers), so that it shares the modules imported
    here (pyarrow, numpy and trace_tools' own: about half of the 0.9 s of CPU a fresh interpreter
    spent to get ready); otherwise it is a fresh interpreter, `python -m trace_tools.report.finish`.

    A process that has matplotlib loaded already (a notebook, a second replay) writes the report
    itself: there is no import left to hide, and a fresh helper would have to import it again.
    So does one that asks for no helper (`helper=False`: the API, unless its caller owns the
    process, as the command line does).
    """

    def __init__(self, helper: bool = True, fork: bool = False) -> None:
        self._process: _ForkedHelper | subprocess.Popen | None = None
        self._handed = False
        if not helper or "matplotlib.figure" in sys.modules:
            return
        try:
            self._process = _ForkedHelper() if fork else _spawned_helper()
        except OSError:
            self._process = None

    def __enter__(self) -> "ReportHelper":
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def report(self, job: ReportJob) -> dict[str, Any]:
        if self._process is not None:
            self._handed = True
            try:
                out, _ = self._process.communicate(pickle.dumps(job))
                if self._process.returncode == 0:
                    return pickle.loads(out)
            except (OSError, EOFError, pickle.UnpicklingError):
                pass
            self._stop()
        return write_run_report(job)

    def _stop(self) -> None:
        """End a helper still running. One handed its job is interrupted, as Ctrl-C does, and given
        a moment to end the drawers it forked and reap them (`PendingPlots.close`) before it is
        killed: killed first, it would leave them to init."""
        if self._process is not None and self._process.poll() is None:
            if self._handed:
                self._process.send_signal(signal.SIGINT)
                try:
                    self._process.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
            self._process.kill()
            self._process.wait()
        self._process = None


def _spawned_helper() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )


class _ForkedHelper:
    """The helper as a child forked from this process, driven as `subprocess.Popen` drives the
    spawned one (the job on its standard input, the summary on its standard output), through a
    pipe each way."""

    def __init__(self) -> None:
        job_read, job_write = os.pipe()
        answer_read, answer_write = os.pipe()
        named = _process_name()
        _name_this_process(HELPER_NAME)  # before the fork: the child is never seen under the replay's name
        try:
            self.pid = os.fork()
            if self.pid == 0:
                _forked_serve(job_read, answer_write, (job_write, answer_read))
        except OSError:
            for end in (job_read, job_write, answer_read, answer_write):
                os.close(end)
            raise
        finally:
            if named is not None:  # this process's own name back (the child never gets here)
                _name_this_process(named)
        os.close(job_read)
        os.close(answer_write)
        self.stdin = open(job_write, "wb")
        self._answer = open(answer_read, "rb")
        self.returncode: int | None = None

    def communicate(self, job: bytes) -> tuple[bytes, None]:
        try:
            self.stdin.write(job)
            self.stdin.close()
            answer = self._answer.read()
        finally:
            self._close()
        self.wait()
        return answer, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                self._close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"report helper {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None, "poll() returns the exit code once the helper ended"
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _close(self) -> None:
        for pipe in (self.stdin, self._answer):
            try:
                pipe.close()
            except OSError:  # the helper ended while the job was still being written
                pass


def _forked_serve(job_read: int, answer_write: int, parents_ends: tuple[int, ...]) -> NoReturn:
    """The forked helper's whole life: it never returns into the caller's code. Its standard input
    and error go to /dev/null, as the spawned helper's do (an interrupted helper writes nothing)."""
    code = 1
    try:
        off_for_good()  # a collection would walk, and so copy, every object this child shares
        for end in parents_ends:
            os.close(end)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 2)
        with open(job_read, "rb") as jobs, open(answer_write, "wb") as answers:
            _serve(jobs, answers)
        code = 0
    except BaseException:  # noqa: BLE001 - Ctrl-C or a failure: the caller writes the report itself
        pass
    finally:
        os._exit(code)


def _process_name() -> str | None:
    """This thread's name as `ps` and /proc show it (Linux), None elsewhere."""
    try:
        return Path("/proc/thread-self/comm").read_text().rstrip("\n")
    except OSError:
        return None


def _name_this_process(name: str) -> None:
    """Name this thread as `ps` and /proc show it (Linux's PR_SET_NAME; elsewhere nothing changes)."""
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)
    except (AttributeError, OSError):
        pass


def _serve(jobs: BinaryIO, answers: BinaryIO) -> None:
    """The helper: import what the end of a run needs now, then write the report of the job read
    from `jobs` and answer with its summary."""
    from io import BytesIO

    from matplotlib.figure import Figure

    import trace_tools.report.html  # noqa: F401 - pandas and the pages' builders
    import trace_tools.report.metrics  # noqa: F401
    import trace_tools.report.render  # noqa: F401

    warm_up = Figure()  # fonts and the Agg renderer load on a first drawing: do it ahead too
    warm_up.text(0.5, 0.5, "warm-up")
    warm_up.savefig(BytesIO())

    handed = jobs.read()
    if not handed:  # the replay ended without reaching its report
        return
    summary = write_run_report(pickle.loads(handed), fork_plots=True)
    answers.write(pickle.dumps(summary))
    answers.flush()


if __name__ == "__main__":
    _serve(sys.stdin.buffer, sys.stdout.buffer)
    # The run waits for this process to exit. Tearing down an interpreter that holds matplotlib
    # and pandas took 0.17 s of a 4 s replay; the report is written and its summary sent.
    os._exit(0)
