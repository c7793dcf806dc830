"""`nonlinear` = `nonlinear_history` (the request is not an append) + `nonlinear_template` (the render is not a prefix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_linear_fakes import FakeRenderer, assistant, user
from trace_tools.strategies.linear_core import LinearHealer


@pytest.fixture(scope="module")
def qwen3():
    from trace_tools.render.renderer import Renderer

    return Renderer.from_spec("qwen3", "qwen3")


def _two_turns(healer: LinearHealer, first: list[dict], reply: dict, second: list[dict]) -> str:
    fed = healer.heal("s", first)
    healer.commit("s", fed, [7, 8], first, reply)
    return healer.heal_turn("s", second).event


@pytest.mark.parametrize("delta", [True, False])
def test_an_edited_history_counts_as_history(delta):
    healer = LinearHealer(FakeRenderer(), delta=delta)
    event = _two_turns(healer, [user("why")], assistant("because"), [user("why not"), assistant("because"), user("ok")])
    stats = healer.pop_stats("s")
    assert event == "reset"
    assert (stats["nonlinear"], stats["nonlinear_history"], stats["nonlinear_template"]) == (1, 1, 0)


@pytest.mark.parametrize("delta", [True, False])
def test_qwen3_last_assistant_quirk_counts_as_template(qwen3, delta):
    """Qwen3 writes an empty think block only for a last assistant without reasoning: an append that is not a prefix."""
    healer = LinearHealer(qwen3, delta=delta)
    first = [user("What is 2 + 2?")]
    reply = {"role": "assistant", "content": "4"}
    second = first + [reply, {"role": "user", "content": "And 3 + 3?"}]
    assert _two_turns(healer, first, reply, second) == "reset"
    stats = healer.pop_stats("s")
    assert (stats["nonlinear"], stats["nonlinear_history"], stats["nonlinear_template"]) == (1, 0, 1)


def test_the_same_append_with_reasoning_heals(qwen3):
    """With reasoning the last-assistant render survives a tool result (Qwen3 keeps reasoning after the last query)."""
    healer = LinearHealer(qwen3)
    first = [user("List the files.")]
    reply = {"role": "assistant", "content": "Listing.", "reasoning_content": "ls is enough."}
    assert _two_turns(healer, first, reply, first + [reply, {"role": "tool", "content": "a.py"}]) == "healed"
    assert healer.pop_stats("s")["nonlinear"] == 0


def test_simulated_sessions_split_by_behaviour(qwen3):
    """On the bundled sample: truncation (Qwen3 drops old reasoning) is the template's; dropped reasoning echoes are history."""
    from trace_tools.io.load import load
    from trace_tools.strategies.base import ReplayContext
    from trace_tools.strategies.registry import get_strategy

    dump = load(Path(__file__).parents[1] / "sample_traces" / "qwen3.parquet")
    ctx = ReplayContext(qwen3, "slime", "auto", {})
    by_behaviour = {}
    for session in dump.sessions:
        behaviours = "+".join(session.turns[0].metadata["behaviours"])
        if behaviours in ("truncation", "reasoning-dropped", "byte-exact", "compaction"):
            counters = get_strategy("linear")(ctx).replay(session).counters
            assert counters["nonlinear"] == counters["nonlinear_history"] + counters["nonlinear_template"]
            by_behaviour[behaviours] = (counters["nonlinear_history"], counters["nonlinear_template"])
    assert by_behaviour["byte-exact"] == (0, 0)
    assert by_behaviour["truncation"][0] == 0 and by_behaviour["truncation"][1] >= 1
    assert by_behaviour["reasoning-dropped"][0] >= 1 and by_behaviour["reasoning-dropped"][1] == 0
    assert by_behaviour["compaction"][1] >= 1
