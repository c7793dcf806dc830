"""Published measurements (docs/results.md#published-measurements-reproduced), on simulated sessions.

slime PR #2282, first table: a byte-exact echo trains every generated turn in one
sample; a Claude-Code re-rendered echo loses the Edit and Write turns under `tree`. The PR saw
Bash untouched; the Claude Code we measured (2.1.332, the simulator's `claude-code`) also drops a
leading `cd <working directory> && ` from Bash commands, so exactly those Bash turns are lost too,
and the PR's restore (defaults and per-line whitespace) does not bring them back. agentcore's
linear-history pull request: healing collapses append-only sessions to one sample with the same
trained tokens as the tree at `fork_threshold = 0`; the sessions that do not collapse are retries
and history edits, counted as `nonlinear`.
"""

from __future__ import annotations

import pandas as pd
import pytest

from trace_tools.api import replay
from trace_tools.simulate import simulate


def _run(tmp_path, behaviour, strategies, params=None, sessions=3, template="qwen3"):
    dump = tmp_path / f"{behaviour}-{template}.parquet"
    simulate(sessions=sessions, seed=21, template=template, behaviours=[behaviour], out=str(dump))
    result = replay(dump, out=tmp_path / f"run-{behaviour}-{template}", strategies=strategies, params=params)
    turns = pd.read_parquet(result.run_dir / "turns.parquet")
    sessions_frame = pd.read_parquet(result.run_dir / "sessions.parquet")
    return result.summary, _mark_cd_prefixed(turns, dump), sessions_frame


def _mark_cd_prefixed(turns, dump):
    """`turns` with a column saying whether the turn's first call is a Bash `cd <cwd> && ...`."""
    from trace_tools.io.load import load
    from trace_tools.render.harness_echo import working_directory
    from trace_tools.render.normalize import parse_arguments

    prefixed = set()
    for session in load(dump).sessions:
        cwd = working_directory(session.turns[0].messages)
        for turn in session.turns:
            calls = (turn.response or {}).get("tool_calls") or [{}]
            function = calls[0].get("function") or {}
            command = (parse_arguments(function.get("arguments")) or {}).get("command", "")
            if function.get("name") == "Bash" and command.startswith(f"cd {cwd} && "):
                prefixed.add((session.session_id, turn.turn_index))
    keys = zip(turns["session_id"], turns["turn_index"])
    return turns.assign(cd_prefixed=[key in prefixed for key in keys])


def _trained_turns(turns, strategy, tool, cd_prefixed=None):
    t = turns[(turns["strategy"] == strategy) & (turns["tool"] == tool)]
    if cd_prefixed is not None:
        t = t[t["cd_prefixed"] == cd_prefixed]
    return int((t["trained_tokens"] > 0).sum()), len(t)


@pytest.mark.parametrize("template", ["qwen3", "qwen3.5"])
def test_seed001_byte_exact_echo_trains_every_turn_in_one_sample(tmp_path, template):
    summary, turns, sessions = _run(tmp_path, "byte-exact", ["tree"], template=template)
    tree = summary["strategies"]["tree"]
    assert tree["samples"] == tree["sessions"]
    assert tree["trained_tokens"] == tree["generated_tokens"]
    for tool in ("Edit", "Write", "Bash"):
        trained, total = _trained_turns(turns, "tree", tool)
        assert total and trained == total


