"""`trace-tools profile`: a harness profile from any recording (a `record` dump with its request
log, a probe run directory), with counts within their totals, the working directory the session
states, the harness named by the recording; and `--harness-profile auto` choosing a shipped one."""

from __future__ import annotations

import copy
import json

import pyarrow.parquet as pq
from typer.testing import CliRunner

from checkpoint_fakes import Harness, tool, user
from trace_tools.cli.main import app
from trace_tools.data import DumpMeta
from trace_tools.io.write import sessions_to_table
from trace_tools.probe.profile import profile_recording
from trace_tools.render.harness_identity import from_label, from_user_agent, resolve_auto_profile

CWD = "/w/repo"
BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "parameters": {"properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}},
    },
}
WRITE = {
    "type": "function",
    "function": {"name": "Write", "parameters": {"properties": {"file_path": {}, "content": {}}}},
}


def served(n: int, name: str, arguments: dict, content: str = "") -> dict:
    call = {
        "id": f"c{n}",
        "index": 0,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return {"role": "assistant", "content": content, "tool_calls": [call]}


def qwen_echo(reply: dict) -> dict:
    """Qwen Code's echo as the issue states it: compact arguments, no `index`, a `reasoning` key."""
    out = copy.deepcopy(reply)
    for call in out["tool_calls"]:
        call.pop("index")
        call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), separators=(",", ":"))
    out["reasoning"] = None
    out["content"] = out["content"] or None  # an empty text comes back as null
    return out


def claude_echo(reply: dict) -> dict:
    """Claude Code's: arguments an object, typed per schema, Bash keys in schema order, CRLF kept."""
    out = copy.deepcopy(reply)
    function = out["tool_calls"][0]["function"]
    arguments = json.loads(function["arguments"])
    if function["name"] == "Bash":
        arguments = {
            "command": arguments["command"].removeprefix(f"cd {CWD} && "),
            "timeout": int(arguments["timeout"]),
        }
    else:
        arguments["content"] = arguments["content"].replace(" \r\n", "\r\n").replace("  \r", "\r")
    function["arguments"] = arguments
    return out


def recording(tmp_path, announce: str, echo, steps, harness_label: str, protocol: str):
    h = Harness("s00")
    history = [{"role": "system", "content": f"You are an agent.\n{announce}"}, user("Fix it.")]
    for n, (name, arguments, content) in enumerate(steps):
        reply = served(n, name, arguments, content)
        h.call(history, reply, tools=[BASH, WRITE])
        history += [echo(reply), tool("ok", call_id=f"c{n}")]
    h.call(history, {"role": "assistant", "content": "Done."}, tools=[BASH, WRITE])
    session = h.session()
    for turn in session.turns:
        turn.metadata = {"protocol": protocol}
    dump = tmp_path / "dump"
    dump.mkdir(parents=True)
    meta = DumpMeta(schema_version="1", history_mode="tree", harness=harness_label)
    pq.write_table(sessions_to_table([session], meta), dump / "part-0.parquet")
    return tmp_path


QWEN_STEPS = [
    ("Bash", {"command": "ls", "timeout": 5}, ""),
    ("Write", {"file_path": f"{CWD}/a.py", "content": "x = 1\n"}, "Writing."),
    ("Bash", {"command": "make test", "timeout": 60}, ""),
]
CLAUDE_STEPS = [
    ("Bash", {"timeout": "60000", "command": f"cd {CWD} && make test"}, ""),
    ("Write", {"file_path": f"{CWD}/a.py", "content": "x = 1 \r\ny = 2  \rz = 3\n"}, ""),
]


def counts_within_totals(profile: dict) -> None:
    for entry in profile["transformations"]:
        if entry.get("of") is not None:
            assert 0 < entry["count"] <= entry["of"], entry


def test_a_record_dump_with_its_request_log_gives_the_harness_its_counts_and_cwd(tmp_path):
    run = recording(
        tmp_path,
        f"I'm currently working in the directory: {CWD}",
        qwen_echo,
        QWEN_STEPS,
        "trace-tools record",
        "openai",
    )
    headers = {"User-Agent": "QwenCode/0.0.14 (linux; x64)", "Content-Type": "application/json"}
    (run / "requests.jsonl").write_text(json.dumps({"path": "/v1/chat/completions", "headers": headers}) + "\n")
    profile = profile_recording(run)
    assert profile["harness"] == {"name": "qwen-code", "version": "0.0.14", "protocol": "openai"}
    assert profile["measured"]["working_directories"] == 1 and profile["measured"]["harness_from"] == "request_log"
    counts_within_totals(profile)
    found = {(t["kind"], t.get("what")) for t in profile["transformations"]}
    assert {
        ("message", "call_key_removed.index"),
        ("message", "message_key_added.reasoning"),
        ("message", "text.empty_representation_changed"),
        ("arguments_reserialized", None),
    } <= found
    changed = next(t for t in profile["transformations"] if t.get("what") == "text.empty_representation_changed")
    assert (changed["count"], changed["of"]) == (2, 3)  # two replies served without text, of three echoes


