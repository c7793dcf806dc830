"""io.sample_parts: the part of the shard being written is encoded as its sessions arrive."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trace_tools.io import sample_parts
from trace_tools.io.rundir import SAMPLES_SCHEMA, _ipc_stream


def _samples(session: str, rows: int, tokens: int = 64) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "strategy": "tree",
                "session_id": session,
                "sample_index": index,
                "token_ids": list(range(tokens)),
                "response_length": 8,
                "loss_mask": [1] * 8,
                "logprobs": [-0.5] * 8,
                "source_turn": [index] * tokens,
                "reward": None,
                "metadata": "{}",
            }
            for index in range(rows)
        ],
        schema=SAMPLES_SCHEMA,
    )


class _Marker:
    """What `SampleParts.add` reads of a shard's marker."""

    def __init__(self, name: str, files: dict):
        self.name, self.files = name, files
        self.start, self.end = 0, 5

    def path(self, directory: Path, kind: str) -> Path:
        return directory / f"{self.name}.{kind}"


def test_a_part_appended_session_by_session_equals_one_encoded_from_the_shard_file(tmp_path):
    tables = [_samples(f"s{i}", 3) for i in range(5)]
    (tmp_path / "shards").mkdir()
    source = tmp_path / "shards" / "0000000.samples.arrows"
    with open(source, "wb") as out:
        for table in tables:
            stream = _ipc_stream(table)
            out.write(len(stream).to_bytes(8, "little") + stream.to_pybytes())
    from_file = tmp_path / "from_file.parquet"
    sample_parts.encode(source, "abc", from_file)

    parts = sample_parts.SampleParts(tmp_path)
    for index, table in enumerate(tables):  # tables and IPC streams both arrive, as from 1 or 2 workers
        parts.append("0000000", table if index % 2 else _ipc_stream(table))
    parts.add(_Marker("0000000", {source.name: [source.stat().st_size, "abc"]}))
    parts.finish([_Marker("0000000", {source.name: [source.stat().st_size, "abc"]})])
    live = tmp_path / "samples" / "0000000.parquet"
    assert pq.read_table(live).equals(pq.read_table(from_file))
    assert pq.read_table(live).num_rows == 15
    assert pq.read_metadata(live).metadata[sample_parts.SOURCE_KEY] == b"abc"
    assert sample_parts._current(live, _Marker("0000000", {source.name: [1, "abc"]}))
    assert not list((tmp_path / "samples").glob(".*.tmp"))


def test_appending_waits_once_the_backlog_is_full(tmp_path, monkeypatch):
    monkeypatch.setattr(sample_parts, "LIVE_BACKLOG_BYTES", 1)  # every append waits for the one before
    gate = threading.Event()
    real_add = sample_parts._PartWriter.add
    monkeypatch.setattr(sample_parts._PartWriter, "add", lambda self, samples: gate.wait() and real_add(self, samples))
    parts = sample_parts.SampleParts(tmp_path)
    parts.append("0000000", _samples("a", 1))
    second = threading.Thread(target=parts.append, args=("0000000", _samples("b", 1)))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # held until the first is encoded
    gate.set()
    second.join(10)
    assert not second.is_alive()
    parts.abandon()


def test_an_error_while_encoding_is_raised_when_the_shard_closes_and_leaves_no_part(tmp_path, monkeypatch):
    parts = sample_parts.SampleParts(tmp_path)
    parts.append("0000000", _samples("a", 1))
    parts.append("0000000", pa.py_buffer(b"not an IPC stream"))
    parts.append("0000000", _samples("c", 1))
    marker = _Marker("0000000", {"0000000.samples.arrows": [1, "abc"]})
    parts.add(marker)
    with pytest.raises(pa.ArrowInvalid):
        parts.finish([marker])
    assert not list((tmp_path / "samples").iterdir())


def test_an_abandoned_run_leaves_no_part_of_the_shard_being_written(tmp_path):
    parts = sample_parts.SampleParts(tmp_path)
    parts.append("0000000", _samples("a", 2))
    parts.abandon()
    assert not list((tmp_path / "samples").iterdir())


def test_an_observer_that_fails_is_given_up_and_the_part_is_still_written(tmp_path, caplog):
    seen: list[str] = []

    def observe(table: pa.Table) -> None:
        seen.append(table.column("session_id")[0].as_py())
        if len(seen) == 2:
            raise RuntimeError("observer bug")

    parts = sample_parts.SampleParts(tmp_path, observe=observe)
    for session in ("a", "b", "c"):
        parts.append("0000000", _samples(session, 2))
    marker = _Marker("0000000", {"0000000.samples.arrows": [1, "abc"]})
    parts.add(marker)
    parts.finish([marker])
    assert seen == ["a", "b"]  # not asked again after it failed
    assert not parts.observed_all
    assert pq.read_table(tmp_path / "samples" / "0000000.parquet").num_rows == 6
    assert "observer bug" in caplog.text
