"""`trace-tools import` of agent-framework recordings: Harbor ATIF, NeMo Gym rollouts, OpenTelemetry spans.

Each fixture (tests/agent_fixtures.py, the two shared sessions in the upstream shape) imports
into the right sessions, turns, messages, ids, logprobs and step, validates clean and replays
with exact prompt fidelity; each hostile variant quarantines its session with the right reason
and one line, never a traceback.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest
from typer.testing import CliRunner

from agent_fixtures import REWARDS, STEP, WEIGHTS
from import_fixtures import FIXTURES, conversations
from trace_tools.api import replay
from trace_tools.cli.main import app
from trace_tools.importers import quarantine_path
from trace_tools.io.load import load

HARBOR = FIXTURES / "harbor-job"
TRAJECTORY = "fix-flaky-test__trial/agent/trajectory.json"
QWEN3_VOCAB = 151669

# (format, fixture, session key, what the format does not carry: compared as None instead)
CASES = [
    ("harbor-atif", "harbor-job", None, {"finish_reason", "request_id"}),
    ("nemo-gym", "nemo_gym_rollouts.jsonl", None, {"finish_reason", "request_id"}),
    ("otel", "otel_otlp_spans.jsonl", "agentlightning.rollout_id", set()),
    ("otel", "otel_store_spans.jsonl", "rollout_id", set()),
]
SESSION_OF = {"nemo-gym": {"0:0": "fix-flaky-test", "1:0": "explain-config"}}


@pytest.fixture(scope="module")
def originals():
    from trace_tools.render.renderer import Renderer

    return {s.session_id: s for s in conversations(Renderer.from_spec("qwen3", "qwen3"))}


def _cli(tmp_path: Path, fmt: str, source: Path, key: str | None = None, *extra: str):
    out = tmp_path / "dump.parquet"
    args = ["import", fmt, str(source), "--out", str(out), "--tokenizer", "qwen3", "--chat-template", "qwen3"]
    args += ["--session-key", key] if key else []
    result = CliRunner().invoke(app, [*args, *extra])
    assert "Traceback" not in result.output
    return result, out


def _quarantine(out: Path) -> list[dict]:
    return [json.loads(line) for line in quarantine_path(out).read_text().splitlines()]


@pytest.mark.parametrize("fmt,fixture,key,lost", CASES, ids=[c[1] for c in CASES])
def test_fixture_imports_with_every_field_validates_clean_and_replays_exactly(
    tmp_path, fmt, fixture, key, lost, originals
):
    result, out = _cli(tmp_path, fmt, FIXTURES / fixture, key, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["turns"], report["sessions"], report["quarantined_records"]) == (4, 2, 0)
    dump = load(out)
    assert sorted(s.session_id for s in dump.sessions) == sorted(SESSION_OF.get(fmt, originals))
    for session in dump.sessions:
        source = originals[SESSION_OF.get(fmt, {}).get(session.session_id, session.session_id)]
        assert [t.turn_index for t in session.turns] == [0, 1]
        for got, want in zip(session.turns, source.turns):
            assert got.messages == want.messages
            assert got.tools == want.tools
            assert (got.output_ids, got.prompt_ids) == (want.output_ids, want.prompt_ids)
            assert got.output_logprobs == pytest.approx(want.output_logprobs, abs=1e-6)  # stored as float32
            assert got.response == want.response
            for name in ("finish_reason", "request_id"):
                assert getattr(got, name) == (None if name in lost else getattr(want, name)), name
            assert (got.step, got.weight_version) == (STEP, WEIGHTS)
        if fmt == "nemo-gym":  # the rollout's reward, on its last turn
            assert [t.reward for t in session.turns] == [None, REWARDS[source.session_id]]
    assert CliRunner().invoke(app, ["validate", str(out)]).exit_code == 0
    summary = replay(out, out=tmp_path / "run", strategies=["tree"]).summary
    assert summary["prompt_fidelity"] == {"turns_compared": 4, "exact": 4, "rate": 1.0}


def test_a_harbor_job_directory_gives_only_its_trajectories(tmp_path):
    """The trial's result.json (and any other JSON) next to trajectory.json is not read as a trial."""
    assert sorted(p.name for p in HARBOR.rglob("*.json")) == ["result.json"] * 2 + ["trajectory.json"] * 2
    result, _ = _cli(tmp_path, "harbor-atif", HARBOR, None, "--json")
    assert json.loads(result.output)["files"] == 2


