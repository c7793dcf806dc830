"""LinearHealer on its own (agentcore test_linear_healer.py, docs/upstream_restore_linear.md), in our own words and ids.

Every healing test runs on both the text-space delta path and the full path: on the toy
renderer they must agree exactly.
"""

from __future__ import annotations

import pytest

from test_linear_fakes import (
    A_CLOSE,
    A_OPEN,
    SERVED_BASE,
    U_CLOSE,
    U_OPEN,
    FakeRenderer,
    assistant,
    chars,
    tool_result,
    user,
)
from trace_tools.data import Turn
from trace_tools.pipeline.prepared import PreparedTurn
from trace_tools.strategies.linear_core import (
    COUNTER_KEYS,
    LinearHealer,
    NonlinearHistory,
    heal_session,
    linear_delta,
    path_differences,
    trim_overlap,
)

BASH = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]


@pytest.fixture(params=[True, False], ids=["delta", "full"])
def delta(request):
    return request.param


def first_turn(healer, sid="s", question="why", output=(SERVED_BASE + 1, SERVED_BASE + 2), reply="because", tools=None):
    messages = [user(question)]
    fed = healer.heal(sid, messages, tools)
    healer.commit(sid, fed, list(output), messages, assistant(reply), tools)
    return messages, fed


def test_first_turn_is_the_plain_render(delta):
    healer = LinearHealer(FakeRenderer(), delta=delta)
    outcome = healer.heal_turn("s", [user("why")])
    assert outcome.ids == [U_OPEN, *chars("why"), U_CLOSE, A_OPEN]
    assert outcome.event == "rendered" and healer.pop_stats("s")["healed_turns"] == 0


def test_healed_prompt_is_served_prefix_plus_closer_plus_new_tail(delta):
    healer = LinearHealer(FakeRenderer(), delta=delta)
    history, fed1 = first_turn(healer)
    outcome = healer.heal_turn("s", history + [assistant("because"), user("how")])
    served = [SERVED_BASE + 1, SERVED_BASE + 2]
    assert outcome.ids == fed1 + served + [A_CLOSE] + [U_OPEN, *chars("how"), U_CLOSE] + [A_OPEN]
    assert (outcome.event, outcome.path) == ("healed", "delta" if delta else "full")
    stats = healer.pop_stats("s")
    assert stats["healed_turns"] == 1 and stats["nonlinear"] == 0
    assert stats["healed_prefix_tokens"] == len(fed1) + len(served) + 1


def test_closer_already_served_is_not_repeated(delta):
    healer = LinearHealer(FakeRenderer(), delta=delta)
    served = [SERVED_BASE + 7, A_CLOSE]  # the engine emitted the stop token itself
    history, fed1 = first_turn(healer, output=served)
    fed2 = healer.heal("s", history + [assistant("because"), user("how")])
    assert fed2[: len(fed1) + 2] == fed1 + served
    assert fed2[len(fed1) + 2] == U_OPEN  # nothing between the served stop token and the next message
    assert fed2.count(A_CLOSE) == 1


def test_three_turns_heal_twice(delta):
    healer = LinearHealer(FakeRenderer(), delta=delta)
    history, fed, replies = [], [], ["first reply", "second reply", "third reply"]
    for turn, question in enumerate(["one", "two", "three"]):
        history = history + ([assistant(replies[turn - 1])] if turn else []) + [user(question)]
        output = [SERVED_BASE + 10 * turn, SERVED_BASE + 10 * turn + 1]
        new_fed = healer.heal("s", history)
        if turn:
            previous = fed + [SERVED_BASE + 10 * (turn - 1), SERVED_BASE + 10 * (turn - 1) + 1]
            assert new_fed[: len(previous)] == previous  # every served id is fed again verbatim
        fed = new_fed
        healer.commit("s", fed, output, history, assistant(replies[turn]))
    stats = healer.pop_stats("s")
    assert (stats["healed_turns"], stats["nonlinear"]) == (2, 0)


def test_echo_that_differs_from_the_stored_reply_is_nonlinear(delta):
    healer = LinearHealer(FakeRenderer(), delta=delta)
    history, _ = first_turn(healer, reply="because")
    assert healer.heal_turn("s", history + [assistant("because!"), user("how")]).event == "reset"


def test_reordered_tool_call_arguments_stay_healed(delta):
    renderer = FakeRenderer(sort_args=False)  # an order-sensitive template
    healer = LinearHealer(renderer, delta=delta)
    generated = assistant("", ("Bash", {"command": "ls", "timeout": 5}))
    echoed = assistant("", ("Bash", {"timeout": 5, "command": "ls"}))  # dict-equal, renders differently
    assert renderer.render([echoed]) != renderer.render([generated])
    messages = [user("list files")]
    fed1 = healer.heal("s", messages, BASH)
    served = [SERVED_BASE + 1, SERVED_BASE + 2, SERVED_BASE + 3]
    healer.commit("s", fed1, served, messages, generated, BASH)
    fed2 = healer.heal("s", messages + [echoed, tool_result("a.txt")], BASH)
    assert fed2[: len(fed1) + len(served)] == fed1 + served
    assert healer.pop_stats("s") == {
        **dict.fromkeys(COUNTER_KEYS, 0),
        "healed_turns": 1,
        "healed_prefix_tokens": len(fed1) + len(served) + 1,
    }


