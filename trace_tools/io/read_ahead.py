"""Produce an iterator's next item on a thread while the caller works on the current one.

Decoding a Parquet record batch runs in Arrow's C++ code with the GIL released, but a plain loop
decodes a batch only after the caller has turned the previous one into Python rows: one core
does both in turn. `read_ahead` overlaps them (docs/performance.md#reading-ahead). At most
`depth` items wait decoded, so memory grows by that many batches, not by the file.
"""

from __future__ import annotations

import queue
import threading
from typing import Iterator, TypeVar

T = TypeVar("T")
_END = object()
_POLL_SECONDS = 0.05  # how often a producer blocked on a full queue checks that it is still wanted


def read_ahead(source: Iterator[T], depth: int = 1) -> Iterator[T]:
    """`source`'s items in order, each produced on a worker thread ahead of the caller.

    An exception raised by `source` is raised here, at the item where it happened. Closing this
    generator early (a `break`, an error in the caller) stops the worker and closes `source` on
    the worker's own thread, so files it holds open are closed before this returns."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    wanted = threading.Event()
    wanted.set()
    worker = threading.Thread(target=_produce, args=(source, ready, wanted), name="trace-tools-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item, error = ready.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        wanted.clear()
        _drain(ready)
        worker.join()


def _produce(source: Iterator, ready: queue.Queue, wanted: threading.Event) -> None:
    try:
        for item in source:
            if not _offer(ready, wanted, (item, None)):
                return
        _offer(ready, wanted, (_END, None))
    except BaseException as error:  # handed to the caller's thread, which raises it
        _offer(ready, wanted, (None, error))
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _offer(ready: queue.Queue, wanted: threading.Event, entry: tuple) -> bool:
    """Put `entry` once there is room; False when the caller stopped wanting items first."""
    while wanted.is_set():
        try:
            ready.put(entry, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            continue
    return False


def _drain(ready: queue.Queue) -> None:
    while True:
        try:
            ready.get_nowait()
        except queue.Empty:
            return
