"""`trace-tools probe` with real harnesses, in a network namespace with loopback only.

The sandbox tests need root or unprivileged user namespaces. The Claude Code test needs Claude
Code installed as docs/probe.md says: outside CI it is skipped when absent (saying why); `.ci/run`
installs the pinned version and sets TRACE_TOOLS_REQUIRE_CLAUDE, which turns absence into a
failure; the other harnesses likewise through TRACE_TOOLS_REQUIRE_HARNESSES."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from trace_tools.probe.harnesses import HarnessNotInstalled, get_harness

SANDBOX = Path(__file__).resolve().parents[1] / "trace_tools" / "probe" / "sandbox.py"


def _namespaces_or_skip() -> None:
    if os.getuid() == 0:
        return
    probe = subprocess.run(["unshare", "--user", "--net", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("needs root or unprivileged user namespaces to make a network namespace")


def _installed_or_skip(name: str, required_by: str | None = None):
    try:
        return get_harness(name).locate()
    except HarnessNotInstalled as exc:
        if required_by and os.environ.get(required_by):
            pytest.fail(f"{required_by} is set but {exc}")
        pytest.skip(str(exc))


def _sandbox(plan: dict, tmp_path: Path) -> tuple[int, dict]:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    done = subprocess.run([sys.executable, "-I", str(SANDBOX), str(path)], capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads(Path(plan["report"]).read_text())


def _plan(tmp_path: Path, unix: Path, command: list[str]) -> dict:
    return {
        "mode": "netns",
        "port": 8642,
        "unix_socket": str(unix),
        "uid": None,
        "gid": None,
        "report": str(tmp_path / "isolation.json"),
        "commands": [
            {
                "key": "c",
                "argv": command,
                "env": {"PATH": "/usr/bin:/bin"},
                "cwd": str(tmp_path),
                "log": str(tmp_path / "c.log"),
                "timeout": 60,
            }
        ],
    }


def test_sandbox_isolates_the_command_and_reaches_only_the_recorder(tmp_path):
    _namespaces_or_skip()
    from trace_tools.record import open_recorder
    from trace_tools.record.script import Script, ScriptBook

    check = (
        "import socket, urllib.request; print(sorted(n for _, n in socket.if_nameindex()));"
        "print(urllib.request.urlopen('http://127.0.0.1:8642/health').read().decode())"
    )
    with open_recorder(tmp_path / "rec", script=ScriptBook({"*": Script("x", [])}), tcp=None, unix=tmp_path / "r.sock"):
        rc, report = _sandbox(_plan(tmp_path, tmp_path / "r.sock", ["/usr/bin/python3", "-c", check]), tmp_path)
    assert rc == 0 and report["isolated"], report
    assert {c["name"]: c["ok"] for c in report["checks"]} == {
        "interfaces": True,
        "connect IPv4 TEST-NET-1 192.0.2.1": True,
        "connect IPv6 documentation 2001:db8::1": True,
        "resolve registry.npmjs.org": True,
        "recorder via 127.0.0.1:8642": True,
    }
    assert "Network is unreachable" in report["checks"][1]["detail"]
    assert (tmp_path / "c.log").read_text().splitlines() == ["['lo']", '{"status": "ok"}']


def test_sandbox_refuses_to_start_the_harness_when_a_check_fails(tmp_path):
    _namespaces_or_skip()
    marker = tmp_path / "started"
    rc, report = _sandbox(_plan(tmp_path, tmp_path / "no-recorder.sock", ["/usr/bin/touch", str(marker)]), tmp_path)
    assert rc == 3 and not report["isolated"] and not report["sessions"]
    assert not marker.exists()
    assert any(c["name"].startswith("recorder") and not c["ok"] for c in report["checks"])


def test_probe_names_how_to_install_a_missing_harness_and_refuses_unknown_ones(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from trace_tools.cli.main import app

    monkeypatch.setenv("TRACE_TOOLS_HARNESS_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("TRACE_TOOLS_CLAUDE", raising=False)
    missing = CliRunner().invoke(app, ["probe", "claude-code", "--out", str(tmp_path / "p")])
    assert missing.exit_code == 2
    assert "npm install --prefix" in missing.output and "@anthropic-ai/claude-code@" in missing.output
    unknown = CliRunner().invoke(app, ["probe", "nope", "--out", str(tmp_path / "p")])
    assert unknown.exit_code == 2 and "claude-code" in unknown.output


@pytest.fixture(scope="module")
def claude_run():
    """Three scripted sessions through the real Claude Code CLI (the scenarios rotate file types
    and whitespace per session), replayed through every strategy."""
    _installed_or_skip("claude-code", "TRACE_TOOLS_REQUIRE_CLAUDE")
    _namespaces_or_skip()
    from trace_tools.probe import probe

    with _probe_dir("cc") as out:
        yield probe("claude-code", sessions=3, out=out, timeout_s=180), out


@contextmanager
def _probe_dir(name: str):
    # The harness runs as `nobody` when we are root: its folder must be outside private homes.
    base = Path("/tmp") if os.getuid() == 0 else Path(tempfile.mkdtemp())
    out = base / f"tt-probe-{name}-{os.getpid()}"
    try:
        yield out
    finally:
        subprocess.run(["rm", "-rf", str(out)], check=False)


@pytest.mark.harness
def test_real_claude_code_session_end_to_end_in_a_network_namespace(claude_run):
    """Scripted sessions through the real Claude Code CLI: its profile names what 2.1.x does."""
    result, out = claude_run
    assert result.isolation["isolated"] and all(c["ok"] for c in result.isolation["checks"])
    assert [s["rc"] for s in result.sessions] == [0, 0, 0, 0]  # the version check, then the sessions
    assert result.version.count(".") == 2
    kinds = {
        (t["kind"], t.get("tool"), t.get("argument"), t.get("key"), t.get("pattern"))
        for t in result.profile["transformations"]
    }
    assert ("strip_prefix", "Bash", "command", None, "cd {cwd} && ") in kinds
    assert ("add_key", "Edit", None, "replace_all", None) in kinds
    assert ("rstrip_lines", "Write", "content", None, None) in kinds
    assert ("kept_verbatim", "Edit", "old_string", None, None) in kinds
    write = next(t for t in result.profile["transformations"] if t["kind"] == "rstrip_lines" and t["tool"] == "Write")
    assert write["except_file_types"] == [".md"]  # session 0 writes NOTES.md, 1 and 2 .txt and .markdown
    assert result.summary["strategies"]["tree"]["coverage_by_tool"]["Edit"] == 0.0
    page = (out / "report.html").read_text()
    assert 'id="harness-profile"' in page and "prefix removed" in page
    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in requests} <= {"turn", "side", "count_tokens", "other"}


@pytest.mark.harness
def test_the_simulator_echoes_exactly_as_the_real_client(claude_run):
    """The same scenario replies through the simulator's claude-code echo (the shipped profile) and
    through a profile measured on this run: every echo the real client sent, field by field and in
    key order. The simulator's Anthropic form of each reply equals the recording's, ids aside."""
    from trace_tools.io.load import load
    from trace_tools.render.harness_echo import working_directory
    from trace_tools.simulate import playable_profile
    from trace_tools.simulate.behaviours import Echo
    from trace_tools.simulate.formats import wire_from_parsed

    result, out = claude_run
    shipped, measured = Echo(("claude-code",), random.Random(0)), playable_profile(str(out / "profile.json"))
    renderer = _renderer(out)
    compared = 0
    for session in load(out / "dump").sessions:
        shipped.cwd = working_directory(session.turns[0].messages)
        assert shipped.cwd and shipped.cwd.endswith("/repo")
        served = {}
        for turn in session.turns:
            for message in turn.messages:
                reply = served.get(_ids(message)) if message.get("role") == "assistant" else None
                if reply is not None:
                    assert _spelled(shipped(reply)) == _spelled(message)
                    assert _spelled(measured.echo(reply, shipped.cwd)) == _spelled(message)
                    compared += 1
            parsed = renderer.parse_response(turn.output_ids, turn.tools).message
            simulated = shipped.harness.served(wire_from_parsed(parsed, turn.tools, random.Random(0)))
            assert _without_ids(simulated) == _without_ids(turn.response)
            served[_ids(turn.response)] = turn.response
    assert compared >= 3 * 8


@pytest.mark.harness
def test_checkpoint_tree_trains_real_sessions_once_each(claude_run):
    """Append-only from the client's side: one sample per session, every token trained, about the
    forwarded tokens of one sample per session, and no echo taken for a genuine edit."""
    result, out = claude_run
    _assert_one_sample_per_session(result, out)
    turns = pd.read_parquet(out / "turns.parquet")
    assert "genuine_edit" not in set(turns["drift_cause"].dropna())
    assert {"command_prefix", "whitespace"} <= set(turns["drift_cause"].dropna())


@pytest.mark.harness
def test_checkpoint_tree_trains_sessions_whose_gateway_returned_reasoning_as_text():
    """The recorder sends each reply's reasoning as a text block: Claude Code echoes it as text."""
    _installed_or_skip("claude-code", "TRACE_TOOLS_REQUIRE_CLAUDE")
    _namespaces_or_skip()
    from trace_tools.probe import probe

    with _probe_dir("cc-text") as out:
        result = probe("claude-code", sessions=1, out=out, timeout_s=180, reasoning="text")
        moved = [t for t in result.profile["transformations"] if t.get("what") == "reasoning.moved_to_text"]
        assert moved and moved[0]["count"] == moved[0]["of"] and moved[0]["separator"] == ""
        _assert_one_sample_per_session(result, out)


