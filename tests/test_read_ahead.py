"""`io.read_ahead`: the stream decodes its next record batch on a thread while the caller turns the
current one into turns. Order, errors, memory and early stops must be as without it."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trace_tools.io.dump_files import iter_batches
from trace_tools.io.read_ahead import read_ahead

_BEFORE: list[threading.Thread] = []  # the reading threads alive when the test began


@pytest.fixture(autouse=True)
def _earlier_workers() -> None:
    """The reading threads alive before each test (another test's unfinished stream is not this
    module's concern): `_live_workers` counts only those the test started."""
    _BEFORE[:] = [t for t in threading.enumerate() if t.name == "trace-tools-read-ahead"]


def _live_workers() -> list[threading.Thread]:
    return [
        t for t in threading.enumerate() if t.name == "trace-tools-read-ahead" and t.is_alive() and t not in _BEFORE
    ]


def test_items_arrive_in_order_and_the_worker_ends():
    assert list(read_ahead(iter(range(1000)))) == list(range(1000))
    assert not _live_workers()


def test_the_worker_stays_at_most_depth_items_ahead():
    produced = []
    ahead = []

    def source():
        for item in range(20):
            produced.append(item)
            yield item

    for item in read_ahead(source(), depth=2):
        ahead.append(len(produced) - item - 1)
        time.sleep(0.005)  # a slow caller: an unbounded worker would run to the end
    # produced counts the item being handed over: depth waiting plus one the worker holds
    assert max(ahead) <= 3 and ahead[-1] == 0


def test_an_error_of_the_source_is_raised_at_its_place_in_the_stream():
    def source():
        yield 1
        yield 2
        raise ValueError("page 3 is corrupt")

    got = []
    with pytest.raises(ValueError, match="page 3 is corrupt"):
        for item in read_ahead(source()):
            got.append(item)
    assert got == [1, 2]
    assert not _live_workers()


def test_stopping_early_closes_the_source_on_its_own_thread():
    closed_on = []

    def source():
        try:
            yield from range(10_000)
        finally:
            closed_on.append(threading.current_thread().name)

    stream = read_ahead(source())
    assert [next(stream) for _ in range(3)] == [0, 1, 2]
    stream.close()
    assert closed_on == ["trace-tools-read-ahead"]
    assert not _live_workers()


def test_a_parquet_file_reads_the_same_batches_ahead(tmp_path):
    path = tmp_path / "rows.parquet"
    table = pa.table({"session_id": [f"s{i % 7}" for i in range(500)], "turn_index": list(range(500))})
    pq.write_table(table, path, row_group_size=64)
    plain = list(iter_batches(path, ["session_id", "turn_index"], 30))
    ahead = list(read_ahead(iter_batches(path, ["session_id", "turn_index"], 30)))
    assert [b.to_pydict() for b in ahead] == [b.to_pydict() for b in plain]
    assert len(ahead) == 17


def test_finding_one_session_stops_reading_the_dump():
    """`Pipeline.session` returns at the session it wants; the reader thread and the open file go
    with it rather than waiting for the garbage collector (the stream refers to itself)."""
    from pathlib import Path

    from trace_tools.pipeline import Pipeline

    dump = Path(__file__).resolve().parents[1] / "sample_traces" / "qwen3.parquet"
    first = pq.read_table(dump, columns=["session_id"]).column(0)[0].as_py()
    pipeline = Pipeline(dump)
    assert pipeline.session(first).session.session_id == first
    assert not _live_workers()
    assert list(pipeline) == []  # closed: read once
