"""The uni-agent acceptance matrix (docs/upstream_chains.md#case--test-map-teststest_chains_corepy-unless-noted), replayed on a toy template.

Each test names its matrix case as `test_cNN_...`. Scenarios, strings and token ids are our own
(tests/chains_toy.py); the outcomes asserted — contexts, masks, chain choice, order,
counters — are the upstream ones. Cases the trace schema cannot express are listed, with the
reason, in docs/upstream_chains.md.
"""

from __future__ import annotations

import re

import pytest

from chains_toy import ToyRenderer, assistant, call, gen, system, tok, tool_result, untok, user
from trace_tools.strategies.chains_core.codec import ChainCodec
from trace_tools.strategies.chains_core.errors import ChainsSetupError, RequestRejected, ServerError
from trace_tools.strategies.chains_core.normalize import message_hash, normalize_request, prefix_hashes
from trace_tools.strategies.chains_core.session import MAX_TRAJECTORY_LENGTH, ChainSession
from trace_tools.strategies.chains_core.state import CONTEXT, Chain, TokenBuffer, is_exact_prefix

GP = "<|s|>assistant\n"
TOOLS_A = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
TOOLS_B = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def new_session(rollback: bool = False, renderer: ToyRenderer | None = None, **capacity) -> ChainSession:
    return ChainSession(ChainCodec(renderer or ToyRenderer()), enable_last_assistant_rollback=rollback, **capacity)


def reply(
    session: ChainSession,
    messages: list[dict],
    text: str,
    *,
    turn: int = 0,
    tools=None,
    calls=None,
    logprobs=None,
    request_logprobs=None,
):
    """Replay one request whose recorded answer is `text` (then EOS), stored as that assistant."""
    return session.step(
        messages, tools, gen(text), logprobs, assistant(text, calls), turn_index=turn, request_logprobs=request_logprobs
    )


def full(messages: list[dict], tools=None) -> list[int]:
    return ToyRenderer().render(messages, tools, True)


def inc(text: str) -> list[int]:
    """The incremental context the toy template gives after a generated EOS: separator, messages, GP."""
    return tok("\n" + text + GP)


def chain(session: ChainSession, chain_id: int) -> Chain:
    return next(c for c in session.active_chains if c.chain_id == chain_id)


# -- construction (cases 1-3) -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1])
def test_c01_rejects_non_positive_response_length(bad):
    with pytest.raises(ChainsSetupError, match="response_length"):
        new_session(response_length=bad)


@pytest.mark.parametrize("bad", [0, -1])
def test_c02_rejects_non_positive_prompt_length(bad):
    with pytest.raises(ChainsSetupError, match="prompt_length"):
        new_session(prompt_length=bad)


def test_c03_rollback_is_on_by_default():
    session = ChainSession(ChainCodec(ToyRenderer()))
    reply(session, [user("start")], "one")
    reply(session, [user("start"), assistant("one"), user("second")], "two")
    outcome = reply(session, [user("start"), assistant("one"), user("second"), user("instead")], "three")
    assert session.enable_last_assistant_rollback is True
    assert (outcome.rollback, outcome.chain_id, session.rollback_count) == (True, 1, 1)


# -- splits and continuations (cases 4-6) ---------------------------------------------------------


def test_c04_linear_conversation_stays_single_chain():
    session = new_session()
    first = [system("be brief"), user("hello")]
    reply(session, first, "hi", turn=0)
    reply(session, [*first, assistant("hi"), user("bye")], "ciao", turn=1)
    session.set_reward_info({"reward": 0.5, "finished": True})
    [trajectory] = session.finalize()
    context = inc("<|s|>user\nbye<|e|>\n")
    assert trajectory.prompt_ids == full(first)
    assert trajectory.response_ids == gen("hi") + context + gen("ciao")
    assert trajectory.response_mask == [1] * 3 + [0] * len(context) + [1] * 5
    assert trajectory.response_source == [0] * 3 + [CONTEXT] * len(context) + [1] * 5
    assert trajectory.reward_info == {"reward": 0.5, "finished": True}
    # the chain's ids are what a full render of the final history gives (the toy is prefix-stable)
    history = [*first, assistant("hi"), user("bye"), assistant("ciao")]
    assert trajectory.prompt_ids + trajectory.response_ids + tok("\n") == ToyRenderer().render(history, None, False)


