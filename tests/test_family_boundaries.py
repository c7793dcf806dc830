"""Per-family boundary rules: the closer each template writes, how the served stop token meets it,
and what the linear healer, miles' TITO families and uni-agent's codec make of each family."""

from __future__ import annotations

import pytest

from trace_tools.render.boundary import Closers, join
from trace_tools.render.renderer import Renderer
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.registry import get_strategy

TOKENIZERS = {
    "qwen3": "qwen3",
    "glm4.5": "qwen3+glm4.5-specials",
    "deepseek-v3": "deepseek-v3",
    "gpt-oss": "gpt-oss",
    "llama3.1": "llama3.1",
}


def _renderer(family: str) -> Renderer:
    return Renderer.from_spec(TOKENIZERS[family], family)


@pytest.mark.parametrize(
    "family, writes, ends, after",
    [
        ("qwen3", True, {"<|im_end|>"}, "\n"),
        ("glm4.5", False, set(), ""),
        ("deepseek-v3", True, {"<｜end▁of▁sentence｜>"}, ""),
        ("llama3.1", True, {"<|eot_id|>"}, ""),
        ("gpt-oss", True, {"<|end|>", "<|call|>", "<|return|>"}, ""),
    ],
)
def test_probed_closers(family, writes, ends, after):
    closers = Closers.probe(_renderer(family), None, {})
    assert closers.writes_closer is writes and ends <= set(closers.end_tokens) and closers.glue_after == after


def test_gpt_oss_closer_depends_on_what_ends_the_reply():
    """A tool call ends with <|call|>, a continued answer with <|end|>, the last one of a training render
    with <|return|>: all three are checked against the real render, none is guessed."""
    renderer = _renderer("gpt-oss")
    closers = Closers.probe(renderer, None, {})
    user = {"role": "user", "content": "u"}
    bash = {"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
    call = {"role": "assistant", "content": "", "tool_calls": [bash]}
    answer = {"role": "assistant", "content": "done"}
    assert closers.ending(renderer.render_text([user, call], None, False)) == "<|call|>"
    assert closers.ending(renderer.render_text([user, answer], None, False)) == "<|return|>"
    continued = renderer.render_text([user, answer, user], None, False)
    assert closers.ending(continued[: continued.rindex("<|start|>user")]) == "<|end|>"


def test_gpt_oss_rewrite_after_a_call_is_anchored_on_a_call():
    """A final answer among the appended messages drops the stored call's analysis (a rewrite), and
    gpt-oss refuses tool results after the plain text anchor: the anchor becomes a call to the same tool."""
    from trace_tools.render.boundary import split_extension

    renderer = _renderer("gpt-oss")
    call = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Look at it first.",
        "tool_calls": [{"type": "function", "function": {"name": "Read", "arguments": {"file_path": "/r/a.py"}}}],
    }
    path = [{"role": "user", "content": "fix it"}, call]
    appended = [
        {"role": "tool", "content": "1: x = 1"},
        {"role": "assistant", "content": "I was cut"},
        {"role": "user", "content": "go on"},
    ]
    closer, tail, rewritten = split_extension(renderer, path, appended, None, {}, Closers.probe(renderer, None, {}))
    assert rewritten and closer == "<|call|>"
    assert tail.startswith("<|start|>functions.Read to=assistant") and tail.endswith("<|start|>assistant")


def test_join_rules():
    im_end, newline, user, obs, ret, end = 1, 2, 3, 4, 5, 6
    # ChatML: the served <|im_end|> is the closer's head; only "\n" is added.
    assert join([9, im_end], [im_end, newline], [user, 7], [im_end]) == ([newline], [user, 7])
    # GLM: no closer; the served stop token is the next message's opener, so it is not repeated.
    assert join([9, obs], [], [obs, 7], [obs, user]) == ([], [7])
    # A cut-off reply (no stop token) gets the whole closer and tail.
    assert join([9, 8], [im_end, newline], [user], [im_end]) == ([im_end, newline], [user])
    assert join([9, 8], [], [obs, 7], [obs]) == ([], [obs, 7])
    # gpt-oss: the served <|return|> stands in for the <|end|> a continued history has.
    assert join([9, ret], [end], [user], [ret]) == ([], [user])


