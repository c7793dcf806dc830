"""The invariants of docs/metrics.md#invariants for every registered strategy, on simulated sessions of every model family."""

from __future__ import annotations

from collections import Counter

import pytest

from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.registry import available_strategies, get_strategy

QWEN = ("qwen3", "qwen3.5")
FAMILIES = (*QWEN, "glm4.5", "deepseek-v3", "gpt-oss", "llama3.1")


@pytest.fixture(scope="module", params=FAMILIES)
def loaded(request, tmp_path_factory):
    """Qwen: 14 sessions of up to 40 turns; the other families: every behaviour and mix once, up to 12 turns."""
    from trace_tools.io.load import load
    from trace_tools.simulate import simulate

    path = tmp_path_factory.mktemp("inv") / f"{request.param}.parquet"
    if request.param in QWEN:
        simulate(sessions=14, seed=11, template=request.param, out=str(path))
    else:
        simulate(sessions=16, seed=11, template=request.param, out=str(path), max_turns=12)
    return load(path)


@pytest.fixture(scope="module")
def renderer(loaded):
    from trace_tools.render.renderer import Renderer

    return Renderer.from_spec(loaded.meta.tokenizer, None, dump_meta=loaded.meta)


def _results(loaded, renderer, name, params=None):
    ctx = ReplayContext(renderer, params=params or {})
    strategy = get_strategy(name)(ctx)
    return [(s, strategy.replay(s)) for s in loaded.sessions]


def _check_session(session, result):
    outputs = {t.turn_index: t for t in session.turns}
    trained = Counter()
    for sample in result.samples:
        assert len(sample.loss_mask) == len(sample.logprobs) == sample.response_length
        assert len(sample.source_turn) == len(sample.token_ids)
        assert 0 <= sample.response_length <= len(sample.token_ids)
        start = len(sample.token_ids) - sample.response_length
        for pos, (mask, lp) in enumerate(zip(sample.loss_mask, sample.logprobs)):
            source = sample.source_turn[start + pos]
            if not mask:
                continue
            assert source >= 0, "a trained token must be a generated token"
            trained[source] += 1
            _assert_recorded_logprob(sample, start + pos, outputs[source], lp)
    for index, count in trained.items():
        assert count <= len(outputs[index].output_ids), f"turn {index} trained more tokens than it generated"


def _assert_recorded_logprob(sample, position, turn, logprob):
    """The trained token is one of the turn's output tokens and carries its recorded logprob."""
    run_start = position
    while run_start > 0 and sample.source_turn[run_start - 1] == turn.turn_index:
        run_start -= 1
    offset = position - run_start
    span = sample.token_ids[run_start : position + 1]
    for shift in range(len(turn.output_ids)):
        if turn.output_ids[shift : shift + len(span)] == span and shift + offset < len(turn.output_ids):
            assert sample.token_ids[position] == turn.output_ids[shift + offset]
            if turn.output_logprobs is not None:
                assert logprob == pytest.approx(turn.output_logprobs[shift + offset], abs=1e-6)
            return
    raise AssertionError(f"trained span of turn {turn.turn_index} is not a slice of its output ids")


@pytest.mark.parametrize("name", available_strategies())
def test_invariants_hold_for_every_strategy(loaded, renderer, name):
    for session, result in _results(loaded, renderer, name):
        _check_session(session, result)


@pytest.mark.parametrize(
    "params", [{"fork_threshold": 0}, {"fork_threshold": 1}, {"realign_gate": "drift", "realign_from": "divergence"}]
)
def test_tree_invariants_under_other_parameters(loaded, renderer, params):
    for session, result in _results(loaded, renderer, "tree", params):
        _check_session(session, result)


@pytest.mark.parametrize("name", available_strategies())
def test_byte_exact_sessions_train_everything_in_one_sample(loaded, renderer, name, request):
    family = renderer.family
    if name.startswith("session-") and family == "qwen3.5":
        # miles' incremental render uses a dummy system + assistant base; TRL's qwen3_5_think.jinja
        # raises "No user query found" on it, so upstream answers HTTP 500 (docs/upstream_session.md).
        request.applymarker(pytest.mark.xfail(strict=True, reason="TRL Qwen3.5 template rejects miles' dummy base"))
    exact = [s for s in loaded.sessions if s.turns[0].metadata.get("behaviours") == ["byte-exact"]]
    assert exact, "the simulated dump has byte-exact sessions"
    append_only = [s for s in exact if _append_only(s)]
    if family == "deepseek-v3":
        # Not append-only, so the invariant does not apply: DeepSeek V3's template never renders
        # reasoning and drops its own generation-prompt markers from history, so each prompt
        # re-renders the previous reply differently from what was served (docs/model_families.md).
        assert not append_only and all(_breaks_only_at_the_last_reply(s) for s in exact)
        return
    assert append_only == exact
    for session, result in _results(type("L", (), {"sessions": exact})(), renderer, name):
        generated = sum(len(t.output_ids) for t in session.turns)
        if name == "chains" and family == "gpt-oss":
            # uni-agent renders appended messages behind an empty user turn; gpt-oss's template refuses
            # a tool result with no call before it, so every continuation is an HTTP 500 upstream.
            assert result.counters["server_errors"] == len(session.turns) - 1
            assert sum(result.samples[0].loss_mask) == len(session.turns[0].output_ids)
            continue
        if name == "areal":
            # AReaL's parent is a call whose messages + {"role": "assistant", "content": text} start this
            # call's messages, compared as dicts: an echo carrying tool calls never equals that, so every
            # tool-calling turn is a root and its own leaf, each trained once (docs/strategies.md#areal).
            assert sum(sum(s.loss_mask) for s in result.samples) == generated
            assert len(result.samples) == 1 + sum(bool(t.response.get("tool_calls")) for t in session.turns[:-1])
            continue
        assert len(result.samples) == 1, f"{session.session_id}: {len(result.samples)} samples"
        assert sum(result.samples[0].loss_mask) == generated


def _append_only(session) -> bool:
    """Every turn's recorded prompt extends the previous turn's prompt + output, token for token."""
    served: list[int] = []
    for turn in session.turns:
        if list(turn.prompt_ids[: len(served)]) != served:
            return False
        served = [*turn.prompt_ids, *turn.output_ids]
    return True


def _breaks_only_at_the_last_reply(session) -> bool:
    """Each break in the token stream lies after the previous prompt minus its last two tokens: the
    generation prompt's `<think>\\n` or the `<｜tool▁outputs▁end｜>` the template drops once a reply
    follows, and the reply itself, re-rendered (reasoning gone). Nothing earlier changes."""
    for previous, turn in zip(session.turns, session.turns[1:]):
        keep = len(previous.prompt_ids) - 2
        if list(turn.prompt_ids[:keep]) != list(previous.prompt_ids[:keep]):
            return False
    return True