def test_c05_subagent_split_returns_to_main_chain():
    session = new_session()
    main = [system("main agent"), user("fix the bug")]
    reply(session, main, "look", turn=0)
    reply(session, [system("sub agent"), user("grep it")], "found", turn=1)
    outcome = reply(session, [*main, assistant("look"), user("found it")], "fixed", turn=2)
    assert (outcome.chain_id, outcome.new_chain) == (1, False)
    sub, primary = session.finalize()
    assert (sub.chain_id, primary.chain_id) == (2, 1)
    assert sub.response_ids == gen("found") and sub.response_mask == [1] * 6
    context = inc("<|s|>user\nfound it<|e|>\n")
    assert primary.response_ids == gen("look") + context + gen("fixed")
    assert primary.response_mask == [1] * 5 + [0] * len(context) + [1] * 6
    assert (session.chains_created, session.chain_forks) == (2, 1)


def test_c06_context_compaction_starts_new_chain():
    session = new_session()
    reply(session, [system("agent"), user("long job")], "step one", turn=0)
    outcome = reply(session, [system("summary: step one done"), user("go on")], "step two", turn=1)
    assert outcome.new_chain and outcome.chain_id == 2
    before, after = session.finalize()
    assert before.response_ids == gen("step one") and before.response_mask == [1] * 9
    assert after.response_ids == gen("step two") and after.response_mask == [1] * 9
    assert after.prompt_ids == full([system("summary: step one done"), user("go on")])


# -- last-assistant rollback (cases 7-14, 16, 17, 19, 20) -------------------------------------------


def test_c07_first_assistant_rewrite_splits_without_rollback():
    session = new_session(rollback=True)
    reply(session, [user("start")], "one")
    rewrite = [user("start"), user("error: that failed")]
    outcome = reply(session, rewrite, "two")
    assert (outcome.new_chain, outcome.rollback, session.rollback_count) == (True, False, 0)
    first, second = session.finalize()
    assert first.response_ids == gen("one")
    assert second.prompt_ids == full(rewrite)


def test_c08_first_assistant_rewrite_with_tool_context_splits():
    session = new_session(rollback=True)
    reply(session, [user("start")], "one", tools=TOOLS_A)
    rewrite = [user("start"), assistant("", [call("c1", "run", {"cmd": "ls"})]), tool_result("c1", "a.txt")]
    outcome = reply(session, rewrite, "two", tools=TOOLS_A)
    assert (outcome.new_chain, outcome.rollback) == (True, False)
    assert session.finalize()[1].prompt_ids == full(rewrite, TOOLS_A)


def two_turn_chain(session: ChainSession, logprobs: bool = False) -> list[dict]:
    """[u:start] -> "one"; [u:start, a:one, u:second] -> "two"; returns the second prompt."""
    lp = (lambda n: [-0.5] * n) if logprobs else (lambda n: None)
    reply(session, [user("start")], "one", turn=0, logprobs=lp(4))
    second = [user("start"), assistant("one"), user("second")]
    reply(session, second, "two", turn=1, logprobs=lp(4))
    return second


def test_c09_later_rollback_removes_only_the_response_side_gp():
    session = new_session(rollback=True)
    second = two_turn_chain(session)
    outcome = reply(session, [*second, user("replacement")], "three", turn=2)
    context = tok("\n<|s|>user\nsecond<|e|>") + inc("<|s|>user\nreplacement<|e|>\n")
    assert outcome.prompt_tokens == len(full([user("start")]) + gen("one") + context)
    assert (outcome.rollback, outcome.dropped_tokens, outcome.rolled_back_turns) == (True, 4, (1,))
    [trajectory] = session.finalize()
    assert trajectory.prompt_ids == full([user("start")])
    assert trajectory.response_ids == gen("one") + context + gen("three")
    assert trajectory.response_mask == [1] * 4 + [0] * len(context) + [1] * 6
    assert (session.rollback_count, session.rollback_dropped_tokens) == (1, 4)


@pytest.mark.parametrize("separator", ["\n", "\n\n"])
def test_c10_rollback_leaves_exactly_one_separator(separator):
    session = new_session(rollback=True, renderer=ToyRenderer(separator=separator))
    second = two_turn_chain(session)
    reply(session, [*second, user("again")], "three", turn=2)
    text = untok(session.finalize()[0].response_ids)
    assert f"second<|e|>{separator}<|s|>user\nagain<|e|>{separator}{GP}three" in text
    assert f"second<|e|>{separator}{separator}" not in text and "second<|e|><|s|>" not in text