def _session(family: str, recipe: str):
    from trace_tools.simulate import simulate_sessions
    from trace_tools.simulate.behaviours import parse_recipes

    sessions, meta = simulate_sessions(1, 11, family, parse_recipes([recipe]), "tree", 10)
    return sessions[0], Renderer.from_spec(meta.tokenizer, None, dump_meta=meta)


def test_glm_linear_healing_does_not_repeat_the_stop_token():
    """Upstream trims the overlap against the closer only; GLM has none, so the stop token would be
    fed twice. Trimming against closer + tail heals GLM to exactly the full renders."""
    from trace_tools.strategies.base import prepare
    from trace_tools.strategies.linear_core import LinearHealer, heal_session

    session, renderer = _session("glm4.5", "byte-exact")
    ctx = ReplayContext(renderer)
    outcomes = heal_session(LinearHealer(renderer), session.session_id, prepare(session, ctx).turns)
    assert [o.event for o in outcomes[1:]] == ["healed"] * (len(outcomes) - 1)
    assert [o.ids for o in outcomes] == [t.prompt_ids for t in session.turns]


def test_linear_probe_cannot_close_a_gpt_oss_tool_call():
    """agentcore's closer probe uses a text reply (<|return|> as the last message), a tool call ends
    with <|call|>: every turn after a call is close_unresolved and re-anchors (checkpoint-tree heals them)."""
    session, renderer = _session("gpt-oss", "byte-exact")
    ctx = ReplayContext(renderer)
    linear = get_strategy("linear")(ctx).replay(session)
    after_calls = len(session.turns) - 1
    assert linear.counters["close_unresolved"] == linear.counters["resets"] == after_calls
    checkpoint = get_strategy("checkpoint-tree")(ctx).replay(session)
    assert checkpoint.counters["healed_turns"] == after_calls and checkpoint.counters["resets"] == 0


def test_glm_maps_to_miles_glm47_which_drops_the_trailing_stop_token():
    from trace_tools.strategies.session_core.tito import TitoTokenizer, family_for

    session, renderer = _session("glm4.5", "byte-exact")
    family = family_for(renderer)
    assert family.name == "glm47" and family.max_trim_tokens == 1
    tito = TitoTokenizer(renderer, family)
    obs, user = (renderer.tokenizer.token_to_id(t) for t in ("<|observation|>", "<|user|>"))
    assert tito.fix_boundary([7, obs]) == [7] and tito.fix_boundary([7, user]) == [7]
    assert tito.fix_boundary([7, 8]) == [7, 8]
    # The appended messages render the stop token again, at the same place: fed once, trained once.
    result = get_strategy("session-v1")(ReplayContext(renderer)).replay(session)
    (sample,) = result.samples
    assert [obs, obs] not in [sample.token_ids[i : i + 2] for i in range(len(sample.token_ids) - 1)]
    assert sum(sample.loss_mask) == sum(len(t.output_ids) for t in session.turns)
    assert family_for(_renderer("deepseek-v3")).name == "default"


def test_uniagent_codec_cannot_append_gpt_oss_tool_results():
    """uni-agent renders appended messages behind an empty user turn; gpt-oss's template refuses a
    tool message with no call before it, so each tool-result continuation is an upstream HTTP 500."""
    session, renderer = _session("gpt-oss", "byte-exact")
    result = get_strategy("chains")(ReplayContext(renderer)).replay(session)
    assert result.counters["server_errors"] == len(session.turns) - 1
    assert set(result.turn_events.values()) == {"failed"}
