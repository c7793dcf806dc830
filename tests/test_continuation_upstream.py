"""`continuation`: the cumulative-token family's scenarios, in our own words and data.

The three upstream variants (docs/strategies.md#continuation): slime PR #2287 (restore echoed
assistants from the server's copy, refuse a template that rewrites the history), verl's
Continuous Token (append only tool/user/system messages, fix the junction after the served
output) and rLLM's `cumulative_token_mode` (reset to the chat path when the history diverges).
The toy renderer of test_linear_fakes renders every message as OPEN body CLOSE; served ids live
in the 9000s, so a prompt that holds them was continued, never re-rendered.
"""

from __future__ import annotations

import pytest

from test_linear_fakes import A_OPEN, SERVED_BASE, FakeRenderer, assistant, tool_result, user
from trace_tools.data import Session, Turn
from trace_tools.errors import ReplayError, TraceToolsError
from trace_tools.replay.turnrows import trained_by_turn
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.continuation_core import continued_messages
from trace_tools.strategies.registry import get_strategy

TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]


def session_of(steps, sid: str = "cont") -> Session:
    """steps: (request messages, response, output length)."""
    turns, next_id = [], SERVED_BASE
    for index, (messages, response, length) in enumerate(steps):
        output = list(range(next_id, next_id + length))
        next_id += length
        turns.append(Turn(sid, index, messages, output, tools=TOOLS, response=response, output_logprobs=None))
    return Session(sid, turns)


def replay(session: Session, renderer=None, **params):
    strategy = get_strategy("continuation")(ReplayContext(renderer or FakeRenderer(), params=params))
    return strategy.replay(session)


CALL = assistant("", ("Bash", {"cmd": "ls"}))
FIRST = [user("list the files")]
SECOND = [*FIRST, CALL, tool_result("a.py b.py")]
THIRD = [*SECOND, assistant("two files"), user("and now count them")]


def three_turns(second=SECOND, third=THIRD, **kwargs) -> Session:
    return session_of([(FIRST, CALL, 3), (second, assistant("two files"), 2), (third, assistant("2"), 1)], **kwargs)


def fed_prompts(session: Session, renderer=None, **params) -> dict[int, list[int]]:
    """The prompt each turn was fed, read off the one sample of an append-only session."""
    (sample,) = replay(session, renderer, **params).samples
    return {t.turn_index: sample.token_ids[: sample.source_turn.index(t.turn_index)] for t in session.turns}


# -- the common path: continue from the served ids ---------------------------------------------------------


def test_an_append_only_session_is_one_sample_trained_once():
    session = three_turns()
    result = replay(session)
    assert len(result.samples) == 1
    assert dict(trained_by_turn(result)) == {t.turn_index: len(t.output_ids) for t in session.turns}
    assert result.prompt_events == {0: "rendered", 1: "continued", 2: "continued"}
    assert (result.counters["healed_turns"], result.counters["nonlinear"], result.counters["server_errors"]) == (
        2,
        0,
        0,
    )


def test_each_prompt_is_the_previous_prompt_and_output_then_the_rendered_suffix():
    session = three_turns()
    prompts = fed_prompts(session)
    renderer = FakeRenderer()
    for n in (1, 2):
        served = prompts[n - 1] + session.turns[n - 1].output_ids
        request = session.turns[n].messages
        history = request[: len(session.turns[n - 1].messages) + 1]
        suffix = renderer.render(request, TOOLS, True)[len(renderer.render(history, TOOLS, False)) :]
        # a family without junction rules (the toy's) joins the suffix to the served ids as they are
        assert prompts[n] == served + suffix
        assert suffix[-1] == A_OPEN  # the generation prompt is appended once, at the end


# -- the junction: verl's per-family rules, on the real templates -------------------------------------------

BASH = assistant("", ("Bash", {"cmd": "ls"}))


def junction_case(tokenizer: str, template: str, output_text: str):
    """Two turns with a tool call between them; the output ids are the text's encoding."""
    from trace_tools.render.renderer import Renderer

    renderer = Renderer.from_spec(tokenizer, template)
    # the client echoes the call without its reasoning; the served copy (with it) is restored, so
    # the template renders the last assistant the same with or without messages after it
    first, second = [user("list")], [user("list"), BASH, tool_result("a.py")]
    turns = [
        Turn("j", 0, first, renderer.encode(output_text), response={**BASH, "reasoning_content": "look"}),
        Turn("j", 1, second, renderer.encode("done"), response=assistant("done")),
    ]
    result = replay(Session("j", turns), renderer)
    (sample,) = result.samples
    prompt0 = sample.token_ids[: sample.source_turn.index(0)]
    prompt1 = sample.token_ids[: sample.source_turn.index(1)]
    history = [*first, turns[0].response]
    suffix = renderer.render([*history, second[-1]], None, True)[len(renderer.render(history, None, False)) :]
    return renderer, prompt0 + turns[0].output_ids, prompt1, suffix, result