def test_a_probe_run_directory_gives_the_typed_line_end_and_order_rules(tmp_path):
    run = recording(tmp_path, f"Working directory: {CWD}", claude_echo, CLAUDE_STEPS, "claude-code", "anthropic")
    (run / "harness-logs").mkdir()
    (run / "harness-logs" / "version.log").write_text("2.1.332 (Claude Code)\n")
    profile = profile_recording(run)
    assert profile["harness"] == {"name": "claude-code", "version": "2.1.332", "protocol": "anthropic"}
    counts_within_totals(profile)
    kinds = {(t["kind"], t.get("tool"), t.get("argument")) for t in profile["transformations"]}
    assert {("coerce_types", "Bash", "timeout"), ("strip_prefix", "Bash", "command")} <= kinds
    strip = next(t for t in profile["transformations"] if t["kind"] == "rstrip_lines")
    assert strip["line_ends"] == "crlf-cr"
    order = next(t for t in profile["transformations"] if t["kind"] == "key_order")
    assert "schema_order" in order["rules"]


def test_the_profile_command_writes_the_profile_and_names_a_missing_recording(tmp_path):
    run = recording(
        tmp_path / "run", f"Working directory: {CWD}", claude_echo, CLAUDE_STEPS, "claude-code 2.1.332", "anthropic"
    )
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(app, ["profile", str(run), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert written["harness"]["version"] == "2.1.332" and json.loads(result.output) == written
    missing = CliRunner().invoke(app, ["profile", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "no recording at" in missing.output


def test_harness_names_from_labels_and_user_agents():
    assert from_label("claude-code 2.1.332").version == "2.1.332"
    assert from_label("claude-code@2.1.332").name == "claude-code"
    assert from_label("trace-tools record") is None
    assert from_user_agent("claude-cli/2.1.332 (external, cli)").label == "claude-code 2.1.332"
    assert from_user_agent("python-requests/2.31") is None


def test_auto_picks_the_shipped_profile_of_the_recorded_version_and_notes_when_none_fits(tmp_path):
    params: dict = {}
    assert resolve_auto_profile(params, "claude-code 2.1.332", tmp_path) is None
    assert params == {"harness_profile": "claude-code-2.1.332"}
    params = {}
    note = resolve_auto_profile(params, "claude-code 2.1.400", tmp_path)
    assert params == {} and "no shipped profile measures claude-code 2.1.400 (shipped: claude-code-2.1.332)" in note
    assert "\n" not in note
    unnamed: dict = {}
    assert resolve_auto_profile(unnamed, "trace-tools simulate", tmp_path) is None and unnamed == {}
    chosen = {"harness_profile": "none"}
    assert resolve_auto_profile(chosen, "qwen-code 1.0", tmp_path) is None and chosen == {"harness_profile": "none"}
    (tmp_path / "dump").mkdir()
    agent = {"headers": {"user-agent": "claude-cli/2.1.332 (external, cli)"}}
    (tmp_path / "requests.jsonl").write_text(json.dumps(agent) + "\n")
    params = {}
    assert resolve_auto_profile(params, "claude-code", tmp_path / "dump") is None
    assert params == {"harness_profile": "claude-code-2.1.332"}


def test_replay_applies_auto_to_the_recorded_harness_and_notes_an_unmeasured_version(tmp_path):
    import trace_tools as tt

    tt.simulate(sessions=1, seed=1, template="qwen3", max_turns=3, out=str(tmp_path / "sim.parquet"))
    table = pq.read_table(tmp_path / "sim.parquet")
    options = {}
    for label in ("claude-code 2.1.400", "claude-code 2.1.332"):
        metadata = {**table.schema.metadata, b"trace_tools.harness": label.encode()}
        pq.write_table(table.replace_schema_metadata(metadata), tmp_path / "labelled.parquet")
        out = tmp_path / label.replace(" ", "-")
        result = tt.replay(tmp_path / "labelled.parquet", out=out, strategies=["checkpoint-tree"], workers=1)
        options[label] = (result.notes, json.loads((out / "run.json").read_text())["options"]["params"])
    (notes, params) = options["claude-code 2.1.400"]
    assert params == {} and len(notes) == 1 and "no shipped profile measures claude-code 2.1.400" in notes[0]
    assert options["claude-code 2.1.332"] == ([], {"harness_profile": "claude-code-2.1.332"})
