"""Same arguments, same dump; the writers agree with the templates; the CLI and its errors."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from trace_tools.errors import TraceToolsError, UnknownName
from trace_tools.io.load import read_dump_meta
from trace_tools.render.canonical import canonicalize_messages
from trace_tools.render.renderer import Renderer
from trace_tools.simulate import BEHAVIOURS, simulate, summarize
from trace_tools.simulate.episode import Call, Step
from trace_tools.simulate.formats import FAMILIES, response_message
from trace_tools.simulate.tools import MAIN_TOOLS, tool_schemas

MIX = ["claude-code+retry", "streaming+subagent+noncanonical-tokenization", "truncation+history-edit"]


def _content(table):
    return table.to_pylist(), {k: v for k, v in (table.schema.metadata or {}).items() if k.startswith(b"trace_tools.")}


def test_same_arguments_give_the_same_rows_and_metadata():
    first = simulate(3, seed=4, template="qwen3.5", behaviours=MIX, max_turns=7)
    second = simulate(3, seed=4, template="qwen3.5", behaviours=MIX, max_turns=7)
    assert _content(first) == _content(second)
    other = simulate(3, seed=5, template="qwen3.5", behaviours=MIX, max_turns=7)
    assert first.column("output_ids").to_pylist() != other.column("output_ids").to_pylist()


def test_every_family_simulates_the_same_episodes():
    """The plan is independent of the template: same tool calls and arguments in the same order,
    different tokens (gpt-oss and Llama 3.1 make one call per turn, so parallel calls come as a run
    of turns)."""
    calls = {}
    for template in FAMILIES:
        table = simulate(2, seed=9, template=template, behaviours=["byte-exact", "compaction"], max_turns=6)
        calls[template] = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for r in table.column("response").to_pylist()
            for c in json.loads(r).get("tool_calls") or []
        ]
    assert calls["qwen3"] and all(sequence == calls["qwen3"] for sequence in calls.values())


def test_dump_metadata_describes_the_recording(tmp_path):
    path = tmp_path / "d.parquet"
    simulate(1, seed=1, template="qwen3.5", behaviours=["byte-exact"], out=str(path), max_turns=3)
    meta = read_dump_meta(path)
    assert (meta.schema_version, meta.tokenizer, meta.history_mode) == ("1", "qwen3.5", "tree")
    assert meta.chat_template == Renderer.from_spec("qwen3.5", "qwen3.5").chat_template
    assert json.loads(meta.extra["simulator"])["recipes"] == ["byte-exact"]


# How the template's render of a reply (as the last message) meets the served prompt + output:
# Qwen writes a newline after its stop token, GLM's stop token opens the next message, DeepSeek V3
# renders neither the reasoning nor the generation prompt's `<think>\n`; the others match exactly.
SERVED_FROM_RENDER = {
    "qwen3": lambda rendered, prompt, text: (rendered, prompt + text + "\n"),
    "qwen3.5": lambda rendered, prompt, text: (rendered, prompt + text + "\n"),
    "glm4.5": lambda rendered, prompt, text: (rendered + "<|observation|>", prompt + text),
    "deepseek-v3": lambda rendered, prompt, text: (
        rendered,
        prompt.removesuffix("<think>\n") + text.split("</think>\n\n")[1],
    ),
    "gpt-oss": lambda rendered, prompt, text: (rendered, prompt + text),
    "llama3.1": lambda rendered, prompt, text: (rendered, prompt + text),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_output_is_what_the_template_renders(family):
    """A hand-made turn with a boolean, an integer, a nested list, trailing spaces and (where the
    family allows) three calls."""
    writer, tools = FAMILIES[family], tool_schemas(MAIN_TOOLS)
    renderer = Renderer.from_spec(writer.tokenizer, writer.template)
    calls = [
        Call(
            "Edit",
            {"file_path": "/r/a.py", "old_string": "x = 1  \n", "new_string": "x = 2\n    ", "replace_all": True},
        ),
        Call("Bash", {"command": "pytest -q", "timeout": 60000}),
        Call("TodoWrite", {"todos": [{"id": "1", "content": "fix", "status": "completed"}]}),
    ]
    step = Step(
        "edit", "Two edits.\n\nThen the tests.", "Applying both.", calls[:1] if writer.one_call_per_turn else calls
    )
    base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    prompt = renderer.render_text(base, tools, True)
    step, text = writer.emitted(step, prompt)
    response = response_message(step, tools, random.Random(0))
    rendered = renderer.render_text(canonicalize_messages([*base, response]), tools, False)
    left, right = SERVED_FROM_RENDER[family](rendered, prompt, text)
    assert left == right


def test_unknown_or_conflicting_behaviours_are_user_errors():
    with pytest.raises(UnknownName, match="behaviour 'echo'"):
        simulate(1, seed=0, behaviours=["echo"])
    with pytest.raises(TraceToolsError, match="cannot share a session"):
        simulate(1, seed=0, behaviours=["reasoning-dropped+reasoning-rekeyed"])
    with pytest.raises(TraceToolsError, match="byte-exact"):
        simulate(1, seed=0, behaviours=["byte-exact+streaming"])
    with pytest.raises(UnknownName, match="template 'llama3'"):
        simulate(1, seed=0, template="llama3")
    with pytest.raises(UnknownName, match="template 'glm4.6'"):
        simulate(1, seed=0, template="glm4.6")
    with pytest.raises(UnknownName, match="recording mode 'full'"):
        simulate(1, seed=0, recording="full")


def test_default_recipes_cover_every_behaviour():
    table = simulate(len(BEHAVIOURS) + 4, seed=2, max_turns=5)
    labels = [row["behaviours"] for row in summarize(table)]
    assert labels[: len(BEHAVIOURS)] == list(BEHAVIOURS)
    assert all("+" in label for label in labels[len(BEHAVIOURS) :])


def test_cli_writes_the_dump_and_reports_it(tmp_path):
    from trace_tools.cli.main import app

    out = tmp_path / "cli.parquet"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--sessions",
            "2",
            "--seed",
            "3",
            "--template",
            "qwen3",
            "--behaviour",
            "retry",
            "--behaviour",
            "byte-exact",
            "--max-turns",
            "4",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["behaviours"] for r in report["recipes"]] == ["retry", "byte-exact"]
    assert report["recipes"][0]["turns"] == report["recipes"][0]["genuine_turns"] + 1
    assert read_dump_meta(out).tokenizer == "qwen3"


def test_logprobs_model_replaces_the_seeded_logprobs():
    import torch  # noqa: F401 - the logprob model (the test extra has it)

    seeded = simulate(1, seed=6, behaviours=["byte-exact"], max_turns=3)
    scored = simulate(1, seed=6, behaviours=["byte-exact"], max_turns=3, logprobs_model="tiny-qwen3")
    assert scored.column("output_ids").to_pylist() == seeded.column("output_ids").to_pylist()
    lengths = [len(x) for x in seeded.column("output_ids").to_pylist()]
    values = scored.column("output_logprobs").to_pylist()
    assert [len(v) for v in values] == lengths and values != seeded.column("output_logprobs").to_pylist()
    assert all(v <= 0 for turn in values for v in turn)