def test_c11_rollback_rejects_a_corrupted_generation_prompt():
    session = new_session(rollback=True)
    second = two_turn_chain(session)
    stored = chain(session, 1)
    stored.buffer.response_ids[stored.last_assistant_start.response_ids_len - 1] = tok("X")[0]
    with pytest.raises(ServerError, match="generation prompt"):
        reply(session, [*second, user("replacement")], "three")
    assert session.rollback_count == 0 and len(chain(session, 1).message_history) == 4


def test_c12_edit_before_the_latest_boundary_splits():
    session = new_session(rollback=True)
    two_turn_chain(session)
    edited = [user("start"), assistant("one"), user("SECOND"), user("more")]
    outcome = reply(session, edited, "three")
    assert (outcome.new_chain, outcome.rollback, session.rollback_count) == (True, False, 0)
    assert session.finalize()[1].prompt_ids == full(edited)


def test_c13_ambiguous_deepest_rollback_splits_over_shallower_exact():
    session = new_session(rollback=True)
    asked = [user("p"), assistant("a"), user("q")]
    reply(session, [user("p")], "a")  # chain 1
    reply(session, asked, "b1")  # chain 1 continues, boundary 3
    reply(session, [user("p")], "a")  # chain 2 (a sibling of the first prompt)
    reply(session, asked, "b2")  # chain 2 continues, boundary 3
    reply(session, [user("p")], "a")  # chain 3: exact prefix [p, a] of the next request
    request = [*asked, user("rewrite")]
    outcome = reply(session, request, "c")
    assert (outcome.chain_id, outcome.new_chain, outcome.rollback) == (4, True, False)
    assert session.rollback_count == 0
    assert session.finalize()[-1].prompt_ids == full(request)


def test_c14_unique_deepest_rollback_ignores_shallower_candidate():
    session = new_session(rollback=True)
    asked = [user("p"), assistant("a"), user("q")]
    reply(session, [user("p")], "a", turn=0)  # chain 1
    reply(session, asked, "b", turn=1)  # chain 1, boundary 3
    reply(session, [user("p")], "a", turn=2)  # chain 2
    reply(session, asked, "other", turn=3)  # chain 2 (newest), boundary 3
    deeper = [*asked, assistant("b"), user("r")]
    assert reply(session, deeper, "c", turn=4).chain_id == 1  # chain 1, boundary 5
    untouched = chain(session, 2).buffer.copy()
    outcome = reply(session, [*deeper, user("rewrite")], "d", turn=5)
    assert (outcome.chain_id, outcome.rollback, outcome.rolled_back_turns) == (1, True, (4,))
    assert session.rollback_count == 1 and chain(session, 2).buffer == untouched


def test_c16_deeper_rollback_beats_shorter_exact_sibling():
    session = new_session(rollback=True)
    reply(session, [user("p")], "a")  # chain 1
    reply(session, [user("p")], "a")  # chain 2
    asked = [user("p"), assistant("a"), user("q")]
    assert reply(session, asked, "b").chain_id == 2  # newest exact sibling
    outcome = reply(session, [*asked, user("rewrite")], "c")
    assert (outcome.chain_id, outcome.rollback) == (2, True)  # service 3 beats exact 2
    assert len(chain(session, 1).message_history) == 2


def test_c17_tie_prefers_exact_chain_without_drop():
    session = new_session(rollback=True)
    opening = [system("s"), user("p")]
    reply(session, opening, "a")  # chain 1: history 3
    reply(session, opening, "a")  # chain 2: history 3
    resend = [*opening, assistant("a")]
    assert reply(session, resend, "more").chain_id == 2  # glued, boundary 3
    outcome = reply(session, [*resend, user("q")], "b")
    # chain 2 could roll back to boundary 3; chain 1 extends exactly with the same value 3
    assert (outcome.chain_id, outcome.rollback, session.rollback_count) == (1, False, 0)


def test_c18_empty_history_chain_prefixes_any_request():
    empty = Chain(7, [], None, None, TokenBuffer([]), None, 0)
    assert is_exact_prefix(empty, prefix_hashes([user("anything"), assistant("x")]))
    assert is_exact_prefix(empty, [])