def _assert_one_sample_per_session(result, out: Path) -> None:
    from trace_tools.io.load import load

    checkpoint = result.summary["strategies"]["checkpoint-tree"]
    sessions = load(out / "dump").sessions
    one_each = sum(len(s.turns[-1].prompt_ids) + len(s.turns[-1].output_ids) for s in sessions)
    assert checkpoint["samples"] == len(sessions) and checkpoint["coverage"] == 1.0
    assert checkpoint["forwarded_tokens"] <= 1.05 * one_each


def _renderer(out: Path):
    from trace_tools.io.load import load
    from trace_tools.render.renderer import Renderer

    return Renderer.from_spec(None, dump_meta=load(out / "dump").meta)


def _ids(message: dict | None) -> tuple:
    return tuple(call.get("id") for call in (message or {}).get("tool_calls") or ())


def _spelled(message: dict) -> str:
    return json.dumps(message, ensure_ascii=False)  # key order counts


def _without_ids(message: dict) -> str:
    calls = [{k: v for k, v in call.items() if k != "id"} for call in message.get("tool_calls") or ()]
    return _spelled({**message, "tool_calls": calls} if calls else message)


@pytest.mark.harness
def test_real_mini_swe_agent_session_end_to_end():
    _installed_or_skip("mini-swe-agent", _required("mini-swe-agent"))
    _namespaces_or_skip()
    from trace_tools.probe import probe

    with _probe_dir("mini") as out:
        result = probe("mini-swe-agent", sessions=1, out=out, timeout_s=180, replay=False)
        assert result.isolation["isolated"]
        assert result.profile["measured"]["calls"]["bash"] >= 7
        assert any(t["kind"] == "message" and t["what"] == "call_ids.kept" for t in result.profile["transformations"])