def test_tools_change_is_nonlinear(delta):
    healer = LinearHealer(FakeRenderer(), delta=delta)
    history, _ = first_turn(healer, tools=BASH)
    other = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}]
    healer.heal("s", history + [assistant("because"), user("how")], other)
    stats = healer.pop_stats("s")
    assert (stats["nonlinear"], stats["healed_turns"], stats["resets"]) == (1, 0, 1)


def test_empty_tools_equal_no_tools():
    state_healer = LinearHealer(FakeRenderer())
    history, _ = first_turn(state_healer, tools=[])
    assert linear_delta(state_healer._state["s"], history + [assistant("because")], None) == []


@pytest.mark.parametrize("probe_target", ["text", "tool_call"])
def test_close_probe_isolates_the_closer(probe_target):
    renderer = FakeRenderer()
    last = assistant("done") if probe_target == "text" else assistant("", ("Bash", {"command": "pwd"}))
    prev = [user("go"), last]
    r_prev = renderer.render(prev, BASH, False)
    assert LinearHealer(renderer).assistant_close(prev, BASH, r_prev) == [A_CLOSE]


def test_close_probe_refuses_a_closer_the_history_does_not_end_with():
    class ToolCallCloser(FakeRenderer):
        # tool-call assistants close with a different token than text ones
        def render_text(self, messages, tools=None, add_generation_prompt=True, **kwargs):
            text = super().render_text(messages, tools, add_generation_prompt, **kwargs)
            return text.replace("}" + chr(0xE000 + A_CLOSE), "}" + chr(0xE000 + 99))

    renderer = ToolCallCloser()
    prev = [user("go"), assistant("", ("Bash", {"command": "pwd"}))]
    assert LinearHealer(renderer).assistant_close(prev, None, renderer.render(prev, None, False)) is None


@pytest.mark.parametrize("edit", ["user", "assistant"])
def test_reset_feeds_the_client_render_and_reanchors(delta, edit):
    renderer = FakeRenderer()
    healer = LinearHealer(renderer, delta=delta)
    history, _ = first_turn(healer)
    edited = [user("why not")] if edit == "user" else history
    reply = assistant("because") if edit == "user" else assistant("something else")
    messages = edited + [reply, user("how")]
    outcome = healer.heal_turn("s", messages)
    assert outcome.ids == renderer.render(messages) and outcome.event == "reset"
    healer.commit("s", outcome.ids, [SERVED_BASE + 5], messages, assistant("fine"))
    again = healer.heal_turn("s", messages + [assistant("fine"), user("next")])
    assert again.event == "healed" and again.ids[: len(outcome.ids) + 1] == outcome.ids + [SERVED_BASE + 5]
    assert {k: v for k, v in healer.pop_stats("s").items() if v} == {
        "nonlinear": 1,
        "nonlinear_history": 1,
        "resets": 1,
        "healed_turns": 1,
        "healed_prefix_tokens": len(outcome.ids) + 2,
    }


def test_error_mode_raises_runtime_error_naming_append_only():
    healer = LinearHealer(FakeRenderer(), on_nonlinear="error")
    first_turn(healer)
    with pytest.raises(RuntimeError, match="append-only") as info:
        healer.heal("s", [user("a different question")])
    assert isinstance(info.value, NonlinearHistory)


def test_passthrough_stops_healing_even_when_linear_again():
    renderer = FakeRenderer()
    healer = LinearHealer(renderer, on_nonlinear="passthrough")
    first_turn(healer)
    jumped = [user("restart"), assistant("ok"), user("go on")]
    assert healer.heal_turn("s", jumped).event == "passthrough"
    healer.commit("s", renderer.render(jumped), [SERVED_BASE], jumped, assistant("went"))
    linear_again = jumped + [assistant("went"), user("more")]
    outcome = healer.heal_turn("s", linear_again)
    assert outcome.ids == renderer.render(linear_again) and outcome.event == "rendered"
    assert healer.pop_stats("s")["nonlinear"] == 1


def test_bad_on_nonlinear_is_rejected():
    with pytest.raises(ValueError, match="choose one of: reset, error, passthrough"):
        LinearHealer(FakeRenderer(), on_nonlinear="ignore")


def test_pop_stats_is_per_session_and_cumulative_counters_stay():
    healer = LinearHealer(FakeRenderer())
    for sid in ("a", "b"):
        history, _ = first_turn(healer, sid=sid)
        healer.heal(sid, history + [assistant("because"), user("then?")])
    healer.heal("b", [user("edited")])  # b goes nonlinear
    stats_a = healer.pop_stats("a")
    assert list(stats_a) == list(COUNTER_KEYS)
    assert (stats_a["healed_turns"], stats_a["nonlinear"]) == (1, 0)
    assert healer.pop_stats("b")["nonlinear"] == 1
    assert healer.pop_stats("a") == dict.fromkeys(COUNTER_KEYS, 0)
    assert (healer.counters["healed_turns"], healer.counters["nonlinear"]) == (2, 1)