@pytest.mark.parametrize("template", ["qwen3", "qwen3.5"])
def test_seed001_claude_code_echo_loses_edit_write_and_only_the_cd_prefixed_bash(tmp_path, template):
    summary, turns, _ = _run(tmp_path, "claude-code", ["tree", "echo-restore"], template=template)
    edit_trained, edits = _trained_turns(turns, "tree", "Edit")
    write_trained, writes = _trained_turns(turns, "tree", "Write")
    bash_trained, bashes = _trained_turns(turns, "tree", "Bash", cd_prefixed=False)
    prefixed_trained, prefixed = _trained_turns(turns, "tree", "Bash", cd_prefixed=True)
    assert edits and edit_trained < edits
    assert writes and write_trained < writes
    assert bashes and bash_trained == bashes
    assert prefixed and prefixed_trained == 0
    assert summary["strategies"]["tree"]["samples"] == summary["strategies"]["tree"]["sessions"]
    # the fix recovers every Edit and Write turn; a removed prefix is outside its rules
    for tool in ("Edit", "Write"):
        assert _trained_turns(turns, "echo-restore", tool)[0] == _trained_turns(turns, "echo-restore", tool)[1]
    assert _trained_turns(turns, "echo-restore", "Bash", cd_prefixed=True)[0] == 0


APPEND_ONLY = ["byte-exact", "json-reserialize", "noncanonical-tokenization", "streaming"]


@pytest.mark.parametrize("behaviour", APPEND_ONLY)
def test_seed000_healing_collapses_append_only_sessions(tmp_path, behaviour):
    summary, _, sessions = _run(tmp_path, behaviour, ["tree", "linear"], params={"fork_threshold": 0})
    linear = sessions[sessions["strategy"] == "linear"].set_index("session_id")
    tree = sessions[sessions["strategy"] == "tree"].set_index("session_id")
    assert (linear["samples"] == 1).all()
    assert (linear["nonlinear"] == 0).all()
    assert (linear["trained_tokens"] == tree["trained_tokens"]).all()
    assert linear["forwarded_tokens"].sum() <= tree["forwarded_tokens"].sum()


@pytest.mark.parametrize("behaviour", ["retry", "history-edit"])
def test_seed000_retries_and_history_edits_do_not_collapse_and_count_nonlinear(tmp_path, behaviour):
    _, _, sessions = _run(tmp_path, behaviour, ["linear"], params={"fork_threshold": 0})
    assert (sessions["samples"] > 1).all()
    assert (sessions["nonlinear"] >= 1).all()


def test_seed001_four_configurations(tmp_path):
    """Byte-exact; rewritten echo under tree; echo recognised without restoring the prompt; restore
    before render. Only the last trains every Edit/Write turn; recognising without restoring still
    loses them (REALIGN zeroes the same span); Bash is trained throughout except where the client
    removed the `cd` prefix, which no configuration of the PR recovers."""
    exact, _, _ = _run(tmp_path, "byte-exact", ["tree"])
    rewritten, turns_tree, _ = _run(tmp_path, "claude-code", ["tree", "echo-restore"])
    routed, turns_routed, _ = _run(
        tmp_path / "routing-only", "claude-code", ["echo-restore"], params={"restore_prompt": False}
    )
    ideal = exact["strategies"]["tree"]
    assert ideal["trained_tokens"] == ideal["generated_tokens"]
    tree = rewritten["strategies"]["tree"]
    only_routing = routed["strategies"]["echo-restore"]
    restored = rewritten["strategies"]["echo-restore"]
    assert tree["coverage"] < restored["coverage"] and only_routing["coverage"] < restored["coverage"]
    assert restored["coverage_by_tool"]["Edit"] == restored["coverage_by_tool"]["Write"] == 1.0
    prefixed = int(turns_routed.loc[turns_routed["strategy"] == "echo-restore", "cd_prefixed"].sum())
    assert tree["counters"]["rewrite_merges"] > prefixed > 0
    assert only_routing["counters"]["rewrite_merges"] == prefixed  # only the echoes outside the PR's rules
    assert only_routing["counters"]["drift_realign"] > 0  # layer 2 now zeroes the turn instead
    for turns, name in ((turns_tree, "tree"), (turns_routed, "echo-restore")):
        assert _trained_turns(turns, name, "Edit")[0] < _trained_turns(turns, name, "Edit")[1]
        assert _trained_turns(turns, name, "Bash", False)[0] == _trained_turns(turns, name, "Bash", False)[1]
        assert _trained_turns(turns, name, "Bash", True) == (0, _trained_turns(turns, name, "Bash", True)[1])