def test_c19_rollback_rejects_misaligned_stored_logprobs():
    session = new_session(rollback=True)
    second = two_turn_chain(session, logprobs=True)
    chain(session, 1).buffer.response_logprobs.pop()
    with pytest.raises(ServerError, match="response_logprobs must be empty or aligned"):
        reply(session, [*second, user("replacement")], "three", logprobs=[-0.1] * 6)


def test_c20_rollback_disabled_splits_rewritten_assistant():
    session = new_session(rollback=False)
    second = two_turn_chain(session)
    outcome = reply(session, [*second, user("replacement")], "three")
    assert (outcome.new_chain, outcome.rollback, session.rollback_count) == (True, False, 0)
    original, fork = session.finalize()
    assert original.response_ids[-4:] == gen("two")
    assert fork.prompt_ids == full([*second, user("replacement")])


# -- siblings, tools, tip hash (cases 21, 22, 26, 27) ----------------------------------------------


def test_c21_repeated_prompt_creates_siblings_and_continues_latest():
    session = new_session()
    for turn in range(3):
        assert reply(session, [user("p")], "same", turn=turn).chain_id == turn + 1
    outcome = reply(session, [user("p"), assistant("same"), user("go")], "next", turn=3)
    assert outcome.chain_id == 3
    trajectories = session.finalize()
    assert [t.chain_id for t in trajectories] == [1, 2, 3]
    assert set(trajectories[-1].response_source) == {2, CONTEXT, 3}
    assert (session.chains_created, session.chain_forks) == (3, 2)


def test_c22_continuation_matching_older_sibling_continues_it():
    session = new_session()
    reply(session, [user("p")], "older")
    reply(session, [user("p")], "newer")
    assert reply(session, [user("p"), assistant("older"), user("go")], "more").chain_id == 1
    newer, older = session.finalize()
    assert (newer.chain_id, older.chain_id) == (2, 1)
    assert older.response_ids[:6] == gen("older") and older.response_ids[-5:] == gen("more")


@pytest.mark.parametrize("first, second", [(TOOLS_A, TOOLS_B), (TOOLS_A + TOOLS_B, TOOLS_B + TOOLS_A), (None, [])])
def test_c26_tool_list_gates_chain_reuse(first, second):
    session = new_session()
    reply(session, [user("p")], "a", tools=first)
    continuation = [user("p"), assistant("a"), user("q")]
    assert reply(session, continuation, "b", tools=second).new_chain
    assert reply(session, [*continuation, assistant("b"), user("r")], "c", tools=second).chain_id == 2


def test_c27_committed_tip_hash_round_trips_through_echo():
    session = new_session()
    reply(session, [user("p")], "a")
    tip = chain(session, 1).message_tip_hash
    assert re.fullmatch("[0-9a-f]{64}", tip)
    assert tip == prefix_hashes(normalize_request([user("p"), assistant("a")], None)[0])[-1]
    assert reply(session, [user("p"), assistant("a"), user("q")], "b").chain_id == 1
    assert chain(session, 1).message_tip_hash not in (tip, None)
    assert chain(session, 1).message_tip_hash == prefix_hashes(chain(session, 1).message_history)[-1]


# -- capacity (cases 30-32, 34-37) -------------------------------------------------------------------

MAIN = [system("main"), user("task")]
FOLLOW_UP = [*MAIN, assistant("plan"), user("result")]
FOLLOW_UP_CONTEXT = inc("<|s|>user\nresult<|e|>\n")


def test_c30_length_exhaustion_closes_selected_chain_and_orders_it_last():
    cap = len(full(MAIN)) + len(gen("plan")) + len(FOLLOW_UP_CONTEXT)
    session = new_session(prompt_length=len(full(MAIN)), response_length=cap - len(full(MAIN)))
    reply(session, MAIN, "plan", turn=0)
    reply(session, [system("helper"), user("look")], "seen", turn=1)
    outcome = reply(session, FOLLOW_UP, "done", turn=2)
    assert (outcome.kind, outcome.chain_id, outcome.completion_tokens) == ("length", 1, 0)
    assert [c.chain_id for c in session.active_chains] == [2]
    helper, closed = session.finalize()
    assert (helper.chain_id, closed.chain_id) == (2, 1)
    assert closed.response_ids == gen("plan")  # the unsent context and the recorded output are not kept
    assert closed.extra_fields == {"materialization_reason": MAX_TRAJECTORY_LENGTH}


