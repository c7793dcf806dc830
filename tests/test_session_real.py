"""session-v1 / session-v2 on the real renderers (Qwen3 tokenizer + TRL templates)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import trl  # noqa: F401 - the TRL wheel ships the templates (docs/model_families.md)

from trace_tools.data import Session, Turn
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.registry import get_strategy

PATH_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "Read", "description": "Read a file", "parameters": PATH_SCHEMA}}]
QUESTION = {"role": "user", "content": "Why does test_parse fail?"}


@pytest.fixture(scope="module")
def qwen3():
    from trace_tools.render.renderer import Renderer

    return Renderer.from_spec("qwen3")


@pytest.fixture(scope="module")
def qwen35():
    from trace_tools.render.renderer import Renderer

    return Renderer.from_spec("qwen3.5")


def read_call(path: str, call_id: str) -> tuple[dict, str]:
    """A served Read call: the response message and the text the model generated for it."""
    args = {"path": path}
    message = {
        "role": "assistant",
        "content": "",
        "reasoning_content": f"Open {path}.",
        "tool_calls": [
            {"id": call_id, "index": 0, "type": "function", "function": {"name": "Read", "arguments": json.dumps(args)}}
        ],
    }
    text = (
        f"<think>\nOpen {path}.\n</think>\n\n<tool_call>\n"
        f'{{"name": "Read", "arguments": {json.dumps(args)}}}\n</tool_call><|im_end|>'
    )
    return message, text


def turn(renderer, index: int, messages: list[dict], response: dict, text: str, prompt_ids=None) -> Turn:
    ids = renderer.encode(text)
    return Turn(
        "real",
        index,
        messages,
        ids,
        tools=TOOLS,
        output_logprobs=[-0.1 * (index + 1)] * len(ids),
        response=response,
        finish_reason="stop" if "tool_calls" not in response else "tool_calls",
        prompt_ids=prompt_ids,
    )


def echo(message: dict) -> dict:
    """What a streaming client sends back: the served message without the wire-only `index`."""
    copy = json.loads(json.dumps(message))
    for entry in copy.get("tool_calls") or []:
        entry.pop("index", None)
    return copy


def linear_session(renderer) -> Session:
    a1, text1 = read_call("src/parse.py", "call_1")
    a2, text2 = read_call("tests/test_parse.py", "call_2")
    t1 = {"role": "tool", "tool_call_id": "call_1", "content": "def parse(s):\n    return s.split(',')"}
    t2 = {"role": "tool", "tool_call_id": "call_2", "content": "assert parse('a, b') == ['a', 'b']"}
    a3 = {"role": "assistant", "content": "parse() keeps the space after each comma."}
    first = [QUESTION]
    return Session(
        "real",
        [
            turn(renderer, 0, first, a1, text1, prompt_ids=renderer.render(first, TOOLS)),
            turn(renderer, 1, [QUESTION, echo(a1), t1], a2, text2),
            turn(
                renderer,
                2,
                [QUESTION, echo(a1), t1, echo(a2), t2],
                a3,
                "<think>\nThe space.\n</think>\n\nparse() keeps the space after each comma.<|im_end|>",
            ),
        ],
    )


def replay(name: str, renderer, session: Session):
    return get_strategy(name)(ReplayContext(renderer=renderer)).replay(session)


def trained_by_turn(result) -> Counter:
    return Counter(
        s
        for sample in result.samples
        for s, m in zip(sample.source_turn[-sample.response_length :], sample.loss_mask)
        if m
    )


def test_session_v1_on_qwen3(qwen3):
    session = linear_session(qwen3)
    result = replay("session-v1", qwen3, session)
    assert len(result.samples) == 1 and not result.turn_events
    assert trained_by_turn(result) == {t.turn_index: len(t.output_ids) for t in session.turns}
    sample = result.samples[0]
    text = qwen3.decode(sample.token_ids)
    # miles renders tools through SGLang's Tool model (fields reordered, `strict: false` added, a
    # tool-level `defer_loading: null`), so the first prompt differs from the recorded render of the
    # raw tools right at the first key
    assert '{"description": "Read a file", "name": "Read", "parameters"' in text
    assert '"strict": false}, "defer_loading": null}' in text
    assert result.prompt_events[0] == "rendered"
    assert qwen3.decode(session.turns[0].prompt_ids[: result.drift_positions[0]]).endswith('"function": {"')
    # each later prompt = checkpoint + "\n" + the appended tool message + generation prompt
    first_output_end = text.index("<|im_end|>", text.index("Open src/parse.py")) + len("<|im_end|>")
    assert text[first_output_end:].startswith("\n<|im_start|>user\n<tool_response>\ndef parse(s)")


def test_session_v2_on_qwen3_trims_a_retry(qwen3):
    session = linear_session(qwen3)
    last = session.turns[2]
    other_result = {"role": "tool", "tool_call_id": "call_2", "content": "assert parse('a,b') == ['a', 'b']"}
    retry = Turn(
        "real",
        3,
        last.messages[:-1] + [other_result],
        list(last.output_ids),
        tools=TOOLS,
        output_logprobs=[-0.5] * len(last.output_ids),
        response=last.response,
        finish_reason="stop",
    )
    session.turns.append(retry)
    result = replay("session-v2", qwen3, session)
    assert result.prompt_events[3] == "forked" and result.counters["tree_branches"] == 1
    # the retry is a later sibling of turn 2's node, so turn 2's leaf is trimmed
    assert result.counters["trimmed_leaves"] == 1 and result.turn_events == {2: "trimmed"}
    assert len(result.samples) == 1
    assert trained_by_turn(result) == {t.turn_index: len(t.output_ids) for t in session.turns if t.turn_index != 2}
    sample = result.samples[0]
    region = sample.source_turn[-sample.response_length :]
    assert [lp for lp, s in zip(sample.logprobs, region) if s == 3] == retry.output_logprobs


def test_trl_qwen35_template_fails_the_dummy_base_render(qwen35):
    # TRL's Qwen3.5 think template raises without a user query; miles' fixed template does not.
    # Replay reproduces what the stock template does to miles: every tool-result turn is a 500.
    first = [QUESTION]
    a1 = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "Read", "arguments": '{"path": "a.py"}'}}],
    }
    text1 = (
        "<think>\n\n</think>\n\n<tool_call>\n<function=Read>\n<parameter=path>\na.py\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>"
    )
    t1 = {"role": "tool", "tool_call_id": "c1", "content": "x = 1"}
    answer = {"role": "assistant", "content": "ok"}
    session = Session(
        "real", [turn(qwen35, 0, first, a1, text1), turn(qwen35, 1, [QUESTION, a1, t1], answer, "ok<|im_end|>")]
    )
    for name in ("session-v1", "session-v2"):
        result = replay(name, qwen35, session)
        assert result.turn_events == {1: "failed"} and result.counters["server_errors"] == 1
        assert trained_by_turn(result) == {0: len(session.turns[0].output_ids)}