def test_drop_clears_state_and_stats():
    healer = LinearHealer(FakeRenderer(), on_nonlinear="passthrough")
    history, _ = first_turn(healer)
    healer.heal("s", [user("edited")])
    healer.drop("s")
    assert healer.pop_stats("s") == dict.fromkeys(COUNTER_KEYS, 0)
    assert healer.heal_turn("s", history).event == "rendered"  # no longer in passthrough or anchored


def test_shorter_retry_without_the_last_assistant_is_nonlinear():
    healer = LinearHealer(FakeRenderer())
    history, _ = first_turn(healer)
    assert healer.heal_turn("s", history).event == "reset"


@pytest.mark.parametrize(
    "served, close, expected",
    [
        ([1, 2, 3], [3, 4], [4]),
        ([1, 2, 3], [2, 3, 4], [4]),
        ([1, 2, 3], [5, 6], [5, 6]),
        ([], [5], [5]),
        ([7], [], []),
    ],
)
def test_trim_overlap(served, close, expected):
    assert trim_overlap(served, close) == expected


def test_delta_falls_back_silently_when_text_is_not_prefix_consistent():
    class ForgetfulTemplate(FakeRenderer):
        # drops every assistant body but the last one, as Qwen3 drops old reasoning
        def render_text(self, messages, tools=None, add_generation_prompt=True, **kwargs):
            kept = [
                m if m["role"] != "assistant" or i == len(messages) - 1 else {"role": "assistant", "content": ""}
                for i, m in enumerate(messages)
            ]
            return super().render_text(kept, tools, add_generation_prompt, **kwargs)

    healer = LinearHealer(ForgetfulTemplate())
    history, _ = first_turn(healer)
    outcome = healer.heal_turn("s", history + [assistant("because"), user("how")])
    assert outcome.event == "reset"  # the full path saw the same inconsistency
    assert healer.pop_stats("s")["close_unresolved"] == 0 and healer.paths == {}


class TildeTemplate(FakeRenderer):
    """The closer ends with "~" and the user opener starts with "~"; with merges=("~~",) the
    tokenizer joins them across the message boundary, like Qwen merging "\n" + "\n"."""

    def render_text(self, messages, tools=None, add_generation_prompt=True, **kwargs):
        text = super().render_text(messages, tools, add_generation_prompt, **kwargs)
        return text.replace(chr(0xE000 + A_CLOSE), chr(0xE000 + A_CLOSE) + "~").replace(
            chr(0xE000 + U_OPEN), "~" + chr(0xE000 + U_OPEN)
        )


def test_tokenizer_boundary_makes_the_paths_differ():
    # A full render is then not token-prefix-consistent (the full path resets) while the delta
    # path, which encodes the tail alone, heals. Such turns are counted and explained (docs/upstream_restore_linear.md#deviations-and-choices).
    turns = [
        PreparedTurn(Turn("s", 0, [], [SERVED_BASE]), [user("a")], None, assistant("b"), [], "rendered"),
        PreparedTurn(
            Turn("s", 1, [], [SERVED_BASE + 1]),
            [user("a"), assistant("b"), user("c")],
            None,
            assistant("d"),
            [],
            "rendered",
        ),
    ]
    renderer = TildeTemplate(merges=("~~",))
    delta = heal_session(LinearHealer(renderer, delta=True), "s", turns)
    full = heal_session(LinearHealer(renderer, delta=False), "s", turns)
    assert [(o.event, f.event) for o, f in zip(delta, full)] == [("rendered", "rendered"), ("healed", "reset")]
    tilde = renderer.encode("~")
    # two separate "~" ids where a full render has the merged one
    assert delta[1].ids[-7:] == [A_CLOSE, *tilde, *tilde, U_OPEN, *chars("c"), U_CLOSE, A_OPEN]
    assert renderer.encode("~~") != tilde + tilde
    (difference,) = path_differences("s", turns, delta, full)
    assert (difference.turn_index, difference.delta_event, difference.full_event) == (1, "healed", "reset")
    assert "tokenizer boundary" in difference.cause
    assert delta[1].ids[: difference.position] == full[1].ids[: difference.position]


def test_paths_agree_on_the_toy_renderer_without_merges():
    turns = [
        PreparedTurn(Turn("s", 0, [], [SERVED_BASE]), [user("a")], None, assistant("b"), [], "rendered"),
        PreparedTurn(
            Turn("s", 1, [], [SERVED_BASE + 1]),
            [user("a"), assistant("b"), user("c")],
            None,
            assistant("d"),
            [],
            "rendered",
        ),
    ]
    delta = heal_session(LinearHealer(TildeTemplate(), delta=True), "s", turns)
    full = heal_session(LinearHealer(TildeTemplate(), delta=False), "s", turns)
    assert path_differences("s", turns, delta, full) == [] and delta[1].event == "healed"