def test_c31_exactly_full_chain_closes_on_a_resend():
    cap = len(full(MAIN)) + len(gen("plan"))
    session = new_session(prompt_length=cap - 1, response_length=1)
    assert reply(session, MAIN, "plan").max_tokens == len(gen("plan"))
    outcome = reply(session, [*MAIN, assistant("plan")], "glued")
    assert (outcome.kind, outcome.chain_id, outcome.completion_tokens) == ("length", 1, 0)
    [closed] = session.finalize()
    assert closed.response_ids == gen("plan")


def test_c32_length_closed_chain_orders_before_a_later_fresh_chain():
    cap = len(full(MAIN)) + len(gen("plan")) + len(FOLLOW_UP_CONTEXT)
    session = new_session(prompt_length=10, response_length=cap - 10)
    reply(session, MAIN, "plan")
    assert reply(session, FOLLOW_UP, "done").kind == "length"
    reply(session, [system("other"), user("x")], "y")
    closed, fresh = session.finalize()
    assert (closed.chain_id, fresh.chain_id) == (1, 2)
    assert closed.extra_fields == {"materialization_reason": "max_trajectory_length"}
    assert fresh.extra_fields == {}


def test_c34_response_length_alone_is_not_enforced():
    session = new_session(response_length=2)
    outcome = reply(session, MAIN, "a long answer")
    assert (outcome.kind, outcome.max_tokens, outcome.completion_tokens) == ("committed", None, 14)


def test_c35_capacity_is_total_so_generation_uses_unused_prompt_room():
    session = new_session(prompt_length=200, response_length=5)
    outcome = reply(session, MAIN, "far more than five tokens")
    assert outcome.max_tokens == 205 - len(full(MAIN))
    assert session.finalize()[0].response_ids == gen("far more than five tokens")


def test_c36_prompt_generation_and_context_all_count_toward_capacity():
    cap = len(full(MAIN)) + len(gen("plan")) + len(FOLLOW_UP_CONTEXT) + 1
    session = new_session(prompt_length=len(full(MAIN)), response_length=cap - len(full(MAIN)))
    reply(session, MAIN, "plan", turn=0)
    outcome = reply(session, FOLLOW_UP, "done", turn=1)
    # one token of room left: the engine would stop after it, so replay keeps one recorded token
    # (the stored assistant stays the recorded message, which is what the harness echoes next)
    assert (outcome.kind, outcome.max_tokens, outcome.completion_tokens) == ("committed", 1, 1)
    closing = reply(session, [*FOLLOW_UP, assistant("done"), user("more")], "x", turn=2)
    assert (closing.kind, closing.chain_id) == ("length", 1)
    [closed] = session.finalize()
    assert len(closed.prompt_ids) + len(closed.response_ids) == cap
    assert closed.response_ids[-1:] == tok("d")


def test_c37_oversized_fresh_prompt_returns_length_without_a_chain():
    session = new_session(prompt_length=5, response_length=5)
    outcome = reply(session, MAIN, "plan")
    assert (outcome.kind, outcome.chain_id, outcome.completion_tokens) == ("length", None, 0)
    assert session.active_chains == [] and session.chains_created == 0
    assert session.finalize() == []


# -- hashing (cases 46-50) ------------------------------------------------------------------------


def test_c46_changed_first_message_splits_and_tips_match_history():
    session = new_session()
    reply(session, [system("v1"), user("q")], "x")
    outcome = reply(session, [system("v2"), user("q"), assistant("x"), user("more")], "y")
    assert outcome.new_chain
    for stored in session.active_chains:
        assert stored.message_tip_hash == prefix_hashes(stored.message_history)[-1]


def test_c47_json_arguments_hash_by_value_and_raw_strings_by_text():
    def with_args(arguments):
        return message_hash(assistant("", [call("c", "run", arguments)]))

    assert (
        with_args('{"path": "a", "line": 3}')
        == with_args('{"line":3,"path":"a"}')
        == with_args({"line": 3, "path": "a"})
    )
    assert with_args("{not json") != with_args("{not json ")
    assert with_args("{not json") != with_args('{"not": "json"}')


def test_c48_renamed_and_swapped_tool_call_ids_hash_equal():
    def exchange(ids, result_ids):
        calls = [call(ids[0], "run", {"n": 1}), call(ids[1], "run", {"n": 2})]
        return prefix_hashes(
            [user("p"), assistant("", calls), tool_result(result_ids[0], "one"), tool_result(result_ids[1], "two")]
        )

    assert exchange(("c1", "c2"), ("c1", "c2")) == exchange(("zz", "yy"), ("zz", "yy"))
    assert exchange(("c1", "c2"), ("c1", "c2")) == exchange(("c2", "c1"), ("c2", "c1"))


