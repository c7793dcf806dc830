"""`explain` names the drift cause each simulated harness behaviour produces (docs/drift_causes.md#causes-first-match-wins-a-turn-lists-all-that-apply)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.replay.explain import explain

EXPECTED = {
    "claude-code": {"schema_default", "whitespace", "command_prefix"},
    "json-reserialize": {"key_order_or_spacing"},
    "reasoning-dropped": {"reasoning"},
    "reasoning-rekeyed": {"reasoning"},
    "streaming": {"tool_call_id"},
    "compaction": {"template_rewrite"},
    "noncanonical-tokenization": {"tokenizer_boundary"},
    "history-edit": {"genuine_edit"},
}
COSMETIC = {
    "whitespace",
    "schema_default",
    "command_prefix",
    "key_order_or_spacing",
    "reasoning",
    "tool_call_id",
    "tokenizer_boundary",
}


def _sessions_by_behaviour(path):
    out = {}
    for row in pq.read_table(path, columns=["session_id", "metadata"]).to_pylist():
        for behaviour in json.loads(row["metadata"])["behaviours"]:
            out.setdefault(behaviour, []).append(row["session_id"])
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    from trace_tools.simulate import simulate

    paths = {}
    for template in ("qwen3", "qwen3.5"):
        path = tmp_path_factory.mktemp("explain") / f"{template}.parquet"
        simulate(
            sessions=len(EXPECTED) + 4,
            seed=5,
            template=template,
            behaviours=list(EXPECTED) + ["byte-exact"],
            out=str(path),
        )
        paths[template] = path
    return paths


@pytest.mark.parametrize("template", ["qwen3", "qwen3.5"])
@pytest.mark.parametrize("behaviour", sorted(EXPECTED))
def test_explain_names_the_cause_of_each_behaviour(dumps, template, behaviour):
    path = dumps[template]
    sessions = _sessions_by_behaviour(path).get(behaviour)
    assert sessions, f"the simulator made no {behaviour} session"
    causes = set()
    for session in sessions:
        causes |= {f.cause for f in explain(path, session).findings if f.cause}
    assert causes & EXPECTED[behaviour], f"{behaviour}: found {causes}"


@pytest.mark.parametrize("template", ["qwen3", "qwen3.5"])
def test_byte_exact_sessions_have_no_drift(dumps, template):
    path = dumps[template]
    for session in _sessions_by_behaviour(path)["byte-exact"]:
        assert all(f.cause is None for f in explain(path, session).findings)


@pytest.mark.parametrize("template", ["qwen3", "qwen3.5"])
def test_a_genuine_edit_is_never_reported_as_cosmetic(dumps, template):
    path = dumps[template]
    for session in _sessions_by_behaviour(path)["history-edit"]:
        edited = [f for f in explain(path, session).findings if f.message_diff and f.cause == "genuine_edit"]
        assert edited
        for finding in edited:
            assert not set(finding.causes) & COSMETIC


def test_explain_cli_shows_aligned_tokens_and_strategy_outcome(dumps):
    path = dumps["qwen3"]
    session = _sessions_by_behaviour(path)["claude-code"][0]
    filled = next(f for f in explain(path, session).findings if f.cause == "schema_default")
    args = ["explain", str(path), "--session", session, "--turn", str(filled.turn_index), "--strategy", "tree"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Tokens around the first divergence" in result.output
    assert "schema default filled in" in result.output and "replace_all" in result.output
    assert "tree: turn" in result.output


def test_explain_json_and_unknown_session(dumps):
    path = dumps["qwen3"]
    session = _sessions_by_behaviour(path)["json-reserialize"][0]
    result = CliRunner().invoke(app, ["explain", str(path), "--session", session, "--json"])
    data = json.loads(result.output)
    assert data["focus"]["cause"] == "key_order_or_spacing"
    assert data["window"]["served"] != data["window"]["rendered"]
    missing = CliRunner().invoke(app, ["explain", str(path), "--session", "nope"])
    assert missing.exit_code == 2 and "no session 'nope'" in missing.output