def test_otel_turns_follow_span_start_not_line_order(tmp_path):
    lines = (FIXTURES / "otel_store_spans.jsonl").read_text().splitlines()
    starts = [json.loads(line)["start_time"] for line in lines if json.loads(line)["name"] == "chat"]
    assert starts[0] > starts[1]  # the fixture writes the later call first
    _, out = _cli(tmp_path, "otel", FIXTURES / "otel_store_spans.jsonl", "rollout_id")
    for session in load(out).sessions:
        assert [t.started_at for t in session.turns] == sorted(t.started_at for t in session.turns)
        assert len(session.turns[1].messages) > len(session.turns[0].messages)


def test_otel_error_span_is_a_rejected_request_and_a_gap(tmp_path):
    lines = [json.loads(line) for line in (FIXTURES / "otel_store_spans.jsonl").read_text().splitlines()]
    failed = copy.deepcopy(lines[1])  # the first call of fix-flaky-test, failed and retried
    failed.update(status={"status_code": "ERROR", "description": "engine overloaded"}, start_time=1.0)
    source = tmp_path / "spans.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in [*lines, failed]))
    result, out = _cli(tmp_path, "otel", source, "rollout_id", "--json")
    assert json.loads(result.output)["rejected_requests"] == 1
    indices = {s.session_id: [t.turn_index for t in s.turns] for s in load(out).sessions}
    assert indices["fix-flaky-test"] == [1, 2]  # the failed call started first
    [entry] = _quarantine(out)
    assert (entry["reason"], entry["turn_index"]) == ("rejected_request", 0)
    assert entry["detail"] == "span status error: engine overloaded"


