"""Row validation is the single gate: bad text, bad messages and bad logprobs quarantine exactly their session.

Each case spoils one cell of the baseline dump (sessions alpha, beta, gamma) and checks that `load`
and `validate` agree: the one session is quarantined with the reason of docs/trace_schema.md#loading-validation-and-quarantine, the others load
unchanged, and nothing raises.
"""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

from io_support import VOCAB, baseline_table, with_cell, write_dump
from trace_tools.io import load, validate

MESSAGES = json.loads(baseline_table().column("messages")[4].as_py())  # beta, turn 1


def _messages(**changes) -> str:
    first = {**MESSAGES[0], **changes}
    return json.dumps([{k: v for k, v in first.items() if v is not ...}, *MESSAGES[1:]])


def _invalid_utf8(table: pa.Table, column: str, row: int) -> pa.Table:
    """The table with one string cell holding bytes that are not UTF-8 (a writer that never validated)."""
    values = [v.encode() if isinstance(v, str) else v for v in table.column(column).to_pylist()]
    values[row] = b"ls \xff\xfe -la"
    index = table.schema.get_field_index(column)
    return table.set_column(index, table.schema.field(index), pa.array(values, pa.binary()).view(pa.string()))


CASES = {
    "invalid UTF-8 in messages": (lambda t: _invalid_utf8(t, "messages", 4), "bad_text", "messages is not valid UTF-8"),
    "invalid UTF-8 in finish_reason": (lambda t: _invalid_utf8(t, "finish_reason", 4), "bad_text", "finish_reason"),
    "lone surrogate in a message": (
        lambda t: with_cell(t, "messages", 4, _messages(content="fix \ud800 it")),
        "bad_text",
        "lone surrogate",
    ),
    "lone surrogate in the response": (
        lambda t: with_cell(t, "response", 4, '{"content": "\\udc00"}'),
        "bad_text",
        "lone surrogate",
    ),
    "message without a role": (lambda t: with_cell(t, "messages", 4, _messages(role=...)), "bad_message", "no role"),
    "role that is not a name": (lambda t: with_cell(t, "messages", 4, _messages(role=7)), "bad_message", "role is 7"),
    "content of the wrong type": (
        lambda t: with_cell(t, "messages", 4, _messages(content=12)),
        "bad_message",
        "content",
    ),
    "tool call without a name": (
        lambda t: with_cell(t, "messages", 4, _messages(tool_calls=[{"function": {}}])),
        "bad_message",
        "no function name",
    ),
    "NaN logprob": (lambda t: with_cell(t, "output_logprobs", 4, [-0.5, math.nan, -1.0, -0.1]), "bad_logprob", "nan"),
    "+inf logprob": (lambda t: with_cell(t, "output_logprobs", 4, [-0.5, math.inf, -1.0, -0.1]), "bad_logprob", "inf"),
    "-inf logprob": (lambda t: with_cell(t, "output_logprobs", 4, [-0.5, -math.inf, -1.0, -0.1]), "bad_logprob", "inf"),
    "positive logprob": (lambda t: with_cell(t, "output_logprobs", 4, [-0.5, 0.25, -1.0, -0.1]), "bad_logprob", "0.25"),
    "tool schema that is not an object": (lambda t: with_cell(t, "tools", 4, '["Bash"]'), "bad_json", "tools[0]"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_one_bad_cell_quarantines_exactly_its_session(tmp_path, name):
    spoil, reason, needle = CASES[name]
    path = write_dump(tmp_path / "d.parquet", spoil(baseline_table()))
    loaded = load(path, vocab_size=VOCAB)
    assert [s.session_id for s in loaded.sessions] == ["alpha", "gamma"]
    assert [(e.session_id, e.turn_index, e.reason) for e in loaded.quarantine] == [("beta", 1, reason)]
    assert needle in loaded.quarantine[0].detail
    report = validate(path, vocab_size=VOCAB)
    assert (report.valid_sessions, report.by_reason) == (2, {reason: 1})


def test_invalid_utf8_session_id_quarantines_that_session_only(tmp_path):
    path = write_dump(tmp_path / "d.parquet", _invalid_utf8(baseline_table(), "session_id", 3))
    loaded = load(path, vocab_size=VOCAB)
    assert [s.session_id for s in loaded.sessions] == ["alpha", "beta", "gamma"]
    bad = [e for e in loaded.quarantine if e.reason == "bad_text"]
    assert [e.session_id for e in bad] == ["ls \\xff\\xfe -la"] and "session_id is not valid UTF-8" in bad[0].detail
    # beta lost its first row to the bad id: a turn_index gap is a warning, not a quarantine
    assert loaded.data_warnings == {"turn_index_gap": 1}


def test_empty_session_id_rows_belong_to_no_session(tmp_path):
    """Blank ids must not merge rows of several sessions into one invented session."""
    table = with_cell(with_cell(baseline_table(), "session_id", 2, ""), "session_id", 5, "  ")
    report = validate(write_dump(tmp_path / "d.parquet", table), vocab_size=VOCAB)
    assert report.sessions == 3 and report.valid_sessions == 3
    assert [(e.session_id, e.reason) for e in report.entries] == [(None, "bad_message")]
    assert "empty session_id in 2 rows (rows 2, 5)" in report.entries[0].detail
    assert not report.clean


def test_gaps_and_empty_generations_are_counted_warnings(tmp_path):
    table = baseline_table()
    table = with_cell(table, "output_ids", 7, [])
    table = with_cell(table, "output_logprobs", 7, [])
    gapped = table.filter(pa.array([i != 1 for i in range(table.num_rows)]))  # alpha loses turn 1
    path = write_dump(tmp_path / "d.parquet", gapped)
    report = validate(path, vocab_size=VOCAB)
    assert report.clean and report.valid_sessions == 3
    assert report.data_warnings == {"turn_index_gap": 1, "empty_generation": 1}
    assert report.warning_examples == {
        "turn_index_gap": "session alpha: turn 1",
        "empty_generation": "session gamma: turn 1",
    }
    assert load(path, vocab_size=VOCAB).data_warnings == report.data_warnings


def test_a_clean_dump_has_no_warnings(tmp_path):
    report = validate(write_dump(tmp_path / "d.parquet"), vocab_size=VOCAB)
    assert report.clean and report.data_warnings == {}


def test_validate_cli_prints_the_warnings_with_an_example(tmp_path):
    from typer.testing import CliRunner

    from trace_tools.cli.main import app

    gapped = baseline_table().filter(pa.array([i != 1 for i in range(9)]))  # alpha loses turn 1
    result = CliRunner().invoke(app, ["validate", str(write_dump(tmp_path / "d.parquet", gapped)), "--strict"])
    assert result.exit_code == 0  # legal: a warning, not a quarantine
    assert "warning: 1 session(s) with a turn_index gap (a dropped request?), e.g. session alpha: turn 1" in " ".join(
        result.output.split()
    )


def test_a_session_parser_reuses_the_previous_rows_messages_and_checks_only_the_new_ones():
    from trace_tools.io.rows import BadRow, HistoryParser, turn_from_record

    first = [{"role": "user", "content": "fix it"}]
    second = [*first, {"role": "assistant", "content": "done"}]
    parser = HistoryParser()
    earlier = parser(json.dumps(first))
    assert earlier == first and parser.reused == 0
    parsed = parser(json.dumps(second))
    assert parsed == second and parser.reused == 1 and parsed[0] is earlier[0]  # the same, already checked
    assert parser(json.dumps([{"role": "user", "content": "other"}])) and parser.reused == 0  # not an extension

    record = {"session_id": "s", "turn_index": 0, "messages": json.dumps(first), "output_ids": [1]}
    parser = HistoryParser()
    turn_from_record(record, VOCAB, parser)
    appended = json.dumps([*first, {"content": "no role"}])  # the new message is still checked
    with pytest.raises(BadRow, match="messages\\[1\\] has no role"):
        turn_from_record({**record, "turn_index": 1, "messages": appended}, VOCAB, parser)


def test_a_lone_surrogate_escape_is_searched_for_in_the_appended_text_only_and_still_found():
    """The search for surrogate escapes starts where the text the parser reused ends (that text was
    searched with its own row): a lone one in a new message still quarantines the row, a valid
    pair in the history is still accepted."""
    from trace_tools.io.rows import BadRow, HistoryParser, turn_from_record

    paired = [{"role": "user", "content": "ship it \U0001f680"}]  # written as a pair of escapes
    record = {"session_id": "s", "turn_index": 0, "messages": json.dumps(paired), "output_ids": [1]}
    parser = HistoryParser()
    turn_from_record(record, VOCAB, parser)
    grown = [*paired, {"role": "assistant", "content": "ok"}]
    turn_from_record({**record, "turn_index": 1, "messages": json.dumps(grown)}, VOCAB, parser)
    assert parser.reused == 1 and 0 < parser.reused_chars < len(json.dumps(grown))
    lone = json.dumps([*grown, {"role": "user", "content": "fix \ud800 it"}])
    assert lone.index("\\ud800") > parser.reused_chars
    with pytest.raises(BadRow, match="lone surrogate"):
        turn_from_record({**record, "turn_index": 2, "messages": lone}, VOCAB, parser)
