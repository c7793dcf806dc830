"""Recording modes of `prompt_ids`: tree (full render), linear (healed), none."""

from __future__ import annotations

import pytest

from trace_tools.io.load import load, read_dump_meta
from trace_tools.render.canonical import canonicalize_messages
from trace_tools.render.renderer import Renderer
from trace_tools.simulate import simulate

RECIPES = ["json-reserialize", "claude-code", "noncanonical-tokenization", "subagent"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """{recording: {behaviour: Session}} for the same seed and recipes, and the dump paths."""
    sessions, paths = {}, {}
    for recording in ("tree", "linear", "none"):
        path = paths[recording] = tmp_path_factory.mktemp("rec") / f"{recording}.parquet"
        simulate(
            len(RECIPES), seed=21, template="qwen3", behaviours=RECIPES, recording=recording, out=str(path), max_turns=8
        )
        sessions[recording] = {s.turns[0].metadata["behaviours"][0]: s for s in load(path).sessions}
    return sessions, paths


def _healed(session):
    return [t.metadata["linear_event"] for t in session.turns]


def _served(turn):
    return turn.prompt_ids + turn.output_ids


def test_recording_changes_prompts_only(recorded):
    recorded, _ = recorded
    for behaviour in RECIPES:
        for a, b in zip(recorded["tree"][behaviour].turns, recorded["linear"][behaviour].turns, strict=True):
            assert (a.messages, a.output_ids, a.response) == (b.messages, b.output_ids, b.response)


def test_none_records_no_prompt_ids(recorded):
    recorded, paths = recorded
    assert all(t.prompt_ids is None for s in recorded["none"].values() for t in s.turns)
    assert read_dump_meta(paths["none"]).extra["recording"] == "none"


def test_linear_heals_dict_equal_echoes_and_split_tokens(recorded):
    """A linear gateway splices the served ids: re-serialized JSON and non-canonical splits never reach the prompt."""
    recorded, _ = recorded
    for behaviour in ("json-reserialize", "noncanonical-tokenization"):
        turns = recorded["linear"][behaviour].turns
        assert _healed(recorded["linear"][behaviour])[1:] == ["healed"] * (len(turns) - 1)
        for previous, turn in zip(turns, turns[1:]):
            assert turn.prompt_ids[: len(_served(previous))] == _served(previous)
    tree = recorded["tree"]["noncanonical-tokenization"].turns
    assert any(t.prompt_ids[: len(_served(p))] != _served(p) for p, t in zip(tree, tree[1:]))


def test_linear_resets_on_a_real_change(recorded):
    """A claude-code echo is not dict-equal to what the gateway stored: the healer re-anchors on a full render."""
    recorded, _ = recorded
    renderer = Renderer.from_spec("qwen3", "qwen3")
    turns = recorded["linear"]["claude-code"].turns
    resets = [t for t in turns if t.metadata["linear_event"] == "reset"]
    assert resets
    for turn in resets:
        assert turn.prompt_ids == renderer.render(canonicalize_messages(turn.messages), turn.tools)


def test_linear_subagent_switches_reset_the_healer(recorded):
    recorded, _ = recorded
    turns = recorded["linear"]["subagent"].turns
    switches = [t for p, t in zip(turns, turns[1:]) if p.metadata["branch"] != t.metadata["branch"]]
    assert len(switches) == 2 and all(t.metadata["linear_event"] == "reset" for t in switches)


def test_linear_dump_declares_its_history_mode(recorded):
    _, paths = recorded
    assert read_dump_meta(paths["linear"]).history_mode == "linear"
    assert read_dump_meta(paths["tree"]).history_mode == "tree"
