"""The registered `chains` strategy on recorded sessions: samples, provenance, events, counters.

Toy sessions use tests/chains_toy.py; the last tests replay sessions through the real Qwen3
tokenizer and template (trace_tools.render.renderer.Renderer.from_spec("qwen3")).
"""

from __future__ import annotations

import dataclasses

import pytest

from chains_toy import ToyRenderer, assistant, call, gen, system, tool_result, user
from trace_tools.data import Session, Turn
from trace_tools.errors import InvalidOption
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.chains import ChainsStrategy
from trace_tools.strategies.registry import get_strategy

TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]


def turn(
    index: int,
    messages: list[dict],
    text: str,
    *,
    calls=None,
    tools=TOOLS,
    logprobs=True,
    with_response=True,
    reward=None,
) -> Turn:
    ids = gen(text)
    return Turn(
        "s",
        index,
        messages,
        ids,
        tools=tools,
        output_logprobs=[-0.25 - index] * len(ids) if logprobs else None,
        response=assistant(text, calls) if with_response else None,
        reward=reward,
    )


def replay(turns: list[Turn], renderer=None, **params):
    ctx = ReplayContext(renderer=renderer or ToyRenderer(), params=params)
    return get_strategy("chains")(ctx).replay(Session("s", turns))


def trained_by_turn(result) -> dict[int, list[int]]:
    """Each turn's trained token ids, in order, across all samples."""
    out: dict[int, list[int]] = {}
    for sample in result.samples:
        offset = len(sample.token_ids) - sample.response_length
        for position, mask in enumerate(sample.loss_mask):
            if mask:
                out.setdefault(sample.source_turn[offset + position], []).append(sample.token_ids[offset + position])
    return out


def linear_turns() -> list[Turn]:
    first = [system("agent"), user("count files")]
    ls_call = [call("c1", "Bash", {"command": "ls"})]
    second = [*first, assistant("", ls_call), tool_result("c1", "a b c")]
    return [turn(0, first, "", calls=ls_call), turn(1, second, "three files", reward=1.0)]


def test_registered_as_counterfactual_strategy():
    assert get_strategy("chains") is ChainsStrategy
    assert ChainsStrategy.counterfactual is True


def test_linear_session_gives_one_sample_training_every_generated_token():
    turns = linear_turns()
    result = replay(turns)
    [sample] = result.samples
    assert trained_by_turn(result) == {t.turn_index: t.output_ids for t in turns}
    offset = len(sample.token_ids) - sample.response_length
    for position, mask in enumerate(sample.loss_mask):
        source = sample.source_turn[offset + position]
        expected = turns[source].output_logprobs[0] if mask else 0.0
        assert sample.logprobs[position] == expected
    assert sample.source_turn[:offset] == [-1] * offset
    assert sample.reward == 1.0
    assert result.prompt_events == {0: "clean", 1: "clean"} and result.turn_events == {}
    assert (result.counters["chains_created"], result.counters["chain_forks"]) == (1, 0)


def test_subagent_session_gives_two_samples_main_last():
    main = [system("main"), user("fix it")]
    turns = [
        turn(0, main, "delegating"),
        turn(1, [system("helper"), user("search")], "found"),
        turn(2, [*main, assistant("delegating"), user("helper says: found")], "fixed"),
    ]
    result = replay(turns)
    helper, primary = result.samples
    assert [s.metadata["chain_id"] for s in result.samples] == [2, 1]
    assert set(trained_by_turn(result)) == {0, 1, 2}
    assert {s for s in primary.source_turn if s >= 0} == {0, 2}
    assert result.prompt_events == {0: "clean", 1: "new_chain", 2: "clean"}
    assert (result.counters["chains_created"], result.counters["chain_forks"]) == (2, 1)


def rewrite_turns() -> list[Turn]:
    first = [user("start")]
    second = [user("start"), assistant("one"), user("second")]
    return [turn(0, first, "one"), turn(1, second, "two"), turn(2, [*second, user("nope, redo")], "three")]


def test_rollback_marks_the_abandoned_turn_and_counts_its_tokens():
    result = replay(rewrite_turns())
    assert len(result.samples) == 1
    assert result.turn_events == {1: "rolled_back"}
    assert result.prompt_events[2] == "rolled_back"
    assert (result.counters["rollbacks"], result.counters["rollback_dropped_tokens"]) == (1, len(gen("two")))
    assert set(trained_by_turn(result)) == {0, 2}


@pytest.mark.parametrize("off", [False, "off"])
def test_rollback_parameter_off_forks_instead(off):
    result = replay(rewrite_turns(), rollback=off)
    assert len(result.samples) == 2 and result.turn_events == {}
    assert result.prompt_events[2] == "new_chain" and result.counters["rollbacks"] == 0
    assert set(trained_by_turn(result)) == {0, 1, 2}


def test_invalid_rollback_value_names_the_fix():
    with pytest.raises(InvalidOption, match="invalid rollback .*choose one of.*off"):
        replay(rewrite_turns(), rollback="sometimes")


