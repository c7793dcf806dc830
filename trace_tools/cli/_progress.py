"""A rich progress bar (on stderr) as a context manager yielding an `advance(done, total)` callback.

Until the first call the bar says it is reading the input (no `0/?`); then it says `action` and
counts `unit`s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bar(action: str, unit: str, disable: bool = False) -> Iterator[Callable[[int, int], None]]:
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from trace_tools.cli._output import err_console

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[count]}"),
        TimeElapsedColumn(),
    )
    quiet = disable or not err_console.is_terminal  # a pipe or CI log gets no bar, not a stray blank line
    with Progress(*columns, console=err_console, disable=quiet, transient=True) as progress:
        task = progress.add_task("reading the input", total=None, count="")

        def advance(done: int, total: int) -> None:
            progress.update(task, description=action, completed=done, total=total, count=f"{done}/{total} {unit}")

        yield advance
