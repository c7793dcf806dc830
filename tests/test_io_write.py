"""Atomic writers, the quarantine table and sessions_to_table."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from io_support import META, VOCAB, baseline_sessions
from trace_tools.data import DumpMeta, QuarantineEntry
from trace_tools.io import (
    load,
    quarantine_table,
    sessions_to_table,
    write_json_atomic,
    write_parquet_atomic,
    write_text_atomic,
)


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_parquet_from_table_and_dataframe_with_metadata(tmp_path):
    table = pa.table({"a": [1, 2]}).replace_schema_metadata({"keep": "me"})
    write_parquet_atomic(table, tmp_path / "t.parquet", metadata={"trace_tools.tokenizer": "qwen3"})
    written = pq.read_table(tmp_path / "t.parquet")
    assert written.column("a").to_pylist() == [1, 2]
    assert written.schema.metadata[b"keep"] == b"me"
    assert written.schema.metadata[b"trace_tools.tokenizer"] == b"qwen3"

    frame = pd.DataFrame({"x": [0.5, 1.5]}, index=[10, 20])
    write_parquet_atomic(frame, tmp_path / "sub" / "f.parquet")
    assert pq.read_table(tmp_path / "sub" / "f.parquet").column_names == ["x"]  # index dropped, dir made
    assert _leftovers(tmp_path) == [] and _leftovers(tmp_path / "sub") == []


def test_failed_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "t.parquet"
    write_parquet_atomic(pa.table({"a": [1]}), target)

    def broken(table, where, **kwargs):
        where.write(b"PAR1 partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        write_parquet_atomic(pa.table({"a": [2]}), target)
    monkeypatch.undo()
    assert pq.read_table(target).column("a").to_pylist() == [1]
    assert _leftovers(tmp_path) == []


def test_json_nan_becomes_null_and_order_is_kept(tmp_path):
    obj = {
        "zeta": float("nan"),
        "alpha": [1.5, float("inf"), -float("inf")],
        "n": np.int64(3),
        "f": np.float32("nan"),
        "arr": np.array([0.25, np.nan]),
        "name": "Grüße",
    }
    path = write_json_atomic(obj, tmp_path / "s.json")
    text = path.read_text(encoding="utf-8")
    parsed = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert list(parsed) == ["zeta", "alpha", "n", "f", "arr", "name"]
    assert parsed == {"zeta": None, "alpha": [1.5, None, None], "n": 3, "f": None, "arr": [0.25, None], "name": "Grüße"}
    assert text.startswith('{\n  "zeta": null')


def test_json_overwrites_atomically(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic({"v": 1}, path)
    with pytest.raises(TypeError):
        write_json_atomic({"v": object()}, path)
    assert json.loads(path.read_text()) == {"v": 1}
    write_json_atomic({"v": 2}, path)
    assert json.loads(path.read_text()) == {"v": 2} and _leftovers(tmp_path) == []


def test_text(tmp_path):
    write_text_atomic("# report\nü\n", tmp_path / "r.md")
    assert (tmp_path / "r.md").read_text(encoding="utf-8") == "# report\nü\n"


def test_quarantine_table_columns():
    table = quarantine_table(
        [
            QuarantineEntry("s1", 3, "bad_json", "row 3: messages is not valid JSON"),
            QuarantineEntry(None, None, "missing_column", "f.parquet: required column session_id is missing"),
        ]
    )
    assert table.schema.names == ["session_id", "turn_index", "reason", "detail"]
    assert table.schema.field("turn_index").type == pa.int32()
    assert table.column("turn_index").to_pylist() == [3, None]
    assert table.column("session_id").to_pylist() == ["s1", None]
    assert quarantine_table([]).num_rows == 0


def test_sessions_to_table_is_schema_v1_and_self_describing(tmp_path):
    meta = DumpMeta(tokenizer="qwen3", chat_template="{{ messages }}", harness="toy", extra={"recorder": "r1"})
    table = sessions_to_table(baseline_sessions(), meta)
    assert table.num_rows == 9
    assert table.schema.field("output_ids").type == pa.list_(pa.int32())
    assert table.schema.field("started_at").type == pa.timestamp("us", tz="UTC")
    assert "ünïcode" in table.column("metadata")[0].as_py()  # ensure_ascii=False
    assert json.loads(table.column("tools")[0].as_py())[0]["function"]["name"] == "Bash"
    write_parquet_atomic(table, tmp_path / "d.parquet")
    loaded = load(tmp_path / "d.parquet", vocab_size=VOCAB)
    assert loaded.meta == DumpMeta(
        schema_version="1", tokenizer="qwen3", chat_template="{{ messages }}", harness="toy", extra={"recorder": "r1"}
    )
    assert [t for s in loaded.sessions for t in s.turns] == [t for s in baseline_sessions() for t in s.turns]


def test_sessions_to_table_defaults_to_the_sessions_meta():
    table = sessions_to_table(baseline_sessions())
    assert table.schema.metadata[b"trace_tools.harness"] == META.harness.encode()
    assert table.column("reward").to_pylist() == [None, None, 1.0] * 3
