"""Loading trace schema v1: round trip, every quarantine reason, compatible types, streaming, metadata."""

from __future__ import annotations

import importlib
import json
from datetime import timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trace_tools.data import QuarantineEntry, Session
from trace_tools.errors import UnusableInput
from trace_tools.io import dump_files, iter_sessions, load, read_dump_meta

# The package re-exports the function `load`, which shadows the submodule as an attribute.
load_module = importlib.import_module("trace_tools.io.load")
from io_support import (  # noqa: E402
    SESSION_IDS,
    VOCAB,
    baseline_sessions,
    baseline_table,
    distinct_session_ids,
    read_like_workers,
    with_cell,
    with_column,
    write_dump,
)


def assert_accounted(dump, table: pa.Table) -> None:
    """Every input session is either valid or quarantined, never both, never lost."""
    valid = {s.session_id for s in dump.sessions}
    quarantined = set(dump.quarantined_sessions)
    assert not valid & quarantined
    assert valid | quarantined == distinct_session_ids(table)
    assert dump.session_count == len(valid) + len(quarantined)


# --------------------------------------------------------------------------------------------
# Round trip


def test_baseline_round_trips_exactly(tmp_path):
    dump = load(write_dump(tmp_path / "d.parquet"), vocab_size=VOCAB)
    assert dump.quarantine == []
    assert dump.sessions == baseline_sessions()
    assert dump.rows == 9 and dump.session_count == 3 and dump.vocab_checked
    started = dump.sessions[0].turns[0].started_at
    assert started.utcoffset().total_seconds() == 0


def test_turns_are_sorted_and_input_order_kept(tmp_path):
    table = baseline_table().take([8, 2, 7, 0, 5, 1, 3, 6, 4])  # arrival order, interleaved
    dump = load(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB)
    assert [s.session_id for s in dump.sessions] == ["gamma", "alpha", "beta"]
    assert all([t.turn_index for t in s.turns] == [0, 1, 2] for s in dump.sessions)
    assert sorted(dump.sessions, key=lambda s: s.session_id) == baseline_sessions()


# --------------------------------------------------------------------------------------------
# Every quarantine reason, one spoiled cell in session beta (rows 3-5)


def _json_cell(column, row, text):
    return lambda t: with_cell(t, column, row, text)


