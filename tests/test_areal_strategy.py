"""The `areal` strategy: AReaL's InteractionCache scenarios (its tests/experimental/openai/test_cache.py
at 3938b3f4), restated in our words over our own sessions (docs/strategies.md#areal).

A character tokenizer (one id per character, `ord`) makes every prompt AReaL would feed readable:
`text(ids)` gives it back.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Sequence

import pytest

from trace_tools.data import Session, Turn
from trace_tools.replay.turnrows import check_trained_once
from trace_tools.strategies.areal import Interaction, chatml, find_parent
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.registry import get_strategy


class CharRenderer:
    """Only `encode` is used: recorded prompt ids make every other render unnecessary."""

    vocab_size = 0x110000

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(map(chr, ids))


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def reply(text: str) -> dict:
    return {"role": "assistant", "content": text}


def turn(index: int, messages: list[dict], answer: str, second: int | None = None) -> Turn:
    """A call answered with `answer` (its ids: the characters), started at `second`."""
    started = datetime.fromtimestamp(second if second is not None else index, tz=timezone.utc)
    ids = [ord(c) for c in answer]
    return Turn("s", index, messages, ids, prompt_ids=[1, 2], response=reply(answer), started_at=started)


def replay(*turns: Turn, export: str = "concat"):
    session = Session("s", list(turns))
    strategy = get_strategy("areal")(ReplayContext(renderer=CharRenderer(), params={"areal_export": export}))
    outcome = strategy.replay(session)
    check_trained_once(session, outcome)
    return outcome


def trained_text(sample) -> str:
    response = sample.token_ids[len(sample.token_ids) - sample.response_length :]
    return "".join(chr(t) for t, m in zip(response, sample.loss_mask) if m)


def calls(*message_lists: list[dict], replies: Sequence[str]) -> list[Interaction]:
    cache: list[Interaction] = []
    for n, (messages, text) in enumerate(zip(message_lists, replies)):
        call = Interaction(n, messages, created=n, output_text=text)
        call.parent = find_parent(cache, messages)
        cache.append(call)
    return cache


def test_the_longest_strict_prefix_with_the_text_reply_is_the_parent():
    """Upstream's tree: A->B, then [A,B,C]->D under it, a second answer E to A alone (a root),
    and [A,B,C,D,F] under the second call."""
    a, b, c, d, f = user("A"), reply("B"), user("C"), reply("D"), user("F")
    one, two, three, four = calls([a], [a, b, c], [a], [a, b, c, d, f], replies="BDEG")
    assert (one.parent, two.parent, three.parent, four.parent) == (None, one, None, two)


def test_a_reply_echoed_otherwise_finds_no_parent():
    # the harness echoes the reply without its reasoning text: no parent, both are leaves
    first, second = calls([user("A")], [user("A"), reply("B"), user("C")], replies=["think: 1, answer: B", "D"])
    assert second.parent is None
    # any other key on the echoed reply (its tool calls, even None) breaks the dict equality too
    echoed = {**reply("B"), "tool_calls": None}
    assert calls([user("A")], [user("A"), echoed, user("C")], replies="BD")[1].parent is None


def test_a_prefix_of_equal_length_is_not_strict():
    # messages equal to the earlier call's messages + reply: not a strict prefix, no parent
    # (upstream's test_multiple_exports_after_build expects one; its code at 3938b3f4 finds none)
    assert calls([user("A")], [user("A"), reply("B")], replies="BC")[1].parent is None


def test_equal_lengths_prefer_the_later_second_then_the_first_cached():
    a = user("A")
    cache = [Interaction(0, [a], created=5, output_text="B"), Interaction(1, [a], created=9, output_text="B")]
    assert find_parent(cache, [a, reply("B"), user("C")]) is cache[1]
    cache[1].created = 5
    assert find_parent(cache, [a, reply("B"), user("C")]) is cache[0]


def test_concat_feeds_the_parents_ids_then_its_own_chatml_text_and_exports_the_leaves():
    a, b, c = user("A"), reply("B"), user("C")
    outcome = replay(turn(0, [{"role": "system", "content": None}, a], "B"), turn(1, [a, b, c], "D"), turn(2, [a], "B"))
    # turn 1's messages do not start with turn 0's (the system message), so every call is a root
    assert len(outcome.samples) == 3
    assert "<|im_start|>system\nNone<|im_end|>" in "".join(map(chr, outcome.samples[0].token_ids))
    outcome = replay(turn(0, [a], "B"), turn(1, [a, b, c], "D"))
    [sample] = outcome.samples
    expected = chatml([a]) + "B" + chatml([c]) + "D"
    assert "".join(map(chr, sample.token_ids)) == expected
    assert trained_text(sample) == "BD"
    assert sample.response_length == len(expected) - len(chatml([a]))
    assert outcome.prompt_events == {0: "new_root", 1: "clean"}


def test_an_ancestor_of_two_leaves_trains_in_the_first_leaf_only():
    """Upstream copies the parent's loss mask into every child; replay trains it once."""
    a, b = user("A"), reply("B")
    outcome = replay(turn(0, [a], "B"), turn(1, [a, b, user("C")], "D"), turn(2, [a, b, user("E")], "F"))
    assert [trained_text(s) for s in outcome.samples] == ["BD", "F"]
    assert outcome.counters["tree_branches"] == 1


def test_individual_exports_every_call_with_its_recorded_prompt():
    a = user("A")
    outcome = replay(turn(0, [a], "B"), turn(1, [a, reply("B"), user("C")], "D"), export="individual")
    assert [s.token_ids for s in outcome.samples] == [[1, 2, ord("B")], [1, 2, ord("D")]]
    assert [trained_text(s) for s in outcome.samples] == ["B", "D"]


def test_a_message_without_content_fails_its_call_and_every_later_one():
    outcome = replay(turn(0, [user("A")], "B"), turn(1, [{"role": "user"}], "C"), turn(2, [user("A")], "D"))
    assert outcome.turn_events == {1: "failed", 2: "failed"}
    assert "content" in outcome.failures[1] and "no reply" in outcome.failures[2]
    assert [trained_text(s) for s in outcome.samples] == ["B"]


def test_export_is_a_declared_choice():
    from trace_tools.errors import InvalidOption
    from trace_tools.strategies.registry import check_params

    with pytest.raises(InvalidOption, match="individual"):
        check_params(["areal"], {"areal_export": "tree"})
