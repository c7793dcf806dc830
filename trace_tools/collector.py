"""Python's cyclic garbage collector in a process a run owns: the command line's, a local worker.

A replay allocates millions of containers (messages, token-id lists, rows) and frees nearly all
of them by reference counting alone: a replay of the benchmark's 40 sessions under every strategy
with the collector off left 494 objects in reference cycles. With it on, each collection walks
what the last allocations left alive, among them a session's token-id lists, element by element,
and each full one everything alive, the modules included: 0.27 s of a 3.2 s `replay -s tree
--workers 1` and 0.28 s of a 2.1 s `reconstruct` on that dump
(docs/performance.md#the-collector-off-for-the-run). So a process the run owns freezes what lives
when the run starts (the modules; forked workers share it and never walk it either), runs with
the collector off, and collects in full once every `COLLECT_EVERY` sessions, which bounds what
cycles can hold (an exception's traceback can hold a session's data). A notebook or a service
calling the API keeps its collector as it is.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

COLLECT_EVERY = 64  # sessions between full collections while the collector is off
_sessions = 0  # sessions this process has counted (`session_done`)
_off_here = False  # switched off here (not by the process's owner, whose choice is left alone)


@contextmanager
def collector_off(owned: bool) -> Iterator[None]:
    """The collector off, what lives now frozen, until the block ends (for an `owned` process
    whose collector is on; otherwise nothing changes)."""
    global _off_here
    if not (owned and gc.isenabled()):
        yield
        return
    off_for_good()
    try:
        yield
    finally:
        _off_here = False
        gc.unfreeze()
        gc.enable()


def off_for_good() -> None:
    """Freeze what lives now and switch the collector off: a worker process, from its start."""
    global _off_here
    _off_here = True
    gc.freeze()
    gc.disable()


def session_done() -> None:
    """Count a session; every `COLLECT_EVERY`-th collects in full while the collector is off here."""
    global _sessions
    _sessions += 1
    if _off_here and _sessions % COLLECT_EVERY == 0:
        gc.collect()
