"""Progress on stderr as a context manager yielding an `advance(done, total)` callback.

At a terminal: a rich progress bar that says it is reading the input until the first call (no
`0/?`), then `action` and a count of `unit`s. In a pipe or a CI log, where a bar would be invisible:
plain lines (`replaying: 40/165 sessions (12s)`), the first and last always and one every
LINE_SECONDS between, so a long run is never silent.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

LINE_SECONDS = 5.0  # at most one progress line per this many seconds in a pipe


@contextmanager
def progress_bar(
    action: str, unit: str, disable: bool = False, still_until_first_call: bool = False
) -> Iterator[Callable[[int, int], None]]:
    """`still_until_first_call`: at a terminal, the bar is drawn once and stands still until the
    first call, with no thread redrawing it: `replay` forks its worker processes before any session
    ends, and forks only from a process running one thread (`process_pool.can_fork`)."""
    from trace_tools.cli._output import err_console

    if disable:
        yield lambda done, total: None
    elif err_console.is_terminal:
        with _bar(action, unit, still_until_first_call) as advance:
            yield advance
    else:
        yield _lines(action, unit)


@contextmanager
def _bar(action: str, unit: str, still: bool) -> Iterator[Callable[[int, int], None]]:
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from trace_tools.cli._output import err_console

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[count]}"),
        TimeElapsedColumn(),
    )

    def started(redrawn: bool) -> tuple[Progress, Any]:
        # auto_refresh: a thread redraws the bar ten times a second (the spinner, the time)
        progress = Progress(*columns, console=err_console, transient=True, auto_refresh=redrawn)
        task = progress.add_task("reading the input", total=None, count="")
        progress.start()
        return progress, task

    progress, task = started(redrawn=not still)

    def advance(done: int, total: int) -> None:
        nonlocal progress, task, still
        if still:  # the still bar gives way to one redrawn by its thread
            progress.stop()
            progress, task = started(redrawn=True)
            still = False
        progress.update(task, description=action, completed=done, total=total, count=f"{done}/{total} {unit}")

    try:
        yield advance
    finally:
        progress.stop()


def _lines(action: str, unit: str) -> Callable[[int, int], None]:
    """A callback printing `action: done/total units (elapsed)` lines, throttled to LINE_SECONDS."""
    start = time.monotonic()
    last: float | None = None
    _line(f"{action}: reading the input")

    def advance(done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        if last is None or done >= total or now - last >= LINE_SECONDS:
            last = now
            _line(f"{action}: {done}/{total} {unit} ({now - start:.0f}s)")

    return advance


def _line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