@pytest.mark.parametrize("result_id", ["call_1", "fresh_id_9"])
def test_c49_tool_call_echo_reuses_chain_whatever_the_result_id(result_id):
    session = new_session()
    calls = [call("call_1", "run", '{"cmd": "ls"}')]
    session.step([user("list")], TOOLS_A, gen("ls"), None, {"role": "assistant", "content": None, "tool_calls": calls})
    echo = {"role": "assistant", "content": None, "tool_calls": calls}
    outcome = reply(session, [user("list"), echo, tool_result(result_id, "a.txt")], "done", tools=TOOLS_A)
    assert (outcome.chain_id, outcome.new_chain, session.chains_created) == (1, False, 1)


def test_c50_rewritten_committed_tool_call_ids_still_reuse_chain():
    session = new_session()
    reply(session, [user("go")], "", calls=[call("orig", "run", {"n": 1})])
    history = [user("go"), assistant("", [call("renamed", "run", {"n": 1})]), tool_result("renamed", "ok")]
    assert reply(session, history, "", calls=[call("orig2", "run", {"n": 2})]).chain_id == 1
    history += [assistant("", [call("again", "run", {"n": 2})]), tool_result("again", "ok")]
    assert reply(session, history, "end").chain_id == 1
    assert session.chains_created == 1


# -- logprobs (cases 51, 52; 53 as a bonus) -----------------------------------------------------------


def test_c51_requested_logprobs_stay_aligned_with_context_zero():
    session = new_session()
    first, second = [-0.1, -0.2, -0.3], [-1.0, -2.0, -3.0, -4.0]
    reply(session, [user("p")], "ab", logprobs=first)
    reply(session, [user("p"), assistant("ab"), user("q")], "cde", logprobs=second)
    [trajectory] = session.finalize()
    context = inc("<|s|>user\nq<|e|>\n")
    assert trajectory.response_logprobs == first + [0.0] * len(context) + second
    assert len(trajectory.response_logprobs) == len(trajectory.response_ids)


def test_c52_unrequested_logprobs_are_ignored():
    session = new_session()
    reply(session, [user("p")], "ab", logprobs=[-0.1, -0.2, -0.3], request_logprobs=False)
    assert session.finalize()[0].response_logprobs is None


@pytest.mark.parametrize("logprobs", [None, [-0.1]])
def test_c53_requested_logprobs_missing_or_short_fail_without_a_chain(logprobs):
    session = new_session()
    with pytest.raises(ServerError, match="logprobs were requested"):
        reply(session, [user("p")], "ab", logprobs=logprobs, request_logprobs=True)
    assert session.active_chains == [] and session.chains_created == 0


def test_c54_failed_continuation_logprobs_leave_the_chain_for_a_retry():
    session = new_session()
    reply(session, [user("p")], "ab", logprobs=[-0.1] * 3)
    before = chain(session, 1).buffer.copy()
    again = [user("p"), assistant("ab"), user("q")]
    with pytest.raises(ServerError, match="logprobs were requested"):
        reply(session, again, "cd", logprobs=[-0.2])
    assert chain(session, 1).buffer == before
    assert reply(session, again, "cd", logprobs=[-0.2] * 3).chain_id == 1
    [trajectory] = session.finalize()
    assert len(trajectory.response_logprobs) == len(trajectory.response_ids)


# -- adapter, codec and chain behaviours beyond the numbered cases ---------------------------------------


def test_exact_resend_glues_the_generation_without_a_generation_prompt():
    session = new_session()
    reply(session, [user("p")], "a")
    outcome = reply(session, [user("p"), assistant("a")], "b")
    assert (outcome.chain_id, outcome.prompt_tokens) == (1, len(full([user("p")]) + gen("a")))
    assert session.finalize()[0].response_ids == gen("a") + gen("b")


def test_pure_drop_retry_forks_and_keeps_both():
    session = new_session(rollback=True)
    second = two_turn_chain(session)
    outcome = reply(session, second, "two again", turn=2)
    assert (outcome.new_chain, outcome.rollback) == (True, False)
    original, retry = session.finalize()
    assert original.response_ids[-4:] == gen("two") and retry.prompt_ids == full(second)


