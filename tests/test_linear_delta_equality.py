"""Delta path == full path on simulated sessions of both templates, with the real renderer.

Each session is healed twice (text-space delta render vs full render). docs/upstream_restore_linear.md#deviations-and-choices: where the two
differ the turn is counted and explained (`path_differences`); on simulated sessions there must be
no such turn. The healed-turn floor keeps the comparison from passing vacuously (a template that
is never prefix-consistent would reset every turn on both paths and "agree").
"""

from __future__ import annotations

from collections import Counter

import pytest

from trace_tools.strategies.linear_core import LinearHealer, heal_session, path_differences


@pytest.fixture(scope="module", params=["qwen3", "qwen3.5"])
def simulated(request, tmp_path_factory):
    from trace_tools.io.load import load
    from trace_tools.render.renderer import Renderer
    from trace_tools.simulate import simulate
    from trace_tools.strategies.base import ReplayContext, prepare

    path = tmp_path_factory.mktemp("delta") / f"{request.param}.parquet"
    simulate(sessions=20, seed=5, template=request.param, out=str(path), max_turns=10)
    dump = load(path)
    renderer = Renderer.from_spec(dump.meta.tokenizer, None, dump_meta=dump.meta)
    ctx = ReplayContext(renderer)
    return renderer, [(s.session_id, prepare(s, ctx).turns) for s in dump.sessions]


def test_delta_and_full_paths_feed_identical_ids(simulated):
    renderer, sessions = simulated
    delta_healer, full_healer = LinearHealer(renderer, delta=True), LinearHealer(renderer, delta=False)
    differences, events = [], Counter()
    for sid, turns in sessions:
        delta = heal_session(delta_healer, sid, turns)
        full = heal_session(full_healer, sid, turns)
        differences += path_differences(sid, turns, delta, full)
        events.update(o.event for o in delta)
    assert differences == [], "\n".join(f"{d.session_id}#{d.turn_index}: {d.cause}" for d in differences)
    turns = sum(len(t) for _, t in sessions)
    assert events["healed"] >= turns // 3, events
    assert delta_healer.paths == {"delta": events["healed"]}  # no silent fallback on these sessions
    assert full_healer.paths == {"full": events["healed"]}
    assert delta_healer.counters == full_healer.counters