BAD_ROWS = {
    "null output_ids": (lambda t: with_cell(t, "output_ids", 4, None), "missing_column", 1),
    "null turn_index": (lambda t: with_cell(t, "turn_index", 4, None), "missing_column", None),
    "unparsable messages": (_json_cell("messages", 4, '[{"role": "user"'), "bad_json", 1),
    "messages is an object": (_json_cell("messages", 4, '{"role": "user"}'), "bad_json", 1),
    "message not an object": (_json_cell("messages", 4, '["hello"]'), "bad_json", 1),
    "tools is an object": (_json_cell("tools", 4, '{"name": "Bash"}'), "bad_json", 1),
    "response is an array": (_json_cell("response", 4, "[1, 2]"), "bad_json", 1),
    "unparsable kwargs": (_json_cell("chat_template_kwargs", 4, "{enable_thinking: true}"), "bad_json", 1),
    "unparsable metadata": (_json_cell("metadata", 4, "not json"), "bad_json", 1),
    "logprobs too short": (lambda t: with_cell(t, "output_logprobs", 4, [-0.5, -0.5]), "logprobs_length", 1),
    "id at vocab size": (lambda t: with_cell(t, "output_ids", 4, [1, VOCAB, 2, 3]), "out_of_vocab", 1),
    "negative prompt id": (lambda t: with_cell(t, "prompt_ids", 4, [5, -3]), "out_of_vocab", 1),
    "null id in a list": (lambda t: with_cell(t, "output_ids", 4, [1, None, 2, 3]), "wrong_type", 1),
    "duplicate turn": (lambda t: with_cell(t, "turn_index", 5, 1), "duplicate_turn", 1),
    "negative turn": (lambda t: with_cell(t, "turn_index", 4, -1), "negative_turn", -1),
    "empty messages": (_json_cell("messages", 4, "[]"), "empty_messages", 1),
    "null messages": (lambda t: with_cell(t, "messages", 4, None), "empty_messages", 1),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_bad_row_quarantines_its_whole_session(tmp_path, case):
    spoil, reason, turn_index = BAD_ROWS[case]
    table = spoil(baseline_table())
    dump = load(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB)
    assert [s.session_id for s in dump.sessions] == ["alpha", "gamma"]
    assert [(e.session_id, e.turn_index, e.reason) for e in dump.quarantine] == [("beta", turn_index, reason)]
    assert "d.parquet row" in dump.quarantine[0].detail or reason == "duplicate_turn"
    assert_accounted(dump, table)


def test_details_name_row_column_and_value(tmp_path):
    table = with_cell(baseline_table(), "output_ids", 7, [1, 2, 9999, 3])
    [entry] = load(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB).quarantine
    assert entry.detail == "d.parquet row 7: output_ids[2] = 9999 is outside [0, 500) (vocabulary size 500)"
    table = with_cell(baseline_table(), "output_logprobs", 0, [-1.0])
    [entry] = load(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB).quarantine
    assert entry.detail == "d.parquet row 0: output_logprobs has 1 values for 4 output_ids"


def test_duplicate_turn_across_files_is_caught(tmp_path):
    table = baseline_table()
    write_dump(tmp_path / "dump" / "a.parquet", table.slice(0, 5))
    write_dump(tmp_path / "dump" / "b.parquet", with_cell(table, "turn_index", 5, 0).slice(5))
    dump = load(tmp_path / "dump", vocab_size=VOCAB)
    assert [(e.session_id, e.turn_index, e.reason) for e in dump.quarantine] == [("beta", 0, "duplicate_turn")]
    assert "turn_index 0 occurs 2 times" in dump.quarantine[0].detail


def test_missing_required_column_quarantines_every_session_of_the_file(tmp_path):
    table = baseline_table().drop_columns(["output_ids"])
    dump = load(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB)
    assert dump.sessions == []
    assert [(e.session_id, e.turn_index, e.reason) for e in dump.quarantine] == [
        (sid, None, "missing_column") for sid in SESSION_IDS
    ]
    assert "output_ids" in dump.quarantine[0].detail
    assert_accounted(dump, table)


def test_missing_session_id_column_is_one_file_level_entry(tmp_path):
    write_dump(tmp_path / "dump" / "a.parquet", baseline_table().slice(0, 3))
    write_dump(tmp_path / "dump" / "b.parquet", baseline_table().slice(3).drop_columns(["session_id"]))
    dump = load(tmp_path / "dump", vocab_size=VOCAB)
    assert [s.session_id for s in dump.sessions] == ["alpha"]
    [entry] = dump.quarantine
    assert (entry.session_id, entry.turn_index, entry.reason) == (None, None, "missing_column")
    assert "b.parquet" in entry.detail and "session_id" in entry.detail and "6 rows" in entry.detail


def test_null_session_id_rows_are_reported(tmp_path):
    table = with_cell(baseline_table(), "session_id", 4, None)
    dump = load(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB)
    [entry] = dump.quarantine
    assert (entry.session_id, entry.reason) == (None, "missing_column")
    assert "null session_id in 1 rows (rows 4)" in entry.detail
    assert_accounted(dump, table)


def test_optional_columns_may_be_absent_or_null(tmp_path):
    table = baseline_table().select(["session_id", "turn_index", "messages", "output_ids"])
    table = table.append_column("reward", pa.nulls(9))  # pandas writes all-None columns as type null
    dump = load(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB)
    assert dump.quarantine == [] and len(dump.sessions) == 3
    turn = dump.sessions[1].turns[2]
    assert (turn.tools, turn.output_logprobs, turn.prompt_ids, turn.response, turn.reward) == (None,) * 5
    assert turn.output_ids == baseline_sessions()[1].turns[2].output_ids


# --------------------------------------------------------------------------------------------
# Types (docs/trace_schema.md#columns): compatible physical types load, incompatible ones are wrong_type


def _cast(table: pa.Table, **types: pa.DataType) -> pa.Table:
    for name, new_type in types.items():
        table = with_column(table, name, table.column(name).cast(new_type).combine_chunks())
    return table


COMPATIBLE = {
    "int64 everywhere": dict(turn_index=pa.int64(), output_ids=pa.list_(pa.int64()), prompt_ids=pa.list_(pa.int64())),
    "large types": dict(
        session_id=pa.large_string(),
        messages=pa.large_string(),
        response=pa.large_string(),
        output_ids=pa.large_list(pa.int32()),
        output_logprobs=pa.large_list(pa.float32()),
    ),
    "float64 logprobs": dict(output_logprobs=pa.list_(pa.float64())),
    "timestamp[ns] with zone": dict(started_at=pa.timestamp("ns", tz="UTC"), finished_at=pa.timestamp("ms", tz="UTC")),
    "naive timestamps": dict(started_at=pa.timestamp("ns"), finished_at=pa.timestamp("us")),
    "dictionary strings": dict(
        session_id=pa.dictionary(pa.int32(), pa.string()), finish_reason=pa.dictionary(pa.int8(), pa.string())
    ),
    "int16 turn index, float32 reward": dict(turn_index=pa.int16(), reward=pa.float32()),
}


@pytest.mark.parametrize("case", sorted(COMPATIBLE))
def test_compatible_types_load_like_canonical_ones(tmp_path, case):
    table = _cast(baseline_table(), **COMPATIBLE[case])
    dump = load(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB)
    assert dump.quarantine == []
    assert dump.sessions == baseline_sessions()


def test_naive_timestamps_are_read_as_utc(tmp_path):
    naive = pa.array(
        [s.turns[0].started_at.replace(tzinfo=None) for s in baseline_sessions() for _ in range(3)], pa.timestamp("ns")
    )
    table = with_column(baseline_table(), "started_at", naive)
    dump = load(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB)
    moment = dump.sessions[2].turns[1].started_at
    assert moment == baseline_sessions()[2].turns[0].started_at
    assert moment.utcoffset() == timezone.utc.utcoffset(None)


def test_int64_ids_beyond_int32_are_out_of_vocab_even_without_a_vocabulary(tmp_path):
    table = _cast(baseline_table(), output_ids=pa.list_(pa.int64()))
    table = with_cell(table, "output_ids", 0, [1, 2**31, 2, 3])
    dump = load(write_dump(tmp_path / "d.parquet", table))
    assert not dump.vocab_checked
    assert [(e.session_id, e.reason) for e in dump.quarantine] == [("alpha", "out_of_vocab")]


INCOMPATIBLE = {
    "strings as token ids": ("output_ids", pa.array([["1", "2"]] * 9, pa.list_(pa.string()))),
    "float turn index": ("turn_index", pa.array([0.0, 1.0, 2.0] * 3)),
    "string turn index": ("turn_index", pa.array(["0", "1", "2"] * 3)),
    "messages as a list": ("messages", pa.array([["hi"]] * 9)),
    "logprobs as strings": ("output_logprobs", pa.array(["-0.5"] * 9)),
    "timestamps as strings": ("started_at", pa.array(["2025-03-01T09:30:00Z"] * 9)),
    "integer session ids": ("session_id", pa.array([7, 7, 7, 8, 8, 8, 9, 9, 9])),
}


@pytest.mark.parametrize("case", sorted(INCOMPATIBLE))
def test_incompatible_types_are_wrong_type(tmp_path, case):
    column, array = INCOMPATIBLE[case]
    table = with_column(baseline_table(), column, array)
    dump = load(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB)
    assert dump.sessions == []
    assert {e.reason for e in dump.quarantine} == {"wrong_type"}
    assert all(column in e.detail and e.turn_index is None for e in dump.quarantine)
    assert_accounted(dump, table)


# --------------------------------------------------------------------------------------------
# Sessions spanning row groups and files; streaming


def test_sessions_span_row_groups_and_files(tmp_path):
    table = baseline_table().take([0, 3, 6, 1, 4, 7, 2, 5, 8])  # every session in every file
    write_dump(tmp_path / "dump" / "part-1.parquet", table.slice(0, 4))
    write_dump(tmp_path / "dump" / "nested" / "part-2.parquet", table.slice(4, 3))
    write_dump(tmp_path / "dump" / "part-3.parquet", table.slice(7))
    (tmp_path / "dump" / "notes.txt").write_text("not part of the dump")
    dump = load(tmp_path / "dump", vocab_size=VOCAB)
    assert [f.split("dump/")[1] for f in dump.files] == ["nested/part-2.parquet", "part-1.parquet", "part-3.parquet"]
    assert dump.quarantine == [] and dump.rows == 9
    assert sorted(dump.sessions, key=lambda s: s.session_id) == baseline_sessions()


def test_a_bad_file_condemns_a_session_spanning_a_good_one(tmp_path):
    table = baseline_table()
    write_dump(tmp_path / "dump" / "a.parquet", table.slice(0, 4))  # alpha + beta turn 0
    write_dump(tmp_path / "dump" / "b.parquet", table.slice(4).drop_columns(["messages"]))
    dump = load(tmp_path / "dump", vocab_size=VOCAB)
    assert [s.session_id for s in dump.sessions] == ["alpha"]
    quarantined = [(e.session_id, e.reason) for e in dump.quarantine]
    assert quarantined == [("beta", "missing_column"), ("gamma", "missing_column")]
    assert all("b.parquet" in e.detail and "messages" in e.detail for e in dump.quarantine)


def _interleaved_in_three_files(directory: Path) -> Path:
    table = baseline_table().take([0, 3, 6, 1, 4, 7, 2, 5, 8])
    write_dump(directory / "part-1.parquet", table.slice(0, 4))
    write_dump(directory / "nested" / "part-2.parquet", table.slice(4, 3), row_group_size=None)
    write_dump(directory / "part-3.parquet", with_cell(table, "output_ids", 8, [VOCAB + 1]).slice(7))
    return directory


def _bad_file_in_the_middle(directory: Path) -> Path:
    table = baseline_table()
    write_dump(directory / "a.parquet", table.slice(0, 4))
    write_dump(directory / "b.parquet", table.slice(4, 2).drop_columns(["messages"]))
    write_dump(directory / "c.parquet", with_cell(table, "turn_index", 7, 0).slice(6))
    return directory


def _one_row_group_with_bad_cells(directory: Path) -> Path:
    table = with_cell(baseline_table(), "output_logprobs", 4, [0.5, 0.0, 0.0, 0.0])
    table = with_cell(table, "session_id", 7, None)
    return write_dump(directory / "d.parquet", with_cell(table, "messages", 1, "[{]"), row_group_size=None)


@pytest.mark.parametrize(
    "layout", [_interleaved_in_three_files, _bad_file_in_the_middle, _one_row_group_with_bad_cells]
)
@pytest.mark.parametrize("piece_rows", [None, 2], ids=["row-groups", "row-ranges"])
def test_workers_reading_their_own_rows_get_what_the_stream_gets(tmp_path, layout, piece_rows, monkeypatch):
    """Ray workers read a session from pass 1's slot: same sessions, same quarantine, same details;
    also when row groups are read as row ranges of 2 rows (how a large row group is split)."""
    if piece_rows:
        monkeypatch.setattr(dump_files, "PIECE_ROWS", piece_rows)
    stream = iter_sessions(layout(tmp_path / "dump"), vocab_size=VOCAB)
    context = stream.context()
    by_workers = read_like_workers(stream)
    by_stream = list(stream.positioned())
    assert by_workers == by_stream
    assert {type(item).__name__ for _, item in by_stream} == {"Session", "list"}  # both kinds compared
    if piece_rows:  # every group of more than two rows was split
        assert max(rows for pieces in context.pieces for _, _, rows in pieces) <= piece_rows


def test_a_large_row_group_is_read_in_row_ranges_and_the_user_told_how_to_rewrite_it(tmp_path, monkeypatch):
    monkeypatch.setattr(dump_files, "PIECE_ROWS", 2)
    path = write_dump(tmp_path / "one.parquet", baseline_table(), row_group_size=None)
    stream = iter_sessions(path, vocab_size=VOCAB)
    assert stream.context().pieces == [[(0, 0, 1), (0, 1, 2), (0, 3, 2), (0, 5, 2), (0, 7, 2)]]  # ranges of ≤ 2 rows
    (warning,) = [w for w in stream.warnings if "row group" in w]
    assert (
        warning.startswith("one.parquet: row group 0 holds 9 rows, read by 5 tasks") and "row_group_size=256" in warning
    )
    slots = {slot.session_id: slot.row_groups for slot in stream.slots()}
    assert slots == {
        "alpha": [(0, 0), (0, 1)],
        "beta": [(0, 2), (0, 3)],
        "gamma": [(0, 3), (0, 4)],
    }  # rows 0-2, 3-5, 6-8


class _CountingList(list):
    """A list that counts the elements read from it (bisection reads a few, a walk reads them all)."""

    reads = 0

    def __getitem__(self, index):
        _CountingList.reads += 1
        return super().__getitem__(index)


def test_planning_reads_each_sessions_pieces_by_bisection_not_by_walking_the_file(tmp_path):
    """One row group per row and a session per row: finding a session's pieces must not walk the
    file's row groups (the O(sessions x groups) set-up that took minutes at 64-row groups)."""
    table = baseline_table()
    rows = 3000
    big = pa.concat_tables([table.slice(0, 1)] * rows)
    big = big.set_column(0, "session_id", pa.array([f"s{i:05d}" for i in range(rows)]))
    path = write_dump(tmp_path / "many.parquet", big, row_group_size=1)
    stream = iter_sessions(path, vocab_size=VOCAB)
    stream._piece_starts = [_CountingList(starts) for starts in stream._piece_starts]
    _CountingList.reads = 0
    slots = list(stream.slots())
    assert [slot.row_groups for slot in slots] == [[(0, i)] for i in range(rows)]
    # two bisections of 3000 starts per session: about 2 x 12 reads each, where a walk reads 3000
    assert _CountingList.reads <= rows * 2 * 13


def test_iter_sessions_streams_without_reading_the_whole_dump(tmp_path, monkeypatch):
    batches_read = []
    real = load_module.iter_batches

    def counting(path, columns, batch_rows):
        for batch in real(path, columns, batch_rows):
            if len(columns) > 1:  # pass 2
                batches_read.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(load_module, "iter_batches", counting)
    monkeypatch.setattr(load_module, "ROW_BATCH_ROWS", 2)
    # Without reading ahead, which may decode a batch or two more, as the threads happen to run
    # (tests/test_read_ahead.py bounds that): this counts what the stream itself asks for.
    monkeypatch.setattr(load_module, "read_ahead", iter)
    stream = iter_sessions(write_dump(tmp_path / "d.parquet"), vocab_size=VOCAB)
    assert stream.session_count == 3 and batches_read == []  # the index read session_id only
    first = next(stream)
    assert isinstance(first, Session) and first.session_id == "alpha"
    assert sum(batches_read) == 4  # alpha ends at row 2, found in the second 2-row batch
    assert [item.session_id for item in stream] == ["beta", "gamma"]


def test_iter_sessions_yields_quarantine_entries_in_stream(tmp_path):
    table = with_cell(baseline_table(), "output_logprobs", 1, [0.0])
    items = list(iter_sessions(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB))
    assert [type(i).__name__ for i in items] == ["QuarantineEntry", "Session", "Session"]
    assert isinstance(items[0], QuarantineEntry) and items[0].session_id == "alpha"


# --------------------------------------------------------------------------------------------
# Metadata and vocabulary


def _with_meta(table: pa.Table, **keys: str) -> pa.Table:
    return table.replace_schema_metadata({f"trace_tools.{k}".encode(): v.encode() for k, v in keys.items()})


def test_file_metadata_and_keyword_overrides(tmp_path):
    table = _with_meta(
        baseline_table(),
        schema_version="1",
        tokenizer="my-tok",
        chat_template="{{ x }}",
        history_mode="linear",
        harness="claude-code",
        recorder="gw-7",
    )
    path = write_dump(tmp_path / "d.parquet", table)
    meta = read_dump_meta(path)
    found = (meta.tokenizer, meta.chat_template, meta.history_mode, meta.harness)
    assert found == ("my-tok", "{{ x }}", "linear", "claude-code")
    assert meta.extra == {"recorder": "gw-7"}
    dump = load(path, tokenizer="other", history_mode="tree", vocab_size=VOCAB)
    assert (dump.meta.tokenizer, dump.meta.history_mode, dump.meta.harness) == ("other", "tree", "claude-code")
    assert dump.sessions[0].meta == dump.meta


def test_disagreeing_files_first_wins_and_is_reported(tmp_path):
    table = baseline_table()
    write_dump(tmp_path / "dump" / "a.parquet", _with_meta(table.slice(0, 3), harness="first", tokenizer="qwen3"))
    write_dump(tmp_path / "dump" / "b.parquet", _with_meta(table.slice(3), harness="second", history_mode="linear"))
    dump = load(tmp_path / "dump", vocab_size=VOCAB)
    assert (dump.meta.harness, dump.meta.tokenizer, dump.meta.history_mode) == ("first", "qwen3", "linear")
    [warning] = dump.warnings
    assert "trace_tools.harness" in warning and "a.parquet" in warning and "b.parquet" in warning


def test_another_schema_version_is_refused_naming_the_supported_ones(tmp_path):
    with pytest.raises(
        UnusableInput,
        match=r"declares trace_tools.schema_version '2'; this trace-tools reads schema "
        r"version 1: convert the dump",
    ):
        load(write_dump(tmp_path / "d.parquet", _with_meta(baseline_table(), schema_version="2")))


def test_vocabulary_from_the_tokenizer_name(tmp_path):
    table = with_cell(_with_meta(baseline_table(), tokenizer="qwen3"), "output_ids", 0, [151668, 151669, 3, 4])
    path = write_dump(tmp_path / "d.parquet", table)
    dump = load(path)
    assert dump.vocab_checked and dump.vocab_size == 151669
    assert [(e.session_id, e.reason) for e in dump.quarantine] == [("alpha", "out_of_vocab")]
    assert load(path, tokenizer="qwen3.5").quarantine == []  # 248077 ids
    unknown = load(path, tokenizer="no-such-tokenizer")
    assert not unknown.vocab_checked and unknown.quarantine == []
    assert any("no-such-tokenizer" in w for w in unknown.warnings)


def test_without_a_tokenizer_the_vocabulary_check_is_skipped(tmp_path):
    table = with_cell(baseline_table(), "output_ids", 0, [10**6, 1, 2, 3])
    dump = load(write_dump(tmp_path / "d.parquet", table))
    assert not dump.vocab_checked and dump.vocab_size is None
    assert dump.quarantine == [] and len(dump.sessions) == 3


# --------------------------------------------------------------------------------------------
# Unusable input


def test_no_such_path(tmp_path):
    with pytest.raises(UnusableInput, match="no such file or directory: .*missing; pass a Parquet file"):
        load(tmp_path / "missing")


def test_directory_without_parquet_files(tmp_path):
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(UnusableInput, match="no .parquet files under"):
        load(tmp_path)


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "d.parquet"
    path.write_text(json.dumps({"session_id": "x"}))
    with pytest.raises(UnusableInput, match=r"d.parquet is not a readable Parquet file \(.+\); re-export it"):
        load(path)


def test_truncated_parquet_file(tmp_path):
    path = write_dump(tmp_path / "dump" / "b.parquet")
    write_dump(tmp_path / "dump" / "a.parquet")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(UnusableInput, match="b.parquet is not a readable Parquet file") as caught:
        load(tmp_path / "dump")
    assert "\n" not in str(caught.value)


def test_corrupt_data_page_found_while_reading(tmp_path):
    path = write_dump(tmp_path / "d.parquet", row_group_size=None)
    data = bytearray(path.read_bytes())
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    start = pq.ParquetFile(path).metadata.row_group(0).column(2).data_page_offset  # messages
    data[start + 20 : min(start + 220, footer_start)] = b"\xff" * len(data[start + 20 : min(start + 220, footer_start)])
    path.write_bytes(bytes(data))
    with pytest.raises(UnusableInput, match="is not a readable Parquet file"):
        load(path)


def test_a_directory_mixing_recordings_keeps_each_files_metadata(tmp_path):
    """Two files recorded with different tokenizers: each session keeps its own file's metadata and
    vocabulary bound (ids valid for the larger vocabulary are not out of vocabulary)."""
    small = _with_meta(baseline_table(), tokenizer="qwen3", chat_template="{{ a }}")
    write_dump(tmp_path / "a.parquet", small)
    big = baseline_table()
    big = big.set_column(
        big.schema.get_field_index("session_id"),
        "session_id",
        pa.array([f"b-{x}" for x in big.column("session_id").to_pylist()]),
    )
    ids = [[200_000] * len(x) for x in big.column("output_ids").to_pylist()]
    big = big.set_column(big.schema.get_field_index("output_ids"), "output_ids", pa.array(ids, pa.list_(pa.int32())))
    write_dump(tmp_path / "b.parquet", _with_meta(big, tokenizer="qwen3.5", chat_template="{{ b }}"))
    dump = load(tmp_path)
    assert not dump.quarantine
    metas = {s.session_id[:2] == "b-": s.meta for s in dump.sessions}
    assert (metas[False].tokenizer, metas[False].chat_template) == ("qwen3", "{{ a }}")
    assert (metas[True].tokenizer, metas[True].chat_template) == ("qwen3.5", "{{ b }}")
    assert any("each session keeps its own file's value" in w for w in dump.warnings)


def test_stream_batches_hold_a_few_mib_of_rows_whatever_the_row_size():
    """Record batches are sized by bytes (`STREAM_BATCH_BYTES` at the file's mean row size), up to
    `ROW_BATCH_ROWS` rows: wide rows (80 kB of messages) come a few dozen at a time."""
    limit = dump_files.STREAM_BATCH_BYTES
    assert dump_files.batch_rows_within([(22, 2_600_000)] * 3, 128) == limit * 66 // 7_800_000
    assert dump_files.batch_rows_within([(1000, 50_000)], 128) == 128  # narrow rows: the row cap
    assert dump_files.batch_rows_within([(2, 40 * limit)], 128) == 1  # one row past the limit: one at a time
    assert dump_files.batch_rows_within([], 128) == dump_files.batch_rows_within([(0, 0)], 128) == 128


def test_a_files_footer_is_parsed_once_per_version_of_the_file(tmp_path, monkeypatch):
    """Workers read a file's row groups task by task: the footer indexing parsed is reused while
    the file is the same (name, size, modification time, read off the opened handle), and a file
    rewritten in between is read with its own footer, never the old one."""
    import os

    parsed = []
    real = pq.ParquetFile

    def counting(source, *args, metadata=None, **options):
        parsed.append(metadata is None)
        return real(source, *args, metadata=metadata, **options)

    monkeypatch.setattr(dump_files.pq, "ParquetFile", counting)
    monkeypatch.setattr(dump_files, "_FOOTERS", {})
    path = write_dump(tmp_path / "d.parquet", baseline_table(), row_group_size=3)
    stream = iter_sessions(path, vocab_size=VOCAB)
    first = read_like_workers(stream)
    assert parsed[0] is True and parsed.count(True) == 1 and len(parsed) > 3  # parsed at indexing only

    table = with_cell(baseline_table(), "response", 0, None)  # same shape, other bytes
    write_dump(path, table, row_group_size=4)
    os.utime(path, ns=(1, 1))  # a modification time no earlier read saw, whatever the clock's resolution
    parsed.clear()
    stream = iter_sessions(path, vocab_size=VOCAB)
    again = read_like_workers(stream)
    assert parsed[0] is True and parsed.count(True) == 1
    assert again == list(stream.positioned()) != first


def _random_column(rng):
    """A string, binary or list column of 0–11 rows, a fifth of them null, sliced half the time."""
    kind = rng.choice([pa.string(), pa.large_string(), pa.binary(), pa.list_(pa.int32()), pa.large_list(pa.int64())])
    cell = {pa.binary(): lambda k: b"y" * k}.get(
        kind, lambda k: "x" * k if pa.types.is_string(kind) or pa.types.is_large_string(kind) else list(range(k))
    )
    column = pa.array([None if rng.random() < 0.2 else cell(rng.randrange(20)) for _ in range(rng.randrange(12))], kind)
    if len(column) and rng.random() < 0.5:
        start = rng.randrange(len(column))
        column = column.slice(start, rng.randrange(len(column) - start + 1))
    return column


def test_cell_sizes_validity_and_list_values_read_off_the_buffers_match_pyarrow_compute():
    """Reading a dump imports no `pyarrow.compute` (30 ms a process): cell sizes, validity and a list
    column's values are read off Arrow's buffers. On random columns, sliced or not, with nulls, each
    equals what `pyarrow.compute` (the oracle here) says."""
    import random

    import pyarrow.compute as pc

    from trace_tools.io.id_columns import list_values, oversized_rows, validity

    rng = random.Random(5)
    for _ in range(2000):
        column, limit = _random_column(rng), rng.randrange(0, 40)
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            lengths = pc.multiply(pc.list_value_length(column), column.type.value_type.bit_width // 8)
            values, offsets = list_values(column)
            assert values.to_pylist() == column.flatten().to_pylist()
            rows = [values[a:b].to_pylist() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
            assert [
                row if cell is not None else None for row, cell in zip(rows, column.to_pylist())
            ] == column.to_pylist()
        else:
            lengths = pc.binary_length(column)
        expected = {i: n for i, n in enumerate(lengths.to_pylist()) if n is not None and n > limit}
        assert oversized_rows(column, limit) == expected
        assert validity(column).tolist() == column.is_valid().to_pylist()


def test_the_replaying_process_imports_neither_pyarrow_compute_nor_pyarrow_dataset(tmp_path):
    """The process that hands sessions to the workers and writes the run: its reading ahead (a
    dump's UTC timestamps are not cast), the sample bars and the merge of the shards do without
    both (40 ms at a run's start, 20 ms at its end)."""
    import subprocess
    import sys

    script = """
import sys
from trace_tools.api import replay
replay(sys.argv[1], out=sys.argv[2], strategies=["tree", "linear"], workers=2, owns_process=True)
print(sorted(m for m in ("pyarrow.compute", "pyarrow.dataset") if m in sys.modules))
"""
    dump = Path(__file__).resolve().parents[1] / "sample_traces" / "qwen3.parquet"
    command = [sys.executable, "-c", script, str(dump), str(tmp_path / "run")]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_reading_and_reconstructing_a_dump_imports_neither_pyarrow_compute_nor_numpy_ma():
    """Each costs a process that reads a dump tens of milliseconds before its first session (in
    `reconstruct`, in the calling process before its workers fork or in every worker): the
    stream, a worker's reading of its row groups and sessions, and the comparisons do without."""
    import subprocess
    import sys

    script = """
import sys
from trace_tools.reconstruct import RECONSTRUCT_COLUMNS, reconstruct
from trace_tools.reconstruct.workers import _read_parts
from trace_tools.io.load import iter_sessions, read_session
assert reconstruct(sys.argv[1], workers=1, owns_process=True).summary["rate"] == 1.0
stream = iter_sessions(sys.argv[1], columns=RECONSTRUCT_COLUMNS)
slots = [slot for slot in stream.slots() if not slot.problems]
parts = _read_parts(stream.context(), slots)
assert all(type(read_session(stream.context(), s, parts[s.position], id_arrays=True)).__name__ == "Session" for s in slots)
print(sorted(m for m in ("pyarrow.compute", "numpy.ma") if m in sys.modules))
"""
    dump = Path(__file__).resolve().parents[1] / "sample_traces" / "qwen3.parquet"
    done = subprocess.run([sys.executable, "-c", script, str(dump)], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