CALL_TEXT = '<tool_call>\n{"name": "Bash", "arguments": {"cmd": "ls"}}\n</tool_call>'


def test_qwen_inserts_the_newline_the_model_never_generates_after_im_end():
    renderer, served, prompt, suffix, result = junction_case("qwen3", "qwen3", CALL_TEXT + "<|im_end|>")
    assert prompt == served + renderer.encode("\n") + suffix
    assert result.counters["junction_fixes"] == 1


def test_a_truncated_qwen_output_is_joined_as_it_is():
    renderer, served, prompt, suffix, result = junction_case("qwen3", "qwen3", CALL_TEXT[:20])
    assert prompt == served + suffix  # verl adds no closer the model did not emit
    assert result.counters["junction_fixes"] == 0


def test_glm_drops_the_stop_token_the_suffix_opens_with():
    tool_call = "<tool_call>Bash\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>"
    renderer, served, prompt, suffix, result = junction_case(
        "qwen3+glm4.5-specials", "glm4.5", tool_call + "<|observation|>"
    )
    assert suffix[0] == renderer.encode("<|observation|>")[0]
    assert prompt == served[:-1] + suffix
    assert result.counters["junction_fixes"] == 1


def test_an_earlier_assistant_is_restored_never_rendered_again():
    # turn 2's request re-serialises the first call (a filled-in default): slime restores an earlier
    # echo from the server's copy without a check, and the prompt still holds the served ids
    echo = assistant("", ("Bash", {"cmd": "ls", "timeout": 120}))
    third = [*FIRST, echo, tool_result("a.py b.py"), assistant("two files"), user("and now count them")]
    session = three_turns(third=third)
    result = replay(session)
    assert result.prompt_events == {0: "rendered", 1: "continued", 2: "continued"}
    assert result.counters["restored_echoes"] == 1
    assert fed_prompts(session)[2] == fed_prompts(three_turns())[2]


# -- slime PR #2287: restore every echo from the server's copy, refuse what is not an append ---------------


def test_slime_restores_an_echo_that_lost_its_reasoning():
    served = {**CALL, "reasoning_content": "look first"}
    second = [*FIRST, CALL, tool_result("a.py b.py")]  # the client dropped the reasoning
    session = session_of([(FIRST, served, 3), (second, assistant("two files"), 2)])
    result = replay(session)
    assert result.prompt_events == {0: "rendered", 1: "continued"}
    assert result.counters["restored_echoes"] == 1


def test_slime_restores_even_a_changed_latest_assistant():
    # slime compares the latest echo with the served response only after restoring it: never a break
    changed = [*FIRST, assistant("", ("Bash", {"cmd": "ls -la"})), tool_result("a.py b.py")]
    session = session_of([(FIRST, CALL, 3), (changed, assistant("two files"), 2)])
    result = replay(session)
    assert result.prompt_events == {0: "rendered", 1: "continued"}
    assert result.counters["restored_echoes"] == 1
    assert fed_prompts(session)[1] == fed_prompts(session_of([(FIRST, CALL, 3), (SECOND, assistant("x"), 2)]))[1]


def test_a_refused_request_keeps_serving_from_before():
    edited = [user("list the python files"), CALL, tool_result("a.py b.py")]  # an earlier user message edited
    session = session_of([(FIRST, CALL, 3), (edited, assistant("two files"), 2), (SECOND, assistant("two"), 1)])
    result = replay(session)  # on_break=raise is the default
    assert result.turn_events[1] == result.prompt_events[1] == "failed"
    assert result.failures == {1: "the history is not an append (history)"}
    assert (result.counters["server_errors"], result.counters["nonlinear_history"]) == (1, 1)
    assert result.counters["breaks_history"] == 1
    # the refused request changed nothing: the client's retry continues from turn 0's served ids
    assert result.prompt_events[2] == "continued"
    assert len(result.samples) == 1 and dict(trained_by_turn(result)) == {0: 3, 2: 1}


def test_after_a_refusal_the_recorded_client_carries_on_with_a_reply_never_served():
    edited = [user("list the python files"), CALL, tool_result("a.py b.py")]
    third = [*edited, assistant("two files"), user("and now count them")]
    session = session_of([(FIRST, CALL, 3), (edited, assistant("two files"), 2), (third, assistant("2"), 1)])
    assert replay(session).failures == {
        1: "the history is not an append (history)",
        2: "the history is not an append (history)",
    }


