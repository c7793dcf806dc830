"""checkpoint-tree on scripted sessions over the toy template (tests/checkpoint_fakes.py).

Served ids are >= SERVED and no render produces them, so every expected sequence below is written
out by hand: the root's full render, then per turn the served ids, the glue and the tail text.
"""

from __future__ import annotations

import copy
import json

import pytest

from checkpoint_fakes import (
    CLOSE,
    CLOSE_ID,
    OPEN,
    SERVED,
    SUB_TOOLS,
    TOOLS,
    Harness,
    ToyTemplate,
    reply,
    system,
    tool,
    user,
)
from trace_tools.errors import InvalidOption, ReplayError
from trace_tools.render.canonical import canonicalize_messages
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.checkpoint_tree import CheckpointTreeStrategy

TOY = ToyTemplate()
GLUE = TOY.encode("\n")  # the closer is CLOSE "\n"; the served ids already end with CLOSE


def replay(harness: Harness, template=None, prompt_source="auto", **params):
    ctx = ReplayContext(template or ToyTemplate(), prompt_source=prompt_source, params=params)
    return CheckpointTreeStrategy(ctx).replay(harness.session())


def tail(*messages: tuple[str, str]) -> list[int]:
    """The toy render of appended (role, content) messages plus the generation prompt."""
    text = "".join(OPEN + role + ":" + body + CLOSE + "\n" for role, body in messages)
    return TOY.encode(text + OPEN + "assistant:")


def served(harness: Harness, index: int) -> list[int]:
    return harness.turns[index].output_ids


def claude_like(message: dict) -> dict:
    """The echo a Claude-Code-like harness sends back: reasoning dropped, fresh call ids, string
    arguments right-stripped per line, Patch's `everywhere` default filled in, compact JSON."""
    echo = {"role": "assistant", "content": message["content"]}
    calls = []
    for n, call in enumerate(message.get("tool_calls") or []):
        args = json.loads(call["function"]["arguments"])
        args = {
            k: "\n".join(line.rstrip() for line in v.split("\n")) if isinstance(v, str) else v for k, v in args.items()
        }
        if call["function"]["name"] == "Patch":
            args.setdefault("everywhere", False)
        compact = json.dumps(args, separators=(",", ":"))
        calls.append(
            {
                "id": f"toolu_{n}{len(args)}",
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": compact},
            }
        )
    if calls:
        echo["tool_calls"] = calls
    return echo


R0 = reply("", ("Shell", {"cmd": "grep -n boil fw/*.c"}), reasoning="Find the boil check first.")
R1 = reply(
    "Tightening the check.",
    ("Patch", {"path": "fw/boil.c", "find": "if (t >= 100)  \n  stop();", "put": "if (t > 100)\n  stop();"}),
    reasoning="It uses >=.",
)
R2 = reply("Done: the kettle now stops above 100 degrees.")
TASK = "The kettle never stops boiling."


def linear_session(echo=None) -> Harness:
    h = Harness(echo=echo)
    history = [system(), user(TASK)]
    for response, result in ((R0, "fw/boil.c:12: if (t >= 100)"), (R1, "patched 1 hunk"), (R2, None)):
        h.call(history, response)
        h.replay(history, response)
        if result is not None:
            history.append(tool(result, call_id="toolu_x"))
    return h


def test_linear_session_with_cosmetic_echoes_is_one_sample_on_served_ids():
    h = linear_session(echo=claude_like)
    result = replay(h)
    assert len(result.samples) == 1
    sample = result.samples[0]
    root_prompt = TOY.render([system(), user(TASK)], TOOLS, True)
    expected = (
        root_prompt
        + served(h, 0)
        + GLUE
        + tail(("tool", "fw/boil.c:12: if (t >= 100)"))
        + served(h, 1)
        + GLUE
        + tail(("tool", "patched 1 hunk"))
        + served(h, 2)
    )
    assert sample.token_ids == expected
    assert sample.response_length == len(expected) - len(root_prompt)
    generated = [t for turn in h.turns for t in turn.output_ids]
    trained = [tok for tok, m in zip(sample.token_ids[len(root_prompt) :], sample.loss_mask) if m]
    assert trained == generated
    recorded = [lp for turn in h.turns for lp in turn.output_logprobs]
    assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask) if m] == recorded
    assert result.prompt_events == {0: "new_root", 1: "restored", 2: "restored"}
    # turn 1 repeats one echo (turn 0's), turn 2 two (turns 0 and 1): counted per turn, like echo-restore
    assert result.counters["restored_echoes"] == 3
    assert result.counters["restored_distinct_echoes"] == 2
    assert result.counters["tree_branches"] == result.counters["resets"] == 0


