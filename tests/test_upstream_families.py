"""What the upstream systems do to DeepSeek V3's template: dict arguments, a TypeError, failed requests.

Every system the strategies reproduce hands the template tool-call arguments as dicts; TRL's
`deepseekv3.jinja` joins them to text with `+`, so every request whose history holds a tool call
fails upstream (docs/upstream_families.md). These tests pin which requests fail, with which reason,
per strategy, and that the lenient text form is an explicit, counted, labelled option.
"""

from __future__ import annotations

import json

import pytest
import trl  # noqa: F401 - the TRL wheel ships the templates (docs/model_families.md)

from trace_tools.data import Session, Turn
from trace_tools.render.canonical import canonicalize_messages
from trace_tools.render.upstream import ArgumentFormError, UpstreamRender, upstream_render
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.helpers import failure_reason
from trace_tools.strategies.registry import get_strategy

READ = {"type": "object", "properties": {"file_path": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "Read", "description": "Read a file", "parameters": READ}}]
SYSTEM = {"role": "system", "content": "You are a coding agent."}
QUESTION = {"role": "user", "content": "Why does test_parse fail?"}
REASONS = {
    "session-v1": "this template needs text arguments and miles passes dicts",
    "session-v2": "this template needs text arguments and miles passes dicts",
    "chains": "this template needs text arguments and uni-agent passes dicts",
    "linear": "this template needs text arguments and agentcore passes dicts",
    "linear+restore": "this template needs text arguments and agentcore passes dicts",
    "echo-restore": "this template needs text arguments and slime passes dicts",
}


@pytest.fixture(scope="module")
def deepseek():
    from trace_tools.render.renderer import Renderer

    return Renderer.from_spec("deepseek-v3", "deepseek-v3")


def read_call(path: str, call_id: str) -> tuple[dict, str]:
    """A served Read call (OpenAI wire form, arguments as text) and the text DeepSeek V3 generated."""
    arguments = json.dumps({"file_path": path})
    message = {
        "role": "assistant",
        "content": "",
        "reasoning_content": f"Open {path}.",
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "Read", "arguments": arguments}}],
    }
    text = (
        f"Open {path}.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>Read\n"
        f"```json\n{arguments}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    )
    return message, text


def answer(text: str) -> tuple[dict, str]:
    return {"role": "assistant", "content": text}, f"{text}<｜end▁of▁sentence｜>"


def turn(renderer, index: int, messages: list[dict], served: tuple[dict, str]) -> Turn:
    response, text = served
    ids = renderer.encode(text)
    return Turn(
        "ds",
        index,
        messages,
        ids,
        tools=TOOLS,
        output_logprobs=[-0.5] * len(ids),
        response=response,
        finish_reason="tool_calls" if "tool_calls" in response else "stop",
        prompt_ids=renderer.render(messages, TOOLS),
    )


def append_only_session(renderer) -> Session:
    """A call, its result, an answer, a follow-up question: every request extends the last."""
    call = read_call("src/parse.py", "call_1")
    result = {"role": "tool", "tool_call_id": "call_1", "content": "def parse(s): return s.split(',')"}
    reply = answer("parse() keeps the space after each comma.")
    follow = {"role": "user", "content": "Fix it."}
    first = [SYSTEM, QUESTION]
    second = [*first, call[0], result]
    third = [*second, reply[0], follow]
    return Session(
        "ds",
        [turn(renderer, 0, first, call), turn(renderer, 1, second, reply), turn(renderer, 2, third, answer("Done."))],
    )


def rewritten_echo_session(renderer) -> Session:
    """The harness echoes the first call with other content: no chain's history is a prefix any more."""
    call = read_call("src/parse.py", "call_1")
    echoed = {**call[0], "content": "Let me look."}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "def parse(s): return s.split(',')"}
    first = [SYSTEM, QUESTION]
    return Session(
        "ds", [turn(renderer, 0, first, call), turn(renderer, 1, [*first, echoed, result], answer("The space."))]
    )


def replay(name: str, renderer, session: Session, **params):
    return get_strategy(name)(ReplayContext(renderer, params=params)).replay(session)


def failures(result) -> dict[int, str]:
    return dict(result.failures)


# -- the render ------------------------------------------------------------------------------------
def test_the_upstream_render_fails_where_transformers_raises(deepseek):
    """The view raises exactly where transformers' own apply_chat_template raises on the dict
    arguments upstream passes; the project's renderer keeps reproducing the recorded prompts."""
    view = upstream_render(deepseek, "miles")
    assert isinstance(view, UpstreamRender)
    raised = 0
    for t in append_only_session(deepseek).turns:
        messages = canonicalize_messages(t.messages)  # arguments parsed to dicts, as upstream does
        assert deepseek.render(messages, TOOLS) == t.prompt_ids
        try:
            deepseek.tokenizer.hf.apply_chat_template(
                messages, tools=TOOLS, chat_template=deepseek.chat_template, tokenize=False, add_generation_prompt=True
            )
        except TypeError as exc:
            with pytest.raises(ArgumentFormError) as caught:
                view.render(messages, TOOLS)
            assert str(exc) in str(caught.value) and caught.value.reason == REASONS["session-v1"]
            raised += 1
        else:
            assert view.render(messages, TOOLS) == t.prompt_ids
    assert raised == 2


