"""Replay frees what it builds through reference counting, so the cyclic collector can stay off
while a session replays, and in a process the run owns for the whole run (each of its passes
walks every live token-id list)."""

from __future__ import annotations

import copy
import gc
import importlib
import pickle
from dataclasses import fields

import pytest

from trace_tools.data import ReplayResult
from trace_tools.io.id_columns import ShippedSession
from trace_tools.pipeline import Pipeline
from trace_tools.replay.session import ReplayOptions, SessionReplayer
from trace_tools.strategies.base import ReplayContext, Strategy
from trace_tools.strategies.declarations import Declaration
from trace_tools.strategies.registry import REGISTRY, available_strategies, get_strategy, register


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
    declaration = Declaration(
        "test-collector-probe", "probe", "notes whether the collector runs", renders_prompts=False
    )
    seen: list[bool] = []

    def replay_session(self, prepared):
        self.seen.append(gc.isenabled())
        return ReplayResult()


def test_the_collector_is_paused_only_while_a_session_replays(simulated_dump):
    session = next(s for s in Pipeline(simulated_dump) if hasattr(s, "turns"))
    register(_CollectorProbe)
    _CollectorProbe.seen = []
    options = ReplayOptions(strategies=["test-collector-probe"])
    try:
        SessionReplayer(options, pause_gc=True)(session)
        assert gc.isenabled()
        gc.disable()  # a caller that runs with the collector off keeps it off
        SessionReplayer(options, pause_gc=True)(session)
        assert not gc.isenabled()
        gc.enable()
        SessionReplayer(options)(session)  # a process the replay does not own keeps its collector
    finally:
        gc.enable()
        REGISTRY.pop("test-collector-probe")
    assert _CollectorProbe.seen == [False, False, True]


@pytest.mark.parametrize("owns_process", [False, True])
def test_an_api_replay_acts_on_the_process_only_when_it_owns_it(simulated_dump, tmp_path, monkeypatch, owns_process):
    """The API in a notebook keeps the collector running and starts no report helper; the command
    line (`owns_process=True`) pauses the collector during sessions and writes the report in a helper."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from trace_tools.api import replay
    from trace_tools.report import finish

    started = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(finish.subprocess, "Popen", lambda *a, **k: started.append(a) or real_popen(*a, **k))
    # as in a fresh process, where matplotlib is not loaded yet
    monkeypatch.setattr(finish, "sys", SimpleNamespace(modules={}, executable=sys.executable))
    register(_CollectorProbe)
    _CollectorProbe.seen = []
    try:
        replay(
            simulated_dump,
            out=tmp_path / "run",
            strategies=["test-collector-probe"],
            workers=1,
            owns_process=owns_process,
        )
    finally:
        REGISTRY.pop("test-collector-probe")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert _CollectorProbe.seen and set(_CollectorProbe.seen) == {not owns_process}
    assert len(started) == (1 if owns_process else 0)
    assert (tmp_path / "run" / "plots").is_dir()


@pytest.mark.parametrize("owns_process", [False, True])
def test_a_process_the_run_owns_keeps_the_collector_off_between_sessions_too(
    simulated_dump, tmp_path, monkeypatch, owns_process
):
    """Reading the next session and writing the last one's rows allocate as much as replaying it:
    an owned process runs the whole replay with the collector off and what lived before frozen,
    and ends it with both as they were."""
    from trace_tools.api import replay
    from trace_tools.replay import engine

    states = []
    monkeypatch.setattr(engine, "session_done", lambda: states.append((gc.isenabled(), gc.get_freeze_count() > 0)))
    replay(simulated_dump, out=tmp_path / "run", strategies=["tree"], workers=1, owns_process=owns_process)
    assert states and set(states) == {(not owns_process, owns_process)}
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("owns_process", [False, True])
def test_reconstruct_renders_with_the_collector_off_only_when_it_owns_the_process(
    simulated_dump, monkeypatch, owns_process
):
    module = importlib.import_module("trace_tools.reconstruct")  # the package exports the function
    states = []
    monkeypatch.setattr(module, "session_done", lambda: states.append(gc.isenabled()))
    result = module.reconstruct(simulated_dump, owns_process=owns_process)
    assert states and set(states) == {not owns_process}
    assert result.summary["turns"] > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_with_the_collector_off_cycles_are_collected_every_few_sessions(monkeypatch):
    """What cycles hold (an exception's traceback can hold a session's data) is freed every
    COLLECT_EVERY sessions, not kept to the end of the run."""
    import weakref

    from trace_tools import collector

    class Node:
        pass

    monkeypatch.setattr(collector, "COLLECT_EVERY", 3)
    monkeypatch.setattr(collector, "_sessions", 0)
    with collector.collector_off(True):
        node = Node()
        node.itself = node
        alive = weakref.ref(node)
        del node
        collector.session_done()
        collector.session_done()
        assert alive() is not None  # reference counting alone cannot free a cycle
        collector.session_done()
        assert alive() is None
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_caller_that_keeps_the_collector_off_finds_it_off_and_never_collected_for(monkeypatch):
    """The process's owner switched it off: neither the run nor its session count changes that."""
    from trace_tools import collector

    monkeypatch.setattr(collector, "COLLECT_EVERY", 1)
    collected = []
    gc.callbacks.append(lambda phase, info: collected.append(phase))
    gc.disable()
    try:
        with collector.collector_off(True):
            collector.session_done()
            assert not gc.isenabled()
        collector.session_done()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.callbacks.pop()
        gc.enable()
    assert collected == []


