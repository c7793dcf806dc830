"""`trace-tools import`: each format's fixtures become a clean, replayable dump; bad records are accounted for."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from import_fixtures import FIXTURES, conversations, miles_document, write_fixtures
from trace_tools.api import replay
from trace_tools.cli.main import app
from trace_tools.importers import import_traces, quarantine_path
from trace_tools.io.load import load
from trace_tools.io.validate import validate

# (format, fixture, session key): every committed fixture and the option its format needs.
CASES = [
    ("miles", "miles_sessions.json", None),
    ("miles", "miles_requests.jsonl", None),
    ("openai", "sglang_exchanges.jsonl", "x-session-id"),
    ("openai", "vllm_exchanges.jsonl", "user"),
    ("gateway-traces", "gateway_traces.jsonl", None),
]


@pytest.fixture(scope="module")
def renderer():
    from trace_tools.render.renderer import Renderer

    return Renderer.from_spec("qwen3", "qwen3")


@pytest.fixture(scope="module")
def originals(renderer):
    return {s.session_id: s for s in conversations(renderer)}


def _import(tmp_path: Path, fmt: str, sources, key=None, **options):
    out = tmp_path / "dump.parquet"
    return import_traces(
        fmt, [str(s) for s in sources], out, tokenizer="qwen3", chat_template="qwen3", session_key=key, **options
    ), out


def _quarantine(out: Path) -> list[dict]:
    return [json.loads(line) for line in quarantine_path(out).read_text().splitlines()]


def test_committed_fixtures_are_what_the_writers_produce(tmp_path, renderer):
    for path in write_fixtures(tmp_path, renderer):
        committed = FIXTURES / path.relative_to(tmp_path)
        assert committed.read_text().splitlines() == path.read_text().splitlines(), path.name


@pytest.mark.parametrize("fmt,fixture,key", CASES, ids=[c[1] for c in CASES])
def test_fixture_imports_validates_clean_and_replays_with_exact_fidelity(tmp_path, fmt, fixture, key, originals):
    report, out = _import(tmp_path, fmt, [FIXTURES / fixture], key)
    assert (report.turns, report.sessions, report.quarantined_records) == (4, 2, 0)
    assert validate(out).clean
    dump = load(out)
    for session in dump.sessions:
        source = originals[session.session_id]
        assert [t.messages for t in session.turns] == [t.messages for t in source.turns]
        assert [t.output_ids for t in session.turns] == [t.output_ids for t in source.turns]
        assert [t.prompt_ids for t in session.turns] == [t.prompt_ids for t in source.turns]
        assert [t.response for t in session.turns] == [t.response for t in source.turns]
        assert [t.finish_reason for t in session.turns] == [t.finish_reason for t in source.turns]
        assert all(len(t.output_logprobs) == len(t.output_ids) for t in session.turns)
    assert dump.meta.tokenizer == "qwen3" and "<|im_start|>" in dump.meta.chat_template
    summary = replay(out, out=tmp_path / "run", strategies=["tree"]).summary
    assert summary["prompt_fidelity"] == {"turns_compared": 4, "exact": 4, "rate": 1.0}
    assert summary["strategies"]["tree"]["generated_tokens"] == sum(
        len(t.output_ids) for s in originals.values() for t in s.turns
    )


def test_rejected_miles_request_is_a_gap_listed_and_counted(tmp_path):
    report, out = _import(tmp_path, "miles", [FIXTURES / "miles_sessions.json"])
    assert (report.records, report.turns, report.rejected_requests) == (5, 4, 1)
    indices = {s.session_id: [t.turn_index for t in s.turns] for s in load(out).sessions}
    assert indices == {"fix-flaky-test": [0, 1], "explain-config": [0, 2]}
    [entry] = _quarantine(out)
    assert entry["reason"] == "rejected_request" and entry["turn_index"] == 1
    assert entry["detail"].startswith("status 400: messages do not extend")
    census = json.loads(pq.ParquetFile(out).schema_arrow.metadata[b"trace_tools.import"])
    assert (census["rejected_requests"], census["quarantined_records"], census["turns"]) == (1, 0, 4)


def _lines(fixture: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / fixture).read_text().splitlines()]


def _choice(record: dict) -> dict:
    return record["response"]["choices"][0]


# (name, fixture, session key, mutation of the first record of session fix-flaky-test, reason)
MALFORMED = [
    ("no_meta_info", "miles_requests.jsonl", None, lambda r: _choice(r).pop("meta_info"), "missing_field"),
    (
        "null_content",
        "miles_requests.jsonl",
        None,
        lambda r: _choice(r)["message"].update(content=None),
        "missing_field",
    ),
    (
        "count_mismatch",
        "miles_requests.jsonl",
        None,
        lambda r: _choice(r)["meta_info"].update(completion_tokens=1),
        "count_mismatch",
    ),
    (
        "out_of_vocab",
        "miles_requests.jsonl",
        None,
        lambda r: _choice(r)["meta_info"]["output_token_logprobs"][0].__setitem__(1, 151669),
        "out_of_vocab",
    ),
    (
        "positive_logprob",
        "sglang_exchanges.jsonl",
        "x-session-id",
        lambda r: _choice(r)["meta_info"]["output_token_logprobs"][0].__setitem__(0, 0.5),
        "bad_logprob",
    ),
    (
        "vllm_logprobs_length",
        "vllm_exchanges.jsonl",
        "user",
        lambda r: _choice(r)["logprobs"]["content"].pop(),
        "logprobs_length",
    ),
    ("vllm_no_ids", "vllm_exchanges.jsonl", "user", lambda r: _choice(r).pop("token_ids"), "missing_field"),
    (
        "string_ids",
        "gateway_traces.jsonl",
        None,
        lambda r: r.update(output_ids=[str(t) for t in r["output_ids"]]),
        "wrong_type",
    ),
    ("no_messages", "gateway_traces.jsonl", None, lambda r: r.pop("messages"), "empty_messages"),
    ("bad_prompt_ids", "gateway_traces.jsonl", None, lambda r: r.update(prompt_ids={"ids": []}), "wrong_type"),
]


@pytest.mark.parametrize("name,fixture,key,mutate,reason", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_record_quarantines_its_session_with_a_reason(tmp_path, name, fixture, key, mutate, reason):
    records = _lines(fixture)
    mutate(records[0])
    source = tmp_path / "source.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    fmt = {"miles": "miles", "sglang": "openai", "vllm": "openai", "gateway": "gateway-traces"}[fixture.split("_")[0]]
    report, out = _import(tmp_path, fmt, [source], key)
    assert report.by_reason == {reason: 1, "session_quarantined": 1}
    assert (report.turns, report.sessions, report.quarantined_sessions) == (2, 1, 1)
    assert [s.session_id for s in load(out).sessions] == ["explain-config"]
    entries = _quarantine(out)
    assert [(e["session_id"], e["turn_index"], e["reason"]) for e in entries] == [
        ("fix-flaky-test", 0, reason),
        ("fix-flaky-test", 1, "session_quarantined"),
    ]
    assert "source.jsonl:1" in entries[1]["detail"]
    assert validate(out).clean


def test_unparsable_and_sessionless_lines_are_counted_not_dropped(tmp_path):
    records = _lines("gateway_traces.jsonl")
    sessionless = copy.deepcopy(records[0])
    del sessionless["session_id"]
    source = tmp_path / "source.jsonl"
    source.write_text(
        "".join(json.dumps(r) + "\n" for r in records) + "{not json\n" + json.dumps(sessionless) + "\n[1, 2]\n"
    )
    report, out = _import(tmp_path, "gateway-traces", [source])
    assert report.by_reason == {"bad_json": 2, "no_session": 1}
    assert (report.records, report.turns, report.sessions) == (7, 4, 2)
    assert [e["source"] for e in _quarantine(out)] == ["source.jsonl:5", "source.jsonl:6", "source.jsonl:7"]


def test_streams_many_files_and_row_groups(tmp_path):
    source = tmp_path / "logs"
    source.mkdir()
    for number, record in enumerate(_lines("miles_requests.jsonl")):
        (source / f"part-{number:02d}.jsonl").write_text(json.dumps(record) + "\n")
    report, out = _import(tmp_path, "miles", [source], row_group_rows=1)
    assert report.files == 4 and pq.ParquetFile(out).metadata.num_row_groups == 4
    _, whole_out = _import(tmp_path / "whole", "miles", [FIXTURES / "miles_requests.jsonl"])
    assert [(t.session_id, t.turn_index, t.output_ids) for s in load(out).sessions for t in s.turns] == [
        (t.session_id, t.turn_index, t.output_ids) for s in load(whole_out).sessions for t in s.turns
    ]


def test_miles_round_trip_gives_the_same_strategy_numbers(tmp_path, simulated_dump):
    """A simulated dump exported as miles session documents, imported and replayed: same summary per strategy."""
    source = tmp_path / "sessions.json"
    source.write_text(json.dumps([miles_document(s) for s in load(simulated_dump).sessions]))
    out = tmp_path / "imported.parquet"
    report = import_traces("miles", [source], out, tokenizer="qwen3", chat_template=str(simulated_dump))
    assert report.quarantined_records == 0 and validate(out).clean
    original = replay(simulated_dump, out=tmp_path / "original").summary
    imported = replay(out, out=tmp_path / "imported").summary
    assert imported["prompt_fidelity"] == original["prompt_fidelity"]
    assert imported["strategies"] == original["strategies"]
    assert original["strategies"]["tree"]["sessions"] == 12


def test_template_from_a_dump_file_is_embedded_verbatim(tmp_path):
    sample = Path(__file__).parents[1] / "sample_traces" / "qwen3.parquet"
    out = tmp_path / "dump.parquet"
    import_traces(
        "gateway-traces", [FIXTURES / "gateway_traces.jsonl"], out, tokenizer="qwen3", chat_template=str(sample)
    )
    assert load(out).meta.chat_template == load(sample).meta.chat_template


@pytest.mark.parametrize(
    "args,message",
    [
        (["openai", str(FIXTURES / "sglang_exchanges.jsonl")], "--session-key"),
        (["csv", str(FIXTURES / "gateway_traces.jsonl")], "unknown import format"),
        (["miles", "no/such/file.jsonl"], "no such file"),
        (["miles", str(FIXTURES / "miles_sessions.json"), "--chat-template", "no-such.jinja"], "--chat-template"),
    ],
)
def test_unusable_input_exits_2_with_one_line(tmp_path, args, message):
    result = CliRunner().invoke(app, ["import", *args, "--out", str(tmp_path / "d.parquet")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_cli_imports_and_reports(tmp_path):
    out = tmp_path / "d.parquet"
    result = CliRunner().invoke(
        app,
        ["import", "miles", str(FIXTURES / "miles_sessions.json"), "--tokenizer", "qwen3", "--out", str(out), "--json"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["turns"], data["rejected_requests"], data["vocab_checked"]) == (4, 1, True)


def test_strict_exits_1_when_a_record_is_quarantined(tmp_path):
    records = _lines("gateway_traces.jsonl")
    del records[0]["messages"]
    source = tmp_path / "source.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = ["import", "gateway-traces", str(source), "--out", str(tmp_path / "d.parquet")]
    assert CliRunner().invoke(app, args).exit_code == 0
    result = CliRunner().invoke(app, [*args, "--strict", "--overwrite"])
    assert result.exit_code == 1 and "empty_messages" in result.output


def test_a_clean_import_writes_no_empty_quarantine_file(tmp_path):
    records = _lines("gateway_traces.jsonl")
    source = tmp_path / "source.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records[1:]) + "not json\n")
    out = tmp_path / "d.parquet"
    args = ["import", "gateway-traces", str(source), "--out", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert [e["reason"] for e in _quarantine(out)] == ["bad_json"]
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = CliRunner().invoke(app, [*args, "--overwrite"])
    assert result.exit_code == 0 and "nothing to quarantine" in result.output
    assert not quarantine_path(out).exists()  # the earlier import's list no longer describes the dump
    census = json.loads(pq.ParquetFile(out).schema_arrow.metadata[b"trace_tools.import"])
    assert census["quarantine_file"] is None and census["quarantined_records"] == 0


def test_steps_come_from_the_format_or_the_field_step_key_names(tmp_path):
    """A gateway trace's own `step` / `weight_version` fill the schema's columns; `--step-key` names
    another field (here a miles session document's metadata), and a value that is not a step
    quarantines the records it would label."""
    records = _lines("gateway_traces.jsonl")
    for number, record in enumerate(records):
        record.update(step=number // 2, weight_version=f"v{number // 2}")
    source = tmp_path / "steps.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    _, out = _import(tmp_path, "gateway-traces", [source])
    turns = [t for s in load(out).sessions for t in s.turns]
    assert sorted((t.step, t.weight_version) for t in turns) == sorted(
        (n // 2, f"v{n // 2}") for n in range(len(records))
    )
    assert all("step" not in t.metadata for t in turns)

    documents = json.loads((FIXTURES / "miles_sessions.json").read_text())
    for number, document in enumerate(documents):
        document.setdefault("metadata", {})["rollout_id"] = 40 + number
    named = tmp_path / "named" / "sessions.json"
    named.parent.mkdir()
    named.write_text(json.dumps(documents))
    _, out = _import(tmp_path / "named", "miles", [named], step_key="metadata.rollout_id")
    steps = {s.session_id: s.step for s in load(out).sessions}
    assert steps == {d["session_id"]: 40 + n for n, d in enumerate(documents)}

    documents[0]["metadata"]["rollout_id"] = "forty"
    named.write_text(json.dumps(documents))
    report, out = _import(tmp_path / "named", "miles", [named], step_key="metadata.rollout_id", overwrite=True)
    assert report.by_reason == {"wrong_type": len(documents[0]["records"])}
    assert "--step-key metadata.rollout_id" in _quarantine(out)[0]["detail"]
