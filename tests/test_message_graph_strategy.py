"""The `message-graph` strategy: verifiers v1's graph scenarios and prime-rl's train-once rule,
restated over our own small sessions (docs/strategies.md#message-graph).

Prompt ids are written out so that each scenario's expected samples can be read off by hand:
10s are the system/user scaffold, 7 the generation prompt, 20s-50s completions, 90s tool results.
"""

from __future__ import annotations

from trace_tools.data import Session, Turn
from trace_tools.replay.turnrows import check_trained_once
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.message_graph import MessageGraphStrategy
from trace_tools.strategies.message_graph_core import message_key

SYSTEM = {"role": "system", "content": "sys"}
USER = {"role": "user", "content": "go"}


def call(arguments: str, content: str | None = None, reasoning: str | None = None) -> dict:
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": arguments}}],
    }
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def result(text: str) -> dict:
    return {"role": "tool", "content": text, "tool_call_id": "c1"}


def turn(index: int, messages: list[dict], prompt: list[int], output: list[int], reply: dict) -> Turn:
    return Turn("s", index, messages, output, prompt_ids=prompt, response=reply, output_logprobs=[-0.5] * len(output))


def replay(*turns: Turn):
    session = Session("s", list(turns))
    outcome = MessageGraphStrategy(ReplayContext()).replay(session)
    check_trained_once(session, outcome)
    return outcome


def trained(sample) -> list[int]:
    """The ids of a sample that carry loss."""
    response = sample.token_ids[len(sample.token_ids) - sample.response_length :]
    return [t for t, m in zip(response, sample.loss_mask) if m]


def test_an_append_only_session_is_one_sample_training_every_reply():
    first = call('{"path": "."}')
    outcome = replay(
        turn(0, [SYSTEM, USER], [11, 12, 7], [21, 22], first),
        turn(
            1,
            [SYSTEM, USER, first, result("a")],
            [11, 12, 7, 21, 22, 91, 7],
            [31],
            {"role": "assistant", "content": "ok"},
        ),
    )
    [sample] = outcome.samples
    assert sample.token_ids == [11, 12, 7, 21, 22, 91, 7, 31]
    assert trained(sample) == [21, 22, 31]
    assert sample.source_turn == [-1, -1, -1, 0, 0, -1, -1, 1]
    assert outcome.prompt_events == {0: "new_root", 1: "clean"}
    assert outcome.counters["tree_branches"] == 0


def test_equal_messages_hash_alike_none_and_empty_content_and_argument_order():
    # verifiers' hash: None and "" are one content; arguments compare as JSON values
    assert message_key(call('{"b": 2, "a": 1}', None)) == message_key(call('{"a":1,"b":2}', ""))
    assert message_key(call("{}", reasoning="plan A")) != message_key(call("{}", reasoning="plan B"))
    # fields a harness attaches beyond the round-tripping ones do not count
    assert message_key({**USER, "name": "me"}) == message_key(USER)
    # the echo re-serialized its arguments: same node, one sample
    served = call('{"b": 2, "a": 1}')
    outcome = replay(
        turn(0, [SYSTEM, USER], [11, 12, 7], [21], served),
        turn(1, [SYSTEM, USER, call('{"a":1,"b":2}', ""), result("a")], [11, 12, 7, 21, 91, 7], [31], served),
    )
    assert len(outcome.samples) == 1


def test_a_reply_echoed_with_other_reasoning_is_a_new_node_and_a_second_branch():
    served = call("{}", reasoning="plan A")
    outcome = replay(
        turn(0, [USER], [12, 7], [21, 22], served),
        turn(1, [USER, call("{}", reasoning="plan B"), result("a")], [12, 7, 21, 22, 91, 7], [31], served),
    )
    first, second = outcome.samples
    assert trained(first) == [21, 22] and trained(second) == [31]
    assert second.token_ids == [12, 7, 21, 22, 91, 7, 31]  # the echo is context, its ids as fed
    assert outcome.prompt_events[1] == "forked" and outcome.counters["tree_branches"] == 1