def test_source_turn_names_every_output_token():
    h = linear_session()
    sample = replay(h).samples[0]
    for turn in h.turns:
        positions = [i for i, s in enumerate(sample.source_turn) if s == turn.turn_index]
        assert [sample.token_ids[i] for i in positions] == turn.output_ids
    assert sum(s >= 0 for s in sample.source_turn) == sum(len(t.output_ids) for t in h.turns)


def test_without_echo_rules_cosmetic_echoes_split_the_session():
    h = linear_session(echo=claude_like)
    strict = replay(h, echo_rules=False)
    assert len(strict.samples) == 3  # every turn's echo misses its checkpoint: a new root each time
    assert strict.counters["unrecognized_echoes"] == 2


def test_retry_is_a_sibling_and_supersedes_the_earlier_leaf():
    h = Harness()
    history = [system(), user(TASK)]
    h.call(history, R0)
    h.replay(history, R0)
    history.append(tool("fw/boil.c:12"))
    first = h.call(history, reply("Patching now.", ("Patch", {"path": "fw/boil.c", "find": "a", "put": "b"})))
    retry = h.call(history, R1)  # the client timed out and sent the same request again
    h.replay(history, R1)
    history.append(tool("patched"))
    h.call(history, R2)
    result = replay(h)
    assert len(result.samples) == 1
    assert result.turn_events == {first: "trimmed"}
    assert result.counters["trimmed_leaves"] == 1 and result.counters["tree_branches"] == 1
    assert result.prompt_events[retry] == "forked"
    sample = result.samples[0]
    assert first not in sample.source_turn
    assert sample.metadata["path_turns"] == [0, retry, 3]
    assert sum(sample.loss_mask) == sum(len(h.turns[i].output_ids) for i in (0, retry, 3))


def test_keep_policy_trains_each_sibling_once():
    h = Harness()
    history = [system(), user(TASK)]
    h.call(history, R0)
    h.replay(history, R0)
    history.append(tool("fw/boil.c:12"))
    h.call(history, reply("One way."))
    h.call(history, reply("Another way."))
    result = replay(h, retries="keep")
    assert len(result.samples) == 2 and result.counters["trimmed_leaves"] == 0
    first, second = result.samples
    assert first.token_ids[: len(second.token_ids) - 5] == second.token_ids[: len(second.token_ids) - 5]
    # turn 0 is owned by the first leaf; the second sees it as context with its provenance
    region = len(second.token_ids) - second.response_length
    turn0 = [i for i, s in enumerate(second.source_turn) if s == 0]
    assert turn0 and all(second.loss_mask[i - region] == 0 for i in turn0)
    assert all(second.logprobs[i - region] == 0.0 for i in turn0)
    assert sum(first.loss_mask) == len(h.turns[0].output_ids) + len(h.turns[1].output_ids)
    assert sum(second.loss_mask) == len(h.turns[2].output_ids)


def test_a_resent_request_whose_first_answer_was_continued_is_a_real_branch():
    h = Harness()
    history = [system(), user(TASK)]
    h.call(history, R0)
    branch_point = copy.deepcopy(history)
    h.replay(history, R0)
    history.append(tool("fw/boil.c:12"))
    h.call(history, R1)
    h.call(branch_point, reply("", ("Shell", {"cmd": "ls fw"})))  # the harness went back to turn 0's request
    result = replay(h)
    assert len(result.samples) == 2 and result.counters["trimmed_leaves"] == 0
    assert result.counters["tree_branches"] == 1
    assert sorted(sum(s.loss_mask) for s in result.samples) == sorted(
        [len(h.turns[0].output_ids) + len(h.turns[1].output_ids), len(h.turns[2].output_ids)]
    )


def test_interleaved_subagents_become_their_own_roots():
    h = Harness()
    main = [system(), user(TASK)]
    task = reply("", ("Shell", {"cmd": "spawn two helpers"}))
    h.call(main, task)
    h.replay(main, task)
    helpers = {name: [system(f"You are helper {name}."), user(f"Look in {name}.")] for name in ("fw", "docs")}
    for step in range(2):
        for name, history in helpers.items():
            response = reply(f"{name} step {step}", ("Shell", {"cmd": f"cat {name}/{step}"}))
            h.call(history, response, tools=SUB_TOOLS)
            h.replay(history, response)
            history.append(tool(f"{name} output {step}"))
    main.append(tool("helpers: fw/boil.c line 12"))
    h.call(main, R2)
    result = replay(h)
    assert len(result.samples) == 3 and result.counters["tree_branches"] == 2
    assert result.counters["new_roots"] == 3 and result.counters["resets"] == 0
    paths = sorted(s.metadata["path_turns"] for s in result.samples)
    assert paths == [[0, 5], [1, 3], [2, 4]]
    for sample in result.samples:
        trained = {
            s
            for s, m in zip(sample.source_turn[len(sample.source_turn) - sample.response_length :], sample.loss_mask)
            if m
        }
        assert trained == set(sample.metadata["path_turns"])


