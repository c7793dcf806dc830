"""Replay frees what it builds through reference counting, so the cyclic collector can stay paused
while a session replays (each of its passes walks every live token-id list)."""
from __future__ import annotations

import gc

import pytest

from trace_tools.data import ReplayResult
from trace_tools.pipeline import Pipeline
from trace_tools.replay.session import ReplayOptions, SessionReplayer
from trace_tools.strategies.base import REGISTRY, ReplayContext, Strategy, available_strategies, get_strategy, register
from trace_tools.strategies.declarations import Declaration


@pytest.fixture(scope="module")
def prepared_sessions(simulated_dump):
    pipeline = Pipeline(simulated_dump)
    return [pipeline.prepare(session) for session in pipeline if hasattr(session, "turns")]


def _cyclic_garbage(action) -> list:
    """What only the cyclic collector would have freed of what `action` left behind."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        action()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()


@pytest.mark.parametrize("name", available_strategies())
def test_a_finished_strategy_leaves_no_token_ids_to_the_cycle_collector(prepared_sessions, name):
    def replay() -> None:
        for prepared in prepared_sessions:
            get_strategy(name)(ReplayContext(prepared.renderer)).replay(prepared)

    garbage = _cyclic_garbage(replay)
    id_lists = [item for item in garbage if isinstance(item, list) and len(item) > 200]
    assert not id_lists, f"{name} left {len(id_lists)} token lists in reference cycles"


class _CollectorProbe(Strategy):
    declaration = Declaration("test-collector-probe", "probe", "notes whether the collector runs", renders_prompts=False)
    seen: list[bool] = []

    def replay_session(self, prepared):
        self.seen.append(gc.isenabled())
        return ReplayResult()


def test_the_collector_is_paused_only_while_a_session_replays(simulated_dump):
    session = next(s for s in Pipeline(simulated_dump) if hasattr(s, "turns"))
    register(_CollectorProbe)
    try:
        SessionReplayer(ReplayOptions(strategies=["test-collector-probe"]))(session)
        assert gc.isenabled()
        gc.disable()  # a caller that runs with the collector off keeps it off
        SessionReplayer(ReplayOptions(strategies=["test-collector-probe"]))(session)
        assert not gc.isenabled()
    finally:
        gc.enable()
        REGISTRY.pop("test-collector-probe")
    assert _CollectorProbe.seen == [False, False]