def test_slime_refuses_a_request_whose_template_rewrites_the_history():
    class RewritingRenderer(FakeRenderer):
        """Drops every assistant body before the last user message, as Qwen3 drops old reasoning."""

        def render_text(self, messages, tools=None, add_generation_prompt=True, **kwargs):
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            kept = [assistant("") if m["role"] == "assistant" and i < last_user else m for i, m in enumerate(messages)]
            return super().render_text(kept, tools, add_generation_prompt, **kwargs)

    result = replay(three_turns(), RewritingRenderer())
    assert result.prompt_events == {0: "rendered", 1: "continued", 2: "failed"}
    assert result.failures == {2: "the history is not an append (template)"}
    assert (result.counters["nonlinear_template"], result.counters["breaks_template"]) == (1, 1)


def test_continued_messages_names_each_break():
    history = [*FIRST, CALL]
    assert continued_messages(history, history)[1] == "history"  # nothing new
    assert continued_messages(history, [user("other"), CALL, tool_result("x")])[1] == "history"
    assert continued_messages(history, [*FIRST, tool_result("x"), tool_result("y")])[1] == "history"
    assert continued_messages(history, [*history, assistant("more")])[1] == "role"
    restored, cause, count = continued_messages(history, [*FIRST, {**CALL, "name": "x"}, tool_result("x")])
    assert (cause, count, restored[1]) == (None, 1, CALL)


# -- verl Continuous Token: only tool, user and system messages may be appended ------------------------------


def test_verl_refuses_an_appended_assistant():
    third = [*SECOND, assistant("two files"), assistant("a second reply"), user("count")]
    result = replay(three_turns(third=third))
    assert result.failures == {2: "the history is not an append (role)"}


def test_changed_tools_break_the_history():
    session = three_turns()
    session.turns[2].tools = [*TOOLS, {"type": "function", "function": {"name": "Read"}}]
    assert replay(session).failures == {2: "the history is not an append (history)"}


# -- rLLM cumulative_token_mode: reset to the chat path when the history diverges ---------------------------


def test_rllm_resets_on_a_compacted_history_and_continues_from_there():
    compacted = [user("summary: two files listed"), user("and now count them")]
    fourth = [*compacted, assistant("2"), user("thanks")]
    session = session_of(
        [
            (FIRST, CALL, 3),
            (SECOND, assistant("two files"), 2),
            (compacted, assistant("2"), 1),
            (fourth, assistant("ok"), 2),
        ]
    )
    result = replay(session, on_break="reset")
    assert result.prompt_events == {0: "rendered", 1: "continued", 2: "reset", 3: "continued"}
    assert (result.counters["resets"], result.counters["breaks_history"], result.counters["server_errors"]) == (1, 1, 0)
    assert len(result.samples) == 2
    # the reset turn starts from its own prompt (rendered here: the dump records none), nothing served before it
    own_prompt = FakeRenderer().render(compacted, TOOLS, True)
    assert result.samples[1].token_ids[: len(own_prompt)] == own_prompt
    assert dict(trained_by_turn(result)) == {t.turn_index: len(t.output_ids) for t in session.turns}


# -- fork: continue from the latest earlier turn the request extends ----------------------------------------


def test_fork_continues_a_retry_from_the_turn_it_extends():
    # turn 2 retries turn 1's request with a different tool result: it extends turn 0, not turn 1
    retry = [*FIRST, CALL, tool_result("a.py b.py c.py")]
    session = session_of([(FIRST, CALL, 3), (SECOND, assistant("two files"), 2), (retry, assistant("three"), 2)])
    result = replay(session, on_break="fork")
    assert result.prompt_events == {0: "rendered", 1: "continued", 2: "forked"}
    assert len(result.samples) == 2
    first, forked = result.samples
    end = len(first.source_turn) - first.source_turn[::-1].index(0)
    served = first.token_ids[:end]  # turn 0's prompt and output
    assert forked.token_ids[: len(served)] == served  # the fork holds turn 0's served ids ...
    assert sum(forked.loss_mask) == 2  # ... as context: only the retry's own output trains
    assert dict(trained_by_turn(result)) == {0: 3, 1: 2, 2: 2}  # every token trained once

    reset = replay(session, on_break="reset")
    assert reset.prompt_events[2] == "reset" and reset.counters["resets"] == 1


# -- options and context ------------------------------------------------------------------------------------


def test_a_bad_on_break_names_the_choices():
    with pytest.raises(TraceToolsError, match="choose one of"):
        replay(three_turns(), on_break="ignore")


def test_needs_a_renderer():
    with pytest.raises(ReplayError, match="--tokenizer"):
        get_strategy("continuation")(ReplayContext(None)).replay(three_turns())