def test_local_workers_run_with_the_collector_off():
    """A worker process is the run's from its start, however it was started."""
    from trace_tools.replay.local_pool import WorkerPool

    pool = WorkerPool(2)
    try:
        states = {pool.executor.submit(_collector_state).result() for _ in range(4)}
    finally:
        pool.stop()
    assert states == {(False, True)}


def test_a_shipped_session_pickles_each_prompt_as_what_it_adds_and_arrives_unchanged(simulated_dump):
    """Prompts that extend the one before, one that diverges from it (a rewound history), one with
    no recorded prompt and the one after it all arrive as they left, in a fraction of the bytes."""
    import numpy as np

    session = next(s for s in Pipeline(simulated_dump, id_arrays=True) if hasattr(s, "turns") and len(s.turns) >= 4)
    turns = session.turns
    turns[2].prompt_ids = np.concatenate((turns[1].prompt_ids[:3], np.array([7, 8, 9], dtype=np.int32)))
    turns[3].prompt_ids = None
    before = [None if t.prompt_ids is None else t.prompt_ids.copy() for t in turns]

    data = pickle.dumps(ShippedSession(session))
    received = pickle.loads(data).session
    assert len(data) < len(pickle.dumps(session)) / 2
    assert [None if t.prompt_ids is None else t.prompt_ids.tolist() for t in received.turns] == [
        None if ids is None else ids.tolist() for ids in before
    ]
    assert all(t.prompt_ids is None or t.prompt_ids.dtype == np.int32 for t in received.turns)
    assert [_plain_fields(t) for t in received.turns] == [_plain_fields(t) for t in turns]
    assert (received.session_id, received.meta) == (session.session_id, session.meta)
    assert all(a is None and b is None or np.array_equal(a, b) for a, b in zip(before, (t.prompt_ids for t in turns)))


def _plain_fields(turn) -> list:
    return [value.tolist() if hasattr(value, "tolist") else value for value in _fields_of(turn)]


def _fields_of(turn) -> tuple:
    return tuple(getattr(turn, field_.name) for field_ in fields(turn))


def _collector_state() -> tuple[bool, bool]:
    return gc.isenabled(), gc.get_freeze_count() > 0


def test_token_ids_reach_the_strategies_as_lists_and_recorded_prompts_equal_to_their_render_become_it(
    simulated_dump,
):
    """A stream opened with id_arrays hands out int32 arrays (cheap to send to a worker). The replay
    makes the output ids lists, compares each recorded prompt as an array with its render, and
    makes it a list only then: the render's own list where they are equal. It refuses any other
    type instead of guessing."""
    import numpy as np

    from trace_tools.replay import local_pool

    options = ReplayOptions(strategies=["tree"], write_samples=False)
    shipped = next(s for s in Pipeline(simulated_dump, id_arrays=True) if hasattr(s, "turns"))
    plain = next(s for s in Pipeline(simulated_dump) if hasattr(s, "turns"))
    assert isinstance(shipped.turns[0].prompt_ids, np.ndarray) and shipped.turns[0].prompt_ids.dtype == np.int32
    broken = copy.deepcopy(plain)
    broken.turns[1].output_ids = tuple(broken.turns[1].output_ids)
    with pytest.raises(TypeError, match="as tuple, not list"):
        SessionReplayer(options)(broken)

    in_place = copy.deepcopy(shipped)
    replayed = SessionReplayer(options)(in_place)
    assert all(type(t.prompt_ids) is list and type(t.output_ids) is list for t in in_place.turns)
    assert [t.prompt_ids for t in in_place.turns] == [t.prompt_ids for t in plain.turns]
    assert all(row["exact"] for row in replayed.fidelity)
    assert replayed.table("turns").equals(SessionReplayer(options)(plain).table("turns"))

    parcel = pickle.loads(pickle.dumps(ShippedSession(shipped)))  # as the worker receives it
    try:
        rows = local_pool._replay_in_worker(parcel, local_pool._Setup.now(options, {}))
    finally:
        local_pool._WORKER = None
    received = parcel.session
    assert all(type(t.prompt_ids) is list and type(t.output_ids) is list for t in received.turns)
    assert [t.prompt_ids for t in received.turns] == [t.prompt_ids for t in plain.turns]
    assert isinstance(shipped.turns[0].prompt_ids, np.ndarray)  # the driver's session is left as it was
    # Its rows cross back as Arrow IPC streams (`SessionRows.pack`), holding what the plain replay holds.
    assert rows.turns == [] and rows.table("turns").equals(SessionReplayer(options)(plain).table("turns"))