# -- Qwen Code, opencode, Codex, Gemini CLI ------------------------------------------------------------
# CI installs each from its record (.ci/run) and names the installed ones in TRACE_TOOLS_REQUIRE_HARNESSES,
# which turns a missing one into a failure. Sessions 0-2 play the base scenario, session 3 adds the
# extended classes (line ends, typed arguments, three parallel calls, another file type, tool search).


def _required(name: str) -> str | None:
    listed = os.environ.get("TRACE_TOOLS_REQUIRE_HARNESSES", "").split()
    return "TRACE_TOOLS_REQUIRE_HARNESSES" if name in listed else None


def _probe_one(name: str, sessions: int, **options):
    spec = get_harness(name)
    _installed_or_skip(name, _required(name))
    _namespaces_or_skip()
    from trace_tools.probe import probe

    with _probe_dir(name) as out:
        result = probe(name, sessions=sessions, out=out, timeout_s=240, **options)
        assert result.isolation["isolated"] and all(c["ok"] for c in result.isolation["checks"])
        assert [s["rc"] for s in result.sessions] == [0] * (sessions + 1), (out / "harness-logs").iterdir()
        assert result.version == spec.version
        assert json.loads((out / "profile.json").read_text())["harness"] == {
            "name": name,
            "version": spec.version,
            "protocol": spec.protocol,
        }
        yield result, out


