"""The sample bars of report.html (each sample as run-length segments of its turns, trained or
not), computed from samples tables, and gathered while a replay writes its samples.

Kept apart from the page's builders, which need pandas: the process that replays gathers the
bars, and the command line's replay process never imports pandas (`report.finish`).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import numpy as np

SAMPLE_COLUMNS = ["strategy", "session_id", "sample_index", "response_length", "loss_mask", "source_turn"]
MAX_SESSIONS = 500  # sessions the page details; a larger run shows the ones losing the most tokens


def add_bars(out: dict[tuple[str, str], list[dict[str, Any]]], batch: Any) -> None:
    keys = zip(batch.column("strategy").to_pylist(), batch.column("session_id").to_pylist())
    for key, index, bar in zip(keys, batch.column("sample_index").to_pylist(), _batch_bars(batch)):
        out[key].append({"i": index, **bar})


def sorted_bars(out: dict[tuple[str, str], list[dict[str, Any]]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    return {key: sorted(bars, key=lambda bar: bar["i"]) for key, bars in out.items()}


class GatheredBars:
    """The sample bars of a run gathered while it writes its samples (`add` is handed each
    session's samples table, from whichever thread encodes it), so that the report at the run's
    end need not read the samples back: for a run of up to `limit` sessions with samples, every
    session the page can detail. Past `limit` it stops and holds nothing (`bars()` is None)."""

    def __init__(self, limit: int = MAX_SESSIONS):
        self.limit = limit
        self._bars: dict[tuple[str, str], list[dict[str, Any]]] | None = defaultdict(list)
        self._sessions: set[str] = set()
        self._lock = threading.Lock()

    def add(self, table: Any) -> None:
        if self._bars is None or not table.num_rows:
            return
        batches = table.select(SAMPLE_COLUMNS).combine_chunks().to_batches()
        sessions = set(table.column("session_id").to_pylist())  # `unique()` would import pyarrow.compute
        with self._lock:
            if self._bars is None:
                return
            self._sessions |= sessions
            if len(self._sessions) > self.limit:
                self._bars = None
                return
            for batch in batches:
                add_bars(self._bars, batch)

    def __getstate__(self) -> dict[str, Any]:
        """What the report helper is sent (`report.finish`): the bars, not the lock."""
        with self._lock:
            return {"limit": self.limit, "_bars": self._bars, "_sessions": self._sessions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def bars(self, wanted: set[str]) -> dict[tuple[str, str], list[dict[str, Any]]] | None:
        """The bars of the `wanted` sessions; None past the limit."""
        if self._bars is None:
            return None
        return sorted_bars({key: bars for key, bars in self._bars.items() if key[1] in wanted})


def _batch_bars(batch) -> list[dict[str, Any]]:
    """Run-length segments of every sample of a record batch, computed on the flat token arrays."""
    source, bounds = _flat(batch.column("source_turn"))
    mask, mask_bounds = _flat(batch.column("loss_mask"))
    trained = np.zeros(len(source), dtype=bool)
    for row, response in enumerate(batch.column("response_length").to_numpy()):
        # loss_mask covers the last `response_length` tokens (slime's layout); guard short masks
        take = int(min(response, bounds[row + 1] - bounds[row], mask_bounds[row + 1] - mask_bounds[row]))
        if take > 0:
            trained[bounds[row + 1] - take : bounds[row + 1]] = (
                mask[mask_bounds[row + 1] - take : mask_bounds[row + 1]] > 0
            )
    trained &= source >= 0
    key = np.where(source >= 0, source * 2 + trained, -1)
    changes = np.flatnonzero(key[1:] != key[:-1]) + 1  # a bool array: nonzero scans it fastest
    starts = np.union1d(changes, bounds[:-1])
    starts = starts[starts < len(source)]
    counts = np.diff(np.append(starts, len(source)))
    segments = np.stack([np.maximum(source[starts], -1), trained[starts], counts], axis=1)
    cut = np.searchsorted(starts, bounds)
    # Every segment is trained throughout or not at all, and none crosses a sample's start, so a
    # sample's trained tokens add up over its segments: a sum over segments, not over tokens.
    running = np.concatenate(([0], np.cumsum(counts * trained[starts])))
    return [
        {
            "n": int(bounds[row + 1] - bounds[row]),
            "trained": int(running[cut[row + 1]] - running[cut[row]]),
            "segs": segments[cut[row] : cut[row + 1]].tolist(),
        }
        for row in range(len(bounds) - 1)
    ]


def _flat(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values and its rebased offsets, respecting a batch that is a slice of a
    larger array. The values between the first and last offsets, without `flatten()` (which
    imports pyarrow.compute, 40 ms of the replaying process) unless a list is null (whose
    values, if any, `flatten()` leaves out)."""
    offsets = column.offsets.to_numpy()
    first = int(offsets[0])
    if column.null_count:
        values = column.flatten()
    else:
        values = column.values.slice(first, int(offsets[-1]) - first)
    return values.to_numpy(zero_copy_only=False), offsets - first
