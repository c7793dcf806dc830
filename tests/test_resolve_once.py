"""A command resolves each name once: the strategy names, and each recording's tokenizer and
template (into a `RenderSpec`), before the first session; the layers below take the resolved
values. Counted on the resolvers themselves during real CLI runs of the bundled sample, which has
16 sessions: a count that grew with the sessions or the layers would show here."""

from __future__ import annotations

import collections
import functools
import importlib

import pytest
from typer.testing import CliRunner

import trace_tools.pipeline as pipeline_module
import trace_tools.render.families as render_families
import trace_tools.render.spec as spec_module
import trace_tools.render.templates as templates
import trace_tools.render.tokenizer as tokenizer_module
import trace_tools.strategies.registry as registry
from trace_tools.cli.main import app
from trace_tools.io.bundled import sample_dir

# `trace_tools.replay` is also the API function, so the module is imported by its full name.
session_module = importlib.import_module("trace_tools.replay.session")
SAMPLE = str(sample_dir() / "qwen3.parquet")


@pytest.fixture
def calls(monkeypatch):
    """Counts of every call of the resolvers, wrapped where the callers look them up."""
    counts: collections.Counter = collections.Counter()

    def count(module, name, label):
        original = getattr(module, name)

        @functools.wraps(original)
        def counted(*args, **kwargs):
            counts[label] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    count(registry, "get_strategy", "strategy checked")
    count(session_module, "get_strategy", "strategy looked up by the replayer")
    for module in (tokenizer_module, spec_module):  # modules that import the resolvers by name
        count(module, "check_tokenizer_name", "tokenizer resolved")
    for module in (templates, spec_module):
        count(module, "resolve_template", "template resolved")
    count(pipeline_module, "check_template", "template probed")
    count(render_families, "detect_family", "family detected")
    return counts


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_a_replay_resolves_each_strategy_tokenizer_and_template_once(calls, tmp_path):
    result = invoke("replay", SAMPLE, "-s", "tree", "-s", "linear", "--workers", "1", "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    assert dict(calls) == {
        "strategy checked": 2,  # each name once, by the preflight's parameter check
        "strategy looked up by the replayer": 2,  # once per replayer, not per session
        "tokenizer resolved": 1,
        "template resolved": 1,
        "template probed": 1,
        "family detected": 1,  # by the spec, which the renderers built from it reuse
    }


@pytest.mark.parametrize("extra", [[], ["--verify"]])
def test_reconstruct_resolves_the_tokenizer_and_template_once(calls, tmp_path, extra):
    result = invoke("reconstruct", SAMPLE, "--out", str(tmp_path / "r"), *extra)
    assert result.exit_code == 0, result.output
    assert calls["tokenizer resolved"] == calls["template resolved"] == 1


def test_explain_resolves_the_strategy_tokenizer_and_template_once(calls):
    result = invoke("explain", SAMPLE, "--session", "sim-qwen3-s7-0003", "--strategy", "tree", "--json")
    assert result.exit_code == 0, result.output
    assert calls["tokenizer resolved"] == calls["template resolved"] == 1
    assert calls["strategy checked"] + calls["strategy looked up by the replayer"] == 1


# The messages (and exit code 2) these options gave before they were resolved in one place.
BAD_OPTIONS = [
    (["-s", "nope"], "unknown strategy 'nope'; choose one of: areal, chains, checkpoint-tree, "),
    (["--tokenizer", "nope"], "unknown tokenizer 'nope'; choose one of: qwen3, qwen3.5, "),
    (["--chat-template", "nope.jinja"], "chat template 'nope.jinja' is neither a known name (qwen3, qwen3.5, "),
    (["--param", "fork_threshold=x"], "invalid fork_threshold 'x'; pass an integer"),
    (["--param", "nope=1"], "unknown strategy parameter 'nope'; choose one of: areal_export, delta, "),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_a_bad_name_is_one_usage_error_before_any_session(calls, tmp_path, options, message):
    result = invoke("replay", SAMPLE, *options, "--workers", "1", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert f"Error: {message}" in " ".join(result.output.split())
    assert not (tmp_path / "r").exists()  # refused before the run directory was made
    assert calls["strategy looked up by the replayer"] == 0  # no session was replayed