def test_compaction_summary_trains_on_the_old_root_and_continues_on_a_new_one():
    h = linear_session()
    history = [*h.turns[2].messages, copy.deepcopy(R2), user("Summarize the work so far.")]
    summary = reply("Summary: patched fw/boil.c to stop above 100.")
    h.call(history, summary)
    fresh = [system(), user("Continue from this summary: patched fw/boil.c to stop above 100.")]
    h.call(fresh, reply("Nothing left to do."))
    result = replay(h)
    assert len(result.samples) == 2
    assert [s.metadata["path_turns"] for s in result.samples] == [[0, 1, 2, 3], [4]]
    assert result.prompt_events[3] == "clean" and result.prompt_events[4] == "new_root"
    assert all(
        sum(s.loss_mask) == sum(len(h.turns[t].output_ids) for t in s.metadata["path_turns"]) for s in result.samples
    )


def test_history_edit_branches_at_the_deepest_shared_turn_and_renders_stored_spellings():
    h = linear_session(echo=claude_like)
    edited = copy.deepcopy(h.turns[2].messages)
    edited[3]["content"] = "[old tool result cleared]"  # the first tool result, after turn 0's reply
    h.call(edited, reply("Still done."))
    result = replay(h)
    assert len(result.samples) == 2 and result.prompt_events[3] == "forked"
    main, branch = result.samples
    # the branch reuses turn 0's checkpoint, then renders the rest from the stored messages:
    # turn 1's reply in the model's own spelling (reasoning and trailing spaces kept, no filled-in default)
    stored_r1 = "[r]It uses >=.[/r]Tightening the check. >Patch" + json.dumps(
        {"path": "fw/boil.c", "find": "if (t >= 100)  \n  stop();", "put": "if (t > 100)\n  stop();"}
    )
    root_prompt = TOY.render([system(), user(TASK)], TOOLS, True)
    expected = (
        root_prompt
        + served(h, 0)
        + GLUE
        + tail(("tool", "[old tool result cleared]"), ("assistant", stored_r1), ("tool", "patched 1 hunk"))
        + served(h, 3)
    )
    assert branch.token_ids == expected
    assert branch.metadata["path_turns"] == [0, 3]
    assert sum(branch.loss_mask) == len(h.turns[3].output_ids)  # turn 0 trains in the main sample only
    assert sum(main.loss_mask) == sum(len(h.turns[t].output_ids) for t in (0, 1, 2))
    # linear turns: 1 + 2 echoes; the branch: turn 0's echo on its attach path and turn 1's carried one
    assert result.counters["restored_echoes"] == 3 + 2
    assert result.counters["restored_distinct_echoes"] == 2


def test_truncated_turn_is_extended_with_the_full_closer():
    h = Harness()
    history = [system(), user(TASK)]
    cut = reply("", ("Patch", {"path": "fw/boil.c", "find": "x"}))
    h.call(history, cut, finish="length", length=6)
    h.replay(history, cut)
    history.append(user("Your reply was cut off; continue."))
    h.call(history, R1)
    result = replay(h)
    assert len(result.samples) == 1 and result.counters["truncated_extensions"] == 1
    sample = result.samples[0]
    assert served(h, 0)[-1] != CLOSE_ID
    root_prompt = TOY.render([system(), user(TASK)], TOOLS, True)
    assert sample.token_ids == (
        root_prompt
        + served(h, 0)
        + TOY.encode(CLOSE + "\n")
        + tail(("user", "Your reply was cut off; continue."))
        + served(h, 1)
    )
    assert sum(sample.loss_mask) == 6 + len(h.turns[1].output_ids)


def test_history_rewriting_template_is_extended_through_the_anchor_render():
    h = Harness()
    history = [system(), user(TASK)]
    h.call(history, R0)
    h.replay(history, R0)
    history.append(user("Also check the timer."))  # a new query: the template drops turn 0's reasoning now
    h.call(history, R2)
    template = ToyTemplate(rewrite_history=True)
    stored = [
        system(),
        user(TASK),
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": R0["reasoning_content"],
            "tool_calls": [
                {"type": "function", "function": {"name": "Shell", "arguments": {"cmd": "grep -n boil fw/*.c"}}}
            ],
        },
    ]
    before = template.render_text(stored, TOOLS, False)
    assert not template.render_text([*stored, user("Also check the timer.")], TOOLS, True).startswith(before)
    result = replay(h, template)
    assert len(result.samples) == 1 and result.counters["boundary_fallbacks"] == 1
    assert result.prompt_events[1] == "anchored"
    root_prompt = template.render([system(), user(TASK)], TOOLS, True)
    assert result.samples[0].token_ids == (
        root_prompt + served(h, 0) + GLUE + tail(("user", "Also check the timer.")) + served(h, 1)
    )