@pytest.mark.parametrize(
    "args,message",
    [
        (["otel", str(FIXTURES / "otel_otlp_spans.jsonl")], "--session-key"),
        (["otel", str(FIXTURES / "otel_otlp_spans.jsonl"), "--session-key", "no.such.attribute"], "--session-key"),
        (["harbor-atif", str(FIXTURES / "nemo_gym_rollouts.jsonl").replace(".jsonl", "")], "no such file"),
    ],
)
def test_unusable_input_exits_2_with_one_line(tmp_path, args, message):
    result = CliRunner().invoke(app, ["import", *args, "--out", str(tmp_path / "d.parquet")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


# -- hostile variants ------------------------------------------------------------------------------


def _agent_steps(trajectory: dict) -> list[dict]:
    return [step for step in trajectory["steps"] if step["source"] == "agent"]


def _first_metrics(trajectory: dict) -> dict:
    return _agent_steps(trajectory)[0]["metrics"]


def _strip_atif_ids(trajectory: dict) -> None:
    for step in _agent_steps(trajectory):
        for name in ("prompt_token_ids", "completion_token_ids", "logprobs"):
            step["metrics"].pop(name)


def _first_call(rollout: dict) -> dict:
    return next(item for item in rollout["response"]["output"] if "generation_token_ids" in item)


def _strip_gym_ids(rollout: dict) -> None:
    for item in rollout["response"]["output"]:
        for name in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
            item.pop(name, None)


def _first_span(line: dict) -> dict[str, Any]:
    """The attributes (flat, the store's shape) of the first call span of a line."""
    return line["attributes"]


def _set_logprob(line: dict, value: float) -> None:
    entries = json.loads(_first_span(line)["logprobs.content"])
    entries[0]["logprob"] = value
    _first_span(line)["logprobs.content"] = json.dumps(entries)


def _drop_logprob(line: dict) -> None:
    _first_span(line)["logprobs.content"] = json.dumps(json.loads(_first_span(line)["logprobs.content"])[1:])


HOSTILE: list[tuple[str, str, Callable[[dict], Any], str, str]] = [
    # (name, format, mutation of fix-flaky-test's record, reason, words in the detail)
    ("atif_no_token_ids", "harbor-atif", _strip_atif_ids, "missing_field", "recorded without token ids"),
    (
        "atif_string_ids",
        "harbor-atif",
        lambda t: _first_metrics(t).update(
            completion_token_ids=[str(i) for i in _first_metrics(t)["completion_token_ids"]]
        ),
        "wrong_type",
        "not a token id",
    ),
    (
        "atif_lengths_disagree",
        "harbor-atif",
        lambda t: _first_metrics(t)["logprobs"].pop(),
        "logprobs_length",
        "output ids",
    ),
    (
        "atif_out_of_vocab",
        "harbor-atif",
        lambda t: _first_metrics(t)["completion_token_ids"].__setitem__(0, QWEN3_VOCAB),
        "out_of_vocab",
        "vocabulary size 151669",
    ),
    (
        "atif_nan_logprob",
        "harbor-atif",
        lambda t: _first_metrics(t)["logprobs"].__setitem__(0, math.nan),
        "bad_logprob",
        "nan",
    ),
    (
        "atif_arguments_text",
        "harbor-atif",
        lambda t: _agent_steps(t)[0]["tool_calls"][0].update(arguments="pytest -q"),
        "wrong_type",
        "arguments",
    ),
    ("atif_steps_not_array", "harbor-atif", lambda t: t.update(steps={"1": {}}), "wrong_type", "steps"),
    ("gym_no_token_ids", "nemo-gym", _strip_gym_ids, "missing_field", "recorded without token ids"),
    (
        "gym_lengths_disagree",
        "nemo-gym",
        lambda r: _first_call(r)["generation_log_probs"].pop(),
        "logprobs_length",
        "output ids",
    ),
    (
        "gym_out_of_vocab",
        "nemo-gym",
        lambda r: _first_call(r)["prompt_token_ids"].__setitem__(0, -1),
        "out_of_vocab",
        "prompt_token_ids[0]",
    ),
    (
        "gym_nan_logprob",
        "nemo-gym",
        lambda r: _first_call(r)["generation_log_probs"].__setitem__(0, math.nan),
        "bad_logprob",
        "nan",
    ),
    ("gym_ids_text", "nemo-gym", lambda r: _first_call(r).update(generation_token_ids="1 2 3"), "wrong_type", "array"),
    (
        "gym_output_not_array",
        "nemo-gym",
        lambda r: r["response"].update(output="done"),
        "wrong_type",
        "response.output",
    ),
    ("otel_no_token_ids", "otel", lambda s: _first_span(s).pop("response_token_ids"), "missing_field", "token ids"),
    ("otel_lengths_disagree", "otel", _drop_logprob, "logprobs_length", "output ids"),
    ("otel_nan_logprob", "otel", lambda s: _set_logprob(s, math.nan), "bad_logprob", "nan"),
    (
        "otel_out_of_vocab",
        "otel",
        lambda s: _first_span(s)["response_token_ids"].__setitem__(0, QWEN3_VOCAB + 5),
        "out_of_vocab",
        "response_token_ids[0]",
    ),
    ("otel_ids_not_json", "otel", lambda s: _first_span(s).update(prompt_token_ids="[1, 2"), "wrong_type", "not JSON"),
    (
        "otel_messages_not_json",
        "otel",
        lambda s: _first_span(s).update({"gen_ai.input.messages": "{}"}),
        "wrong_type",
        "array",
    ),
]


def _hostile_source(tmp_path: Path, fmt: str, mutate: Callable[[dict], Any]) -> Path:
    """The format's fixture with fix-flaky-test's record mutated (a copy under tmp_path)."""
    if fmt == "harbor-atif":
        source = tmp_path / "job"
        for path in HARBOR.rglob("trajectory.json"):
            target = source / path.relative_to(HARBOR)
            target.parent.mkdir(parents=True)
            document = json.loads(path.read_text())
            if path.match(f"*/{TRAJECTORY}"):
                mutate(document)
            target.write_text(json.dumps(document))
        return source
    name = {"nemo-gym": "nemo_gym_rollouts.jsonl", "otel": "otel_store_spans.jsonl"}[fmt]
    records = [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]
    target = next(r for r in records if fmt != "otel" or r["name"] == "chat")  # fix-flaky-test comes first
    mutate(target)
    source = tmp_path / name
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    return source


@pytest.mark.parametrize("name,fmt,mutate,reason,words", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_record_quarantines_its_session_with_reason_and_one_line(tmp_path, name, fmt, mutate, reason, words):
    source = _hostile_source(tmp_path, fmt, mutate)
    key = "rollout_id" if fmt == "otel" else None
    result, out = _cli(tmp_path, fmt, source, key, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["by_reason"].get(reason) == 1 and report["quarantined_sessions"] == 1, report["by_reason"]
    assert [s.session_id for s in load(out).sessions] in (["explain-config"], ["1:0"])
    bad = next(e for e in _quarantine(out) if e["reason"] == reason)
    assert words.lower() in bad["detail"].lower() and "\n" not in bad["detail"], bad["detail"]
    assert CliRunner().invoke(app, ["validate", str(out)]).exit_code == 0
    strict, _ = _cli(tmp_path, fmt, source, key, "--strict", "--overwrite")
    assert strict.exit_code == 1 and reason in strict.output


# -- no traceback, whatever a field holds --------------------------------------------------------------

WRONG_VALUES = (None, "x", 1.5, -1, True, [], {}, [None], math.nan)
FIXTURE_OF = {
    "harbor-atif": [HARBOR / TRAJECTORY],
    "nemo-gym": [FIXTURES / "nemo_gym_rollouts.jsonl"],
    "otel": [FIXTURES / "otel_otlp_spans.jsonl", FIXTURES / "otel_store_spans.jsonl"],
}


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every place in a JSON value (the first three items of a list), as a key path."""
    found = [path]
    children = value.items() if isinstance(value, dict) else enumerate(value[:3]) if isinstance(value, list) else ()
    for key, child in children:
        found += _paths(child, (*path, key))
    return found


def _replaced(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copied = copy.copy(value)
    copied[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copied


@pytest.mark.parametrize("fmt", sorted(FIXTURE_OF))
def test_every_field_of_the_wrong_type_is_an_outcome_never_an_exception(fmt):
    from trace_tools.importers.base import IMPORT_REASONS, Options, json_values
    from trace_tools.importers.formats import FORMATS

    reader, options = FORMATS[fmt].load(), Options(fmt, session_key="rollout_id" if fmt == "otel" else None)
    mutations = 0
    for path in FIXTURE_OF[fmt]:
        for where, record in json_values(path):
            for place in _paths(record)[1:]:
                for new in WRONG_VALUES:
                    mutated = _replaced(record, place, new)
                    for outcome in reader.outcomes(mutated, where, options):
                        assert outcome.reason is None or outcome.reason in IMPORT_REASONS
                        assert "\n" not in outcome.detail
                    mutations += 1
    assert mutations > 500  # every place of the fixture tried


def test_a_gym_call_without_token_ids_between_two_with_them_quarantines_the_rollout(tmp_path):
    """The second call of fix-flaky-test recorded without ids: the rollout cannot be replayed whole."""
    records = [json.loads(line) for line in (FIXTURES / "nemo_gym_rollouts.jsonl").read_text().splitlines()]
    last = [item for item in records[0]["response"]["output"] if "generation_token_ids" in item][-1]
    for name in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
        del last[name]
    source = tmp_path / "rollouts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    result, out = _cli(tmp_path, "nemo-gym", source, None, "--json")
    assert json.loads(result.output)["by_reason"] == {"missing_field": 1}
    [entry] = _quarantine(out)
    assert (
        entry["session_id"] == "0:0" and "a model call's output items carry no generation_token_ids" in entry["detail"]
    )