def test_a_reply_re_rendered_to_other_ids_forks_at_that_node():
    """Same messages, same hashes, but the earlier reply's ids changed on re-render (a template
    dropping reasoning): the stored node no longer matches, so the turn branches there."""
    reply = {"role": "assistant", "content": "a1"}
    outcome = replay(
        turn(0, [USER], [12, 7], [21, 22], reply),
        turn(1, [USER, reply, {"role": "user", "content": "u2"}], [12, 7, 99, 22, 13, 7], [31], reply),
    )
    assert [s.token_ids for s in outcome.samples] == [[12, 7, 21, 22], [12, 7, 99, 22, 13, 7, 31]]
    assert [trained(s) for s in outcome.samples] == [[21, 22], [31]]


def test_a_node_shared_by_branches_trains_in_its_first_branch_only():
    first = call('{"path": "."}')
    history = [SYSTEM, USER, first, result("a")]
    outcome = replay(
        turn(0, [SYSTEM, USER], [11, 12, 7], [21, 22], first),
        # two requests continue the same served prefix with different tool results (a fan-out)
        turn(1, history, [11, 12, 7, 21, 22, 91, 7], [31], {"role": "assistant", "content": "x"}),
        turn(
            2,
            [SYSTEM, USER, first, result("b")],
            [11, 12, 7, 21, 22, 92, 7],
            [41],
            {"role": "assistant", "content": "y"},
        ),
    )
    one, two = outcome.samples
    assert trained(one) == [21, 22, 31]
    assert trained(two) == [41]  # turn 0's reply rides along as context
    assert two.source_turn[3:5] == [0, 0]


def test_a_prompt_supplied_assistant_is_context_and_a_branch_with_nothing_to_train_is_dropped():
    fabricated = call("{}")
    outcome = replay(
        turn(0, [USER, fabricated, result("r")], [12, 30, 91, 7], [41], {"role": "assistant", "content": "real"}),
        turn(1, [USER], [12, 7], [], {"role": "assistant", "content": ""}),  # an empty reply: no trained token
    )
    [sample] = outcome.samples
    assert trained(sample) == [41] and sample.response_length == 1


def test_a_retry_of_the_same_request_is_a_sibling_branch():
    reply = {"role": "assistant", "content": "a"}
    outcome = replay(turn(0, [USER], [12, 7], [21], reply), turn(1, [USER], [12, 7], [22], reply))
    assert [trained(s) for s in outcome.samples] == [[21], [22]]
    assert outcome.prompt_events == {0: "new_root", 1: "forked"}


def test_a_rewound_request_hangs_under_the_latest_variant_with_its_own_ids():
    """Turn 1 re-renders turn 0's reply: a context variant of it under the same key, holding no ids
    of its own (recorded prompts carry no per-message spans, so new input nodes are empty and the
    turn's unmatched prompt ids ride on its reply). Turn 2 resends turn 0's ids: the empty variant
    matches any ids, so it hangs there, and its sample still holds exactly the ids it was fed."""
    reply = {"role": "assistant", "content": "a1"}
    follow = [USER, reply, {"role": "user", "content": "u2"}]
    outcome = replay(
        turn(0, [USER], [12, 7], [21], reply),
        turn(1, follow, [12, 7, 99, 13, 7], [31], reply),
        turn(2, follow, [12, 7, 21, 13, 7], [41], reply),
    )
    assert [s.token_ids for s in outcome.samples] == [[12, 7, 21], [12, 7, 99, 13, 7, 31], [12, 7, 21, 13, 7, 41]]
    assert [trained(s) for s in outcome.samples] == [[21], [31], [41]]
    assert outcome.prompt_events == {0: "new_root", 1: "forked", 2: "forked"}