def test_null_and_empty_content_are_equal_but_a_streaming_index_splits():
    session = new_session()
    reply(session, [user("p")], "", calls=[call("c", "run", {"n": 1})])
    null_content = {"role": "assistant", "content": None, "tool_calls": [call("c", "run", {"n": 1})]}
    assert reply(session, [user("p"), null_content, tool_result("c", "ok")], "x").chain_id == 1
    indexed = {**call("c", "run", {"n": 1}), "index": 0}
    split = reply(session, [user("p"), assistant("", [indexed]), tool_result("c", "ok"), user("z")], "y")
    assert split.new_chain  # uni-agent keeps `index`, so the echo no longer matches the stored call


def test_adapter_rejection_leaves_the_session_unchanged():
    session = new_session()
    with pytest.raises(RequestRejected, match="role"):
        reply(session, [{"content": "no role"}], "x")
    with pytest.raises(RequestRejected, match="content"):
        reply(session, [user("p"), {"role": "user", "content": 42}], "x")
    with pytest.raises(RequestRejected, match="non-empty"):
        reply(session, [], "x")
    assert session.active_chains == [] and session.finalize() == []


def test_rollback_provenance_drops_only_the_abandoned_generation():
    session = new_session(rollback=True)
    second = two_turn_chain(session)
    reply(session, [*second, user("replacement")], "three", turn=2)
    [trajectory] = session.finalize()
    trained = {s for s, m in zip(trajectory.response_source, trajectory.response_mask) if m}
    assert trained == {0, 2}
    assert all(s == CONTEXT for s, m in zip(trajectory.response_source, trajectory.response_mask) if not m)


def test_finalize_twice_is_refused():
    session = new_session()
    session.finalize()
    with pytest.raises(ServerError, match="finalized"):
        session.finalize()


# -- codec (docs/upstream_chains.md#codec) ---------------------------------------------------------------------------------


def test_codec_probes_generation_prompt_and_separator():
    codec = ChainCodec(ToyRenderer(separator="\n\n"))
    assert codec.generation_prompt == tok(GP)
    assert codec.turn_separator == tok("\n\n")
    assert ChainCodec(ToyRenderer(separator="")).turn_separator == []


def test_codec_separator_without_eos_drops_the_first_common_token():
    codec = ChainCodec(ToyRenderer(separator="\n"), eos_token_ids=[])
    assert codec.turn_separator == tok("\n")  # common tail "<|e|>\n" minus its first token


def test_codec_separator_probe_retries_with_text_parts():
    codec = ChainCodec(ToyRenderer(reject_string_content=True))
    assert codec.turn_separator == tok("\n")


def test_codec_full_render_falls_back_behind_an_empty_user():
    codec = ChainCodec(ToyRenderer(require_user=True))
    expected = tok(f"<|s|>system\nonly a system prompt<|e|>\n{GP}")
    assert codec.encode_full([system("only a system prompt")], None) == expected


def test_codec_incremental_allows_a_leading_assistant_only():
    codec = ChainCodec(ToyRenderer())
    assert codec.encode_incremental([]) == []
    assert codec.encode_incremental([assistant("edited"), user("q")]) == inc(
        "<|s|>assistant\nedited<|e|>\n<|s|>user\nq<|e|>\n"
    )
    with pytest.raises(ServerError, match="may only appear first"):
        codec.encode_incremental([user("q"), assistant("x")])


def test_codec_refuses_a_template_that_is_not_prefix_stable():
    class Rewriting(ToyRenderer):
        def render_text(self, messages, tools=None, add_generation_prompt=True, **kwargs):
            text = super().render_text(messages, tools, add_generation_prompt, **kwargs)
            return text.replace("<|s|>user\n<|e|>", "<|s|>user\n(empty)<|e|>") if len(messages) > 1 else text

    with pytest.raises(ServerError, match="prefix-stable"):
        ChainCodec(Rewriting()).encode_incremental([user("q")])


def test_codec_refuses_an_unstable_generation_prompt():
    class Unstable(ToyRenderer):
        def render_text(self, messages, tools=None, add_generation_prompt=True, **kwargs):
            text = super().render_text(messages, tools, add_generation_prompt, **kwargs)
            return text.replace("<|e|>", "<|e|>!") if add_generation_prompt else text

    with pytest.raises(ChainsSetupError, match="generation prompt"):
        ChainCodec(Unstable())