def test_type_dependent_closer_is_not_guessed():
    h = linear_session()
    template = ToyTemplate(tool_closer="\n\n")  # tool-calling replies close differently from the probe
    result = replay(h, template)
    assert result.counters["close_unresolved"] == 2 and result.counters["resets"] == 2
    assert [result.prompt_events[i] for i in (0, 1, 2)] == ["new_root", "reset", "reset"]
    assert len(result.samples) == 3  # each reset root is a full render: nothing hidden, nothing lost
    assert sum(sum(s.loss_mask) for s in result.samples) == sum(len(t.output_ids) for t in h.turns)
    full_render = template.render(canonicalize_messages(h.turns[1].messages), TOOLS, True)
    assert result.samples[1].token_ids == full_render + served(h, 1)


def test_a_tail_that_would_merge_across_the_boundary_resets():
    h = linear_session()
    result = replay(h, ToyTemplate(leading_newline=True))  # closer "\n" + tail "\n..." encodes as one "\n\n"
    assert result.counters["boundary_unverified"] == 2 and result.counters["resets"] == 2
    assert len(result.samples) == 3


def test_a_template_that_cannot_render_the_stored_path_resets_onto_recorded_prompts():
    h = linear_session()
    template = ToyTemplate(refuse_tool_calls=True)
    for turn in h.turns:
        turn.prompt_ids = [7, len(turn.messages)]  # what the gateway fed, whatever it was
    result = replay(h, template)
    assert result.counters["render_failed"] == 2 and result.counters["resets"] == 2
    assert [s.token_ids[:2] for s in result.samples] == [[7, 2], [7, 4], [7, 6]]
    for turn in h.turns:
        turn.prompt_ids = None
    with pytest.raises(TypeError):  # no recorded prompt to fall back on: the engine quarantines the session
        replay(h, template)


def test_a_genuinely_edited_reply_is_unrecognised_and_branches():
    h = Harness()
    history = [system(), user(TASK)]
    h.call(history, R0)
    history.append(
        {
            "role": "assistant",
            "content": "I will look around.",
            "tool_calls": [{"type": "function", "function": {"name": "Shell", "arguments": '{"cmd": "ls"}'}}],
        }
    )
    history.append(tool("fw docs"))
    h.call(history, R2)
    result = replay(h)
    assert result.counters["unrecognized_echoes"] == 1
    assert len(result.samples) == 2 and result.prompt_events[1] == "new_root"


def test_changed_tools_start_a_new_root():
    h = linear_session()
    h.turns[2].tools = SUB_TOOLS
    result = replay(h)
    assert [s.metadata["path_turns"] for s in result.samples] == [[0, 1], [2]]


def test_twin_generations_attach_the_next_turn_to_the_latest():
    h = Harness()
    history = [system(), user(TASK)]
    h.call(history, R0)
    h.call(history, R0)  # identical twin (same request, same reply)
    h.replay(history, R0)
    history.append(tool("fw/boil.c:12"))
    h.call(history, R2)
    result = replay(h)
    assert [s.metadata["path_turns"] for s in result.samples] == [[1, 2]]
    assert result.turn_events == {0: "trimmed"}


def test_recorded_root_prompt_is_used_when_present():
    h = Harness()
    recorded = [7, 7, 7]
    h.call([system(), user(TASK)], R2, prompt_ids=recorded)
    sample = replay(h).samples[0]
    assert sample.token_ids[:3] == recorded
    rendered = replay(h, prompt_source="rendered")
    assert rendered.samples[0].token_ids[:-5] == TOY.render([system(), user(TASK)], TOOLS, True)


def test_counterfactual_prompts_are_counted_with_their_drift_position():
    h = linear_session()
    h.turns[1].prompt_ids = TOY.render([system(), user(TASK)], TOOLS, True) + [SERVED - 1]
    result = replay(h)
    assert result.counters["counterfactual_prompts"] == 1
    assert result.drift_positions == {1: len(TOY.render([system(), user(TASK)], TOOLS, True))}


def test_options_and_missing_renderer_fail_with_named_fixes():
    with pytest.raises(InvalidOption, match="supersede"):
        replay(linear_session(), retries="drop-all")
    with pytest.raises(ReplayError, match="--tokenizer"):
        CheckpointTreeStrategy(ReplayContext(None)).replay(linear_session().session())