def test_only_a_template_that_needs_text_gets_the_upstream_view(deepseek):
    from trace_tools.render.renderer import Renderer

    qwen3 = Renderer.from_spec("qwen3")
    assert upstream_render(qwen3, "miles") is qwen3 and upstream_render(None, "miles") is None
    lenient = upstream_render(deepseek, "slime", lenient=True)
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "Read", "arguments": {"file_path": "a.py"}}}],
    }
    messages = [QUESTION, call]
    assert lenient.render(messages, TOOLS) == deepseek.render(messages, TOOLS)
    assert lenient.take_lenient() and not lenient.take_lenient()
    text_call = {
        **call,
        "tool_calls": [{"type": "function", "function": {"name": "Read", "arguments": '{"file_path": "a.py"}'}}],
    }
    strict = upstream_render(deepseek, "slime")
    assert strict.render([QUESTION, text_call], TOOLS) == deepseek.render(messages, TOOLS)


# -- which requests fail, per strategy ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["session-v1", "session-v2", "linear", "linear+restore", "echo-restore"])
def test_every_request_whose_history_holds_a_tool_call_fails(deepseek, name):
    """Turn 0 renders (no call yet); turns 1 and 2 carry the first call in their history: HTTP 500."""
    result = replay(name, deepseek, append_only_session(deepseek))
    assert failures(result) == {1: REASONS[name], 2: REASONS[name]}
    assert result.counters["server_errors"] == 2
    assert all(result.turn_events[i] == result.prompt_events[i] == "failed" for i in (1, 2))
    trained = {
        s
        for sample in result.samples
        for s, m in zip(sample.source_turn[-sample.response_length :], sample.loss_mask)
        if m
    }
    assert trained <= {0}, "a failed request is never trained"


def test_chains_fail_only_where_they_render_history_with_a_call(deepseek):
    """uni-agent renders history only for a new chain: continuations encode the appended tool result
    and question alone, so the append-only session trains every turn; a rewritten echo of the first
    call starts a new chain whose full render holds that call, and fails."""
    clean = replay("chains", deepseek, append_only_session(deepseek))
    assert failures(clean) == {} and len(clean.samples) == 1
    assert sum(clean.samples[0].loss_mask) == sum(len(t.output_ids) for t in append_only_session(deepseek).turns)
    forked = replay("chains", deepseek, rewritten_echo_session(deepseek))
    assert failures(forked) == {1: REASONS["chains"]} and forked.counters["server_errors"] == 1


def test_tree_fails_only_the_prompts_it_renders(deepseek):
    """`tree` replays recorded prompt ids (the recording gateway's); with --prompt-source rendered it
    renders them as slime does and fails the same requests."""
    session = append_only_session(deepseek)
    assert failures(replay("tree", deepseek, session)) == {}
    rendered = get_strategy("tree")(ReplayContext(deepseek, prompt_source="rendered")).replay(session)
    assert failures(rendered) == {1: REASONS["echo-restore"], 2: REASONS["echo-restore"]}


def test_checkpoint_tree_renders_text_arguments_and_trains_everything(deepseek):
    session = append_only_session(deepseek)
    result = replay("checkpoint-tree", deepseek, session)
    assert failures(result) == {} and result.counters["server_errors"] == 0
    assert sum(sum(s.loss_mask) for s in result.samples) == sum(len(t.output_ids) for t in session.turns)


@pytest.mark.parametrize(
    ("name", "needed"),
    [
        # miles renders only the appended messages behind a dummy assistant carrying the last stored
        # call: once turn 1 commits, turn 2 appends after a text answer and needs no text form.
        ("session-v1", 1),
        ("session-v2", 1),
        # agentcore's healer and slime's adapter render the whole history, which holds the call.
        ("linear", 2),
        ("linear+restore", 2),
        ("echo-restore", 2),
        # uni-agent continues the chain: it renders the appended messages only.
        ("chains", 0),
    ],
)
def test_lenient_render_is_todays_text_form_and_is_counted(deepseek, name, needed):
    """lenient_render=true: no request fails, and the requests that needed the text form are counted."""
    session = append_only_session(deepseek)
    strict = replay(name, deepseek, session)
    lenient = replay(name, deepseek, session, lenient_render=True)
    assert failures(lenient) == {} and lenient.counters["server_errors"] == 0
    assert lenient.counters["lenient_renders"] == needed
    assert "lenient_renders" not in strict.counters