def test_capacity_parameters_close_the_chain():
    turns = rewrite_turns()[:2]
    budget = len(ToyRenderer().render([user("start")], TOOLS)) + len(gen("one"))
    result = replay(turns, prompt_length=str(budget - 3), response_length="3")
    [sample] = result.samples
    assert sample.metadata["materialization_reason"] == "max_trajectory_length"
    assert result.prompt_events[1] == "capacity_exhausted" and result.counters["capacity_exhausted"] == 1
    assert set(trained_by_turn(result)) == {0}


def test_rejected_and_failed_requests_are_counted_and_the_session_goes_on():
    good = [user("start")]
    turns = [
        turn(0, good, "one"),
        turn(1, [{"content": "a message without a role"}], "x"),
        # two assistants the session never produced: uni-agent's incremental encoder refuses
        turn(2, [*good, assistant("one"), user("a"), assistant("ghost"), user("b")], "y"),
        turn(3, [*good, assistant("one"), user("go on")], "two"),
    ]
    result = replay(turns)
    assert result.turn_events == {1: "rejected", 2: "failed"}
    assert (result.counters["rejected_requests"], result.counters["server_errors"]) == (1, 1)
    assert set(trained_by_turn(result)) == {0, 3} and len(result.samples) == 1


def test_a_recorded_response_with_a_null_role_is_the_assistant():
    """Validation accepts `"role": null` in a response (a missing role); chains crashed on it."""
    turns = [dataclasses.replace(t, response={**t.response, "role": None}) for t in linear_turns()]
    result = replay(turns)
    assert trained_by_turn(result) == {t.turn_index: t.output_ids for t in turns}
    assert result.turn_events == {} and len(result.samples) == 1


def test_missing_response_is_parsed_from_the_output_ids():
    turns = [
        turn(0, [user("p")], "answer", with_response=False),
        turn(1, [user("p"), assistant("answer"), user("q")], "more", with_response=False),
    ]
    result = replay(turns)
    assert len(result.samples) == 1 and set(trained_by_turn(result)) == {0, 1}


def test_a_turn_without_logprobs_fails_when_the_session_records_them():
    turns = [turn(0, [user("p")], "a"), turn(1, [user("p"), assistant("a"), user("q")], "b", logprobs=False)]
    result = replay(turns)
    assert result.turn_events == {1: "failed"} and result.counters["server_errors"] == 1


def test_a_session_without_logprobs_trains_with_zero_logprobs():
    turns = [turn(0, [user("p")], "a", logprobs=False)]
    [sample] = replay(turns, None).samples
    assert sample.logprobs == [0.0] * sample.response_length and sum(sample.loss_mask) == len(gen("a"))


# -- the real Qwen3 renderer ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3():
    from trace_tools.render.renderer import Renderer

    return Renderer.from_spec("qwen3")


def served(renderer, text: str, index: int, messages: list[dict], tools=None) -> Turn:
    """A recorded turn: `text` as the model wrote it (stop token included), response parsed from it."""
    ids = renderer.encode(text + "<|im_end|>")
    response = renderer.parse_response(ids, tools).message
    return Turn(
        "q", index, messages, ids, tools=tools, output_logprobs=[-0.01 * (index + 1)] * len(ids), response=response
    )


def test_qwen3_byte_exact_linear_session_is_one_fully_trained_trajectory(qwen3):
    bash = [
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "description": "run a command",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    opening = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "How many files?"}]
    first = served(
        qwen3,
        '<think>\nList them.\n</think>\n\n<tool_call>\n{"name": "Bash", "arguments": '
        '{"command": "ls | wc -l"}}\n</tool_call>',
        0,
        opening,
        bash,
    )
    echo = {
        **first.response,
        "tool_calls": [{"id": "call_0", "type": "function", **c} for c in first.response["tool_calls"]],
    }
    history = [*opening, echo, {"role": "tool", "tool_call_id": "call_0", "content": "12"}]
    second = served(qwen3, "<think>\nDone.\n</think>\n\nThere are 12 files.", 1, history, bash)
    result = replay([first, second], qwen3)
    [sample] = result.samples
    assert trained_by_turn(result) == {0: first.output_ids, 1: second.output_ids}
    assert sum(sample.loss_mask) == len(first.output_ids) + len(second.output_ids)
    # the chain's first prompt is the full render of the opening request
    assert sample.token_ids[: len(sample.token_ids) - sample.response_length] == qwen3.render(opening, bash)


def test_qwen3_subagent_session_is_two_trajectories(qwen3):
    main = [{"role": "system", "content": "Main agent."}, {"role": "user", "content": "Fix the parser."}]
    sub = [{"role": "system", "content": "Search helper."}, {"role": "user", "content": "Find the parser."}]
    t0 = served(qwen3, "I'll ask the helper.", 0, main)
    t1 = served(qwen3, "It is in parse.py.", 1, sub)
    t2 = served(qwen3, "Fixed parse.py.", 2, [*main, t0.response, {"role": "user", "content": "Helper: parse.py"}])
    result = replay([t0, t1, t2], qwen3)
    assert [s.metadata["chain_id"] for s in result.samples] == [2, 1]
    assert trained_by_turn(result) == {0: t0.output_ids, 1: t1.output_ids, 2: t2.output_ids}
    assert result.counters["chain_forks"] == 1
