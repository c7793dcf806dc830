"""The probe's side-request policy (declined), history events, scenario library and harness records, without a harness.

Side requests go through the real recorder (an OpenAI client posting the client's own prompt
text); history events are computed on turns the recorder wrote; the scenarios are built from the
tool schemas real harnesses offered (Claude Code, Qwen Code 0.24.4, opencode 1.18.33)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import openai
import pytest

from trace_tools.probe.harnesses import HARNESSES, Launch
from trace_tools.probe.history import first_differing_token, history_events
from trace_tools.probe.run import _write_config_files
from trace_tools.probe.scenarios import (
    EXTENDED_FROM,
    build_scenario,
    extra_file,
    line_end_text,
    make_workspace,
)
from trace_tools.record import make_renderer
from trace_tools.record.model import ScriptedModel
from trace_tools.record.script import Script, ScriptCall, ScriptTurn
from trace_tools.record.server import Recorder, RecorderThread
from trace_tools.record.side_requests import side_request_counts, side_request_kind


def _tool(name: str, *arguments: str) -> dict:
    properties = {argument: {"type": "string"} for argument in arguments}
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


QWEN_TOOLS = [
    _tool("read_file", "file_path", "offset", "limit", "pages"),
    _tool("edit", "file_path", "old_string", "new_string", "replace_all"),
    _tool("write_file", "file_path", "content", "record_as_artifact"),
    _tool("run_shell_command", "command", "is_background", "timeout", "description", "directory"),
    _tool("grep_search", "pattern", "glob", "path", "limit"),
    _tool("tool_search", "query", "max_results"),
]
OPENCODE_TOOLS = [
    _tool("bash", "command", "timeout", "workdir"),
    _tool("edit", "filePath", "oldString", "newString", "replaceAll"),
    _tool("read", "filePath", "offset", "limit"),
    _tool("write", "content", "filePath"),
    _tool("grep", "pattern", "path", "include"),
]
CLAUDE_TOOLS = [
    _tool("Read", "file_path", "offset", "limit"),
    _tool("Edit", "file_path", "old_string", "new_string", "replace_all"),
    _tool("Write", "file_path", "content"),
    _tool("Bash", "command", "description", "timeout"),
    _tool("Grep", "pattern", "path", "output_mode"),
]


# -- side requests ------------------------------------------------------------------------------------


def _script(session: str, tools: list[dict] | None) -> Script:
    return Script("one-call", [ScriptTurn("", "", (ScriptCall("bash", {"command": "ls"}),))], ScriptTurn(content="ok"))


@pytest.fixture()
def side_recorder(tmp_path):
    renderer = make_renderer("qwen3")
    recorder = Recorder(tmp_path / "rec", renderer, ScriptedModel(renderer, _script), side_requests="decline")
    with RecorderThread(recorder, tcp=("127.0.0.1", 0)) as thread:
        yield thread, tmp_path


def test_side_requests_are_logged_and_declined_and_the_session_keeps_its_script(side_recorder):
    thread, tmp_path = side_recorder
    client = openai.OpenAI(base_url=thread.url + "/s/s00/v1", api_key="dummy", max_retries=0)
    title = [
        {"role": "system", "content": "You are a title generator. You output ONLY a thread title. Nothing else."},
        {"role": "user", "content": "fix mean()"},
    ]
    with pytest.raises(openai.BadRequestError, match="side request \\(title\\)"):
        client.chat.completions.create(model="m", messages=title)
    check = [
        {"role": "user", "content": "fix mean()"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Based strictly on that response, determine who should logically speak next"},
    ]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=check)
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "fix mean()"}], tools=[_tool("bash", "command")]
    )
    assert reply.choices[0].message.tool_calls[0].function.name == "bash"  # the script, not a no-tools fallback
    assert side_request_counts(tmp_path / "rec" / "requests.jsonl") == {"next_speaker": 1, "title": 1}
    turns = list((tmp_path / "rec" / "dump").rglob("*.parquet"))
    assert len(turns) == 1  # only the real turn was recorded


def test_side_request_markers_match_the_clients_own_prompts_and_nothing_else():
    memory = "You are now acting as the managed memory extraction subagent for an AI coding assistant."
    assert side_request_kind([{"role": "system", "content": memory}]).kind == "memory_extraction"
    parts = [{"type": "text", "text": "You are reviewing this conversation to extract reusable skills."}]
    assert side_request_kind([{"role": "system", "content": parts}]).kind == "skill_review"
    ordinary = [{"role": "system", "content": "You are Qwen Code."}, {"role": "user", "content": "Write a title"}]
    assert side_request_kind(ordinary) is None


# -- history events -----------------------------------------------------------------------------------


def _record(tmp_path: Path, requests: list[dict]) -> Path:
    """Post each request of one session to a real recorder; returns its dump."""
    renderer = make_renderer("qwen3")
    script = Script("text", [], ScriptTurn(content="ok"))
    recorder = Recorder(tmp_path / "rec", renderer, ScriptedModel(renderer, lambda s, t: script))
    with RecorderThread(recorder, tcp=("127.0.0.1", 0)) as thread:
        client = openai.OpenAI(base_url=thread.url + "/s/h/v1", api_key="dummy", max_retries=0)
        for request in requests:
            client.chat.completions.create(model="m", **request)
    return tmp_path / "rec" / "dump"


def test_history_events_name_volatile_lines_tool_changes_reminders_and_compaction(tmp_path):
    def system(cch: str) -> dict:
        return {"role": "system", "content": f"x-anthropic-billing-header: cc_version=2.1.332; cch={cch};\nYou help."}

    task, ok = {"role": "user", "content": "fix mean()"}, {"role": "assistant", "content": "ok"}
    reminder = {"role": "user", "content": "<system-reminder>Todo list is empty.</system-reminder> go on"}
    tools = [_tool("bash", "command")]
    dump = _record(
        tmp_path,
        [
            {"messages": [system("a1"), task], "tools": tools},
            {"messages": [system("b2"), task, ok, reminder], "tools": tools},  # volatile line + reminder
            {"messages": [system("b2"), task, ok, reminder, ok, task], "tools": [*tools, _tool("cron", "when")]},
            {"messages": [system("b2"), {"role": "user", "content": "Summary: fixed."}], "tools": tools},
        ],
    )
    found = history_events(dump)
    kinds = [(e["turn"], e["kind"], e["append_safe"]) for e in found["events"]]
    assert kinds == [
        (1, "volatile_system_line", False),
        (1, "injected_reminder", True),
        (2, "tool_list_changed", False),  # qwen3 renders the tools in the system prompt: breaking
        (3, "tool_list_changed", False),
        (3, "compaction", False),
    ]
    volatile = found["events"][0]
    assert volatile["key"] == "x-anthropic-billing-header" and "cch=a1" in volatile["before"]
    assert 0 < volatile["first_differing_token"] < 30  # inside the first line of the system prompt
    assert found["events"][2]["added"] == ["cron"]
    assert found["counts"]["tool_list_changed"] == {"append_safe": 0, "breaking": 2}


def test_first_differing_token():
    assert first_differing_token([1, 2, 3], [1, 2, 3, 4]) is None
    assert first_differing_token([1, 2, 3], [1, 9, 3, 4]) == 1
    assert first_differing_token([1, 2, 3], [1, 2]) == 2


# -- scenarios ----------------------------------------------------------------------------------------


def _calls(script: Script) -> list[ScriptCall]:
    return [call for turn in script.turns for call in turn.calls]


@pytest.mark.parametrize(
    ("tools", "path", "edit"),
    [(CLAUDE_TOOLS, "file_path", "Edit"), (QWEN_TOOLS, "file_path", "edit"), (OPENCODE_TOOLS, "filePath", "edit")],
)
def test_the_file_scenario_speaks_each_harnesss_own_tool_and_argument_names(tmp_path, tools, path, edit):
    offered = {t["function"]["name"]: set(t["function"]["parameters"]["properties"]) for t in tools}
    for index in (0, EXTENDED_FROM):
        script = build_scenario(make_workspace(tmp_path / f"r{index}", index), tools)
        assert script.name.startswith("swe-files-")
        for call in _calls(script):
            assert set(call.arguments) <= offered[call.name], call  # only arguments the schema has
        assert any(call.name == edit and path in call.arguments for call in _calls(script))


def test_codex_exec_command_plays_the_shell_scenario_with_its_cmd_argument(tmp_path):
    """Codex CLI 0.171 offers `exec_command(cmd, ...)` and no file tools (its probe answered 'no usable tools')."""
    codex = [
        {"type": "function", "function": {"name": name, "parameters": {"properties": {arg: {}, "workdir": {}}}}}
        for name, arg in (("exec_command", "cmd"), ("write_stdin", "chars"))
    ]
    script = build_scenario(make_workspace(tmp_path / "r", 0), codex)
    assert script.name == "swe-shell-00" and len(_calls(script)) >= 7
    assert all(call.name == "exec_command" and set(call.arguments) == {"cmd"} for call in _calls(script))


def test_extended_sessions_cover_every_new_class(tmp_path):
    names, texts = set(), []
    for index in range(EXTENDED_FROM, EXTENDED_FROM + 5):
        ws = make_workspace(tmp_path / f"r{index}", index)
        script = build_scenario(ws, QWEN_TOOLS)
        calls = _calls(script)
        names.add(extra_file(ws)[0])
        texts.append(line_end_text(ws))
        assert any(len(turn.calls) == 3 for turn in script.turns)  # parallel calls
        assert {"timeout": "60000"}.items() <= next(c for c in calls if "timeout" in c.arguments).arguments.items()
        assert next(c for c in calls if "replace_all" in c.arguments and c.name == "edit").arguments["replace_all"] in (
            "false",
            False,
        )
        assert any(call.name == "tool_search" for call in calls)  # a tool-list change
    assert names == {"app.js", "config.yaml", "page.mdx", "GUIDE.MD", "Makefile"}
    makefile = extra_file(make_workspace(tmp_path / "mk", EXTENDED_FROM + 1))
    assert makefile[0] == "Makefile" and "\n\tpython3" in makefile[1]
    assert all("\r\n" in text and "\r" in text.replace("\r\n", "") for text in texts)  # CRLF and lone CR
    base = build_scenario(make_workspace(tmp_path / "base", 0), QWEN_TOOLS)
    assert not any(call.name == "tool_search" for call in _calls(base))  # sessions 0-2 stay the base scenario


# -- records ------------------------------------------------------------------------------------------


def test_settings_files_parse_and_carry_the_quiet_switches(tmp_path):
    launch = Launch("task", "http://127.0.0.1:8642/s/s00", tmp_path / "home", tmp_path)
    for name in ("codex", "gemini-cli"):
        _write_config_files(HARNESSES[name], launch)
    codex = tomllib.loads((tmp_path / "home" / ".codex" / "config.toml").read_text())
    assert codex == {
        "check_for_update_on_startup": False,
        "analytics": {"enabled": False},
        "feedback": {"enabled": False},
        "otel": {"exporter": "none"},
    }
    gemini = json.loads((tmp_path / "home" / ".gemini" / "settings.json").read_text())
    assert gemini["privacy"]["usageStatisticsEnabled"] is False and gemini["general"]["enableAutoUpdate"] is False
    opencode = json.loads(HARNESSES["opencode"].environment(launch)["OPENCODE_CONFIG_CONTENT"])
    assert opencode["provider"]["tracetools"]["options"]["baseURL"] == launch.base_url + "/v1"
    assert opencode["autoupdate"] is False and opencode["share"] == "disabled"


def test_claude_code_sessions_alternate_the_attribution_header():
    claude = HARNESSES["claude-code"]
    assert [dict(claude.variant(i)) for i in range(3)] == [{}, {"CLAUDE_CODE_ATTRIBUTION_HEADER": "0"}, {}]