def test_failure_reasons_count_one_failure_once():
    assert failure_reason(ValueError("rollback failed: discard_count=3 exceeds 1\nmore")) == (
        "rollback failed: discard_count=N exceeds N"
    )
    assert failure_reason(ArgumentFormError("miles", "TypeError: x")) == REASONS["session-v1"]


# -- what the reports say ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from trace_tools.simulate import simulate

    path = tmp_path_factory.mktemp("ds") / "deepseek-v3.parquet"
    simulate(
        sessions=6,
        seed=3,
        template="deepseek-v3",
        out=str(path),
        max_turns=8,
        behaviours=["byte-exact", "claude-code", "retry"],
    )
    return path


def test_simulated_byte_exact_sessions_fail_exactly_after_the_first_call(simulated, deepseek):
    from trace_tools.io.load import load

    loaded = load(simulated)
    exact = [s for s in loaded.sessions if s.turns[0].metadata.get("behaviours") == ["byte-exact"]]
    assert exact
    for name in ("session-v1", "session-v2", "linear"):
        for session in exact:
            expected = {
                t.turn_index: REASONS[name]
                for t in session.turns
                if any(m.get("tool_calls") for m in t.messages if m.get("role") == "assistant")
            }
            assert failures(replay(name, deepseek, session)) == expected, (name, session.session_id)


def test_every_report_names_the_upstream_failure_and_the_lenient_label(simulated, tmp_path):
    from typer.testing import CliRunner

    from trace_tools.cli.main import app

    runner = CliRunner()
    strict_dir, lenient_dir = tmp_path / "strict", tmp_path / "lenient"
    out = runner.invoke(
        app,
        [
            "replay",
            str(simulated),
            "--out",
            str(strict_dir),
            "--workers",
            "1",
            "-s",
            "session-v1",
            "-s",
            "session-v2",
            "-s",
            "chains",
            "-s",
            "checkpoint-tree",
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads((strict_dir / "summary.json").read_text())
    for name in ("session-v1", "session-v2"):
        block = summary["strategies"][name]["upstream_failures"]
        assert block["by_reason"] == {REASONS[name]: block["failed"]} and 2 * block["failed"] > block["requests"]
        line = f"{name}: {block['failed']} of {block['requests']} requests fail upstream: {REASONS[name]}"
        assert block["headline"] == line
        for text in (
            " ".join(out.output.split()),
            (strict_dir / "report.md").read_text(),
            (strict_dir / "report.html").read_text(),
        ):
            assert line in text
    # A retry starts a new chain from a full render of a history with a call: uni-agent fails it.
    assert REASONS["chains"] in summary["strategies"]["chains"]["upstream_failures"]["by_reason"]
    assert summary["strategies"]["checkpoint-tree"]["upstream_failures"]["failed"] == 0
    assert "lenient_render" not in summary["strategies"]["session-v1"]

    out = runner.invoke(
        app,
        [
            "replay",
            str(simulated),
            "--out",
            str(lenient_dir),
            "--workers",
            "1",
            "-s",
            "session-v1",
            "--param",
            "lenient_render=true",
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads((lenient_dir / "summary.json").read_text())
    block = summary["strategies"]["session-v1"]
    assert block["upstream_failures"]["failed"] == 0 and block["lenient_render"]["requests"] > 0
    label = block["lenient_render"]["label"]
    assert label.startswith("session-v1: lenient render")
    for text in (
        " ".join(out.output.split()),
        (lenient_dir / "report.md").read_text(),
        (lenient_dir / "report.html").read_text(),
    ):
        assert label in text


def test_the_headline_names_the_most_common_reason_only_when_most_requests_fail():
    import pandas as pd

    from trace_tools.report.metrics import upstream_failures

    def turns(*reasons):
        return pd.DataFrame({"failure": list(reasons) + [None] * (10 - len(reasons))})

    few = upstream_failures(turns("a", "a", "b"), "s")
    assert few == {"requests": 10, "failed": 3, "by_reason": {"a": 2, "b": 1}, "headline": None}
    most = upstream_failures(turns("a", "b", "b", "b", "c", "b"), "s")
    assert most["headline"] == "s: 6 of 10 requests fail upstream: b (2 more for other reasons)"
    assert upstream_failures(pd.DataFrame({"strategy": []}), "s")["headline"] is None


def test_a_gate_rule_can_require_that_no_request_fails_upstream(tmp_path):
    from trace_tools.report.gate import evaluate, parse_rules

    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nmetric = "upstream_failures.failed"\nstrategy = "session-v1"\nop = "=="\nvalue = 0\n')
    summary = {"strategies": {"session-v1": {"upstream_failures": {"requests": 10, "failed": 9}}}}
    [result] = evaluate(parse_rules(rules), summary)
    assert not result.passed and result.actual == 9