@pytest.fixture(scope="module")
def qwen_run():
    """Session 0 (base scenario) and session 3's extended classes through the real Qwen Code CLI."""
    yield from _probe_one("qwen-code", 4, replay=False)


@pytest.mark.harness
def test_real_qwen_code_sessions_end_to_end_in_a_network_namespace(qwen_run):
    result, out = qwen_run
    calls = result.profile["measured"]["calls"]
    assert {"edit", "write_file", "read_file", "run_shell_command"} <= set(calls)
    assert calls["write_file"] >= 4 * 2 + 2  # test + note per session, the extra file and line ends in s03
    assert calls.get("tool_search") == 1  # the tool-list change class, offered by Qwen Code
    removed = [t for t in result.profile["transformations"] if t.get("what") == "call_key_removed.index"]
    assert removed and removed[0]["count"] == removed[0]["of"]  # the streaming `index` key is not echoed
    assert "history" in result.profile and "side_requests" in result.profile["measured"]


@pytest.mark.harness
def test_profile_of_the_qwen_code_recording_is_the_probes_own(qwen_run):
    """`trace-tools profile` on the run directory (its `record` dump and request log) derives the
    profile `probe qwen-code` measured: same harness, same rewrites with the same counts."""
    from trace_tools.probe.profile import profile_recording

    result, out = qwen_run
    derived = profile_recording(out)
    assert derived["harness"]["name"] == "qwen-code" and derived["harness"]["version"] == result.version
    assert derived["transformations"] == result.profile["transformations"]
    assert derived["measured"]["echoes"] == result.profile["measured"]["echoes"]


@pytest.mark.harness
def test_no_qwen_code_side_request_is_recorded_as_a_turn(qwen_run):
    from trace_tools.io.load import load
    from trace_tools.record.side_requests import side_request_kind

    result, out = qwen_run
    for session in load(out / "dump").sessions:
        assert all(side_request_kind(turn.messages) is None for turn in session.turns)
        assert session.turns[0].tools  # every recorded turn offered the agent's tools


@pytest.mark.harness
def test_real_opencode_session_logs_its_title_request_as_a_side_request():
    for result, out in _probe_one("opencode", 1, replay=False):
        assert result.profile["measured"]["side_requests"] == {"title": 1}
        assert result.profile["measured"]["calls"].get("edit", 0) >= 2


@pytest.mark.harness
@pytest.mark.parametrize("name", ["codex", "gemini-cli"])
def test_real_codex_and_gemini_cli_sessions_write_a_profile(name):
    """Runs once the recorder serves their APIs; each writes a profile from its file-tool or shell scenario."""
    for result, _ in _probe_one(name, 1, replay=False):
        assert result.profile["measured"]["echoes"] >= 5
        assert sum(result.profile["measured"]["calls"].values()) >= 7
