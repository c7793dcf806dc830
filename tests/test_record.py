"""`trace-tools record`: the recording gateway against the real `anthropic` and `openai` client
libraries (JSON and streamed replies), an upstream token-in/token-out engine, and a SIGKILLed
recorder whose finished turns must stay a valid dump."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anthropic  # the official clients (the test extra has them)
import openai
import pyarrow.parquet as pq
import pytest

from io_support import free_port
from trace_tools.record import make_renderer, open_recorder
from trace_tools.record.anthropic import fold_mid_list_system, request_messages
from trace_tools.record.script import Script, ScriptBook, ScriptCall, ScriptTurn
from trace_tools.render.canonical import canonicalize_messages

EDIT_ARGS = {"file_path": "/repo/a.py", "old_string": "x = 1  \n", "new_string": "x = 2\t\n"}
SCRIPT = Script(
    "t",
    [
        ScriptTurn(
            "Look, then edit.",
            "Editing a.py.",
            (ScriptCall("Edit", EDIT_ARGS), ScriptCall("Bash", {"command": "cd /repo && ls", "description": "List"})),
        ),
        ScriptTurn("", "All done."),
    ],
)
ANTHROPIC_TOOLS = [
    {
        "name": "Edit",
        "description": "Edit a file",
        "input_schema": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
            },
            "required": ["file_path", "old_string", "new_string"],
        },
    },
    {
        "name": "Bash",
        "description": "Run a command",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        },
    },
]
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
    }
    for t in ANTHROPIC_TOOLS
]


@pytest.fixture(scope="module")
def renderer():
    return make_renderer("qwen3")


@pytest.fixture()
def recorder(tmp_path):
    with open_recorder(tmp_path / "rec", script=ScriptBook({"*": SCRIPT})) as running:
        yield running


def _rows(out: Path) -> list:
    from trace_tools.io.load import load

    loaded = load(out / "dump")
    assert not loaded.quarantine
    return [turn for session in loaded.sessions for turn in session.turns]


def _wait_rows(out: Path, count: int) -> list:
    """The turn is on disk before its reply completes; a bounded wait keeps these tests independent of that."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if len(list((out / "dump").rglob("*.parquet"))) >= count:
            return _rows(out)
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} turns recorded")


def test_anthropic_json_reply_is_the_parsed_generation_and_the_row_is_faithful(recorder, renderer, tmp_path):
    client = anthropic.Anthropic(base_url=recorder.url + "/s/a1", api_key="dummy", max_retries=0)
    message = client.messages.create(
        model="m",
        max_tokens=4096,
        system="You edit code.",
        tools=ANTHROPIC_TOOLS,
        messages=[{"role": "user", "content": "fix it"}],
    )
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert message.stop_reason == "tool_use"
    assert message.content[0].thinking == "Look, then edit." and message.content[0].signature
    edit = message.content[2]
    assert edit.name == "Edit" and edit.input == EDIT_ARGS and list(edit.input) == list(EDIT_ARGS)
    (row,) = _wait_rows(tmp_path / "rec", 1)
    # The generation is the model's own text, tokenized: qwen3's reasoning block, text, JSON calls.
    text = renderer.decode(row.output_ids)
    assert text.startswith('<think>\nLook, then edit.\n</think>\n\nEditing a.py.\n<tool_call>\n{"name": "Edit"')
    assert text.endswith("</tool_call><|im_end|>")
    assert row.prompt_ids == renderer.render(canonicalize_messages(row.messages), row.tools, True)
    assert row.messages == [{"role": "system", "content": "You edit code."}, {"role": "user", "content": "fix it"}]
    assert row.response["tool_calls"][0]["id"] == edit.id
    assert row.finish_reason == "tool_calls" and row.session_id == "a1"
    assert message.usage.input_tokens == len(row.prompt_ids) and message.usage.output_tokens == len(row.output_ids)


def test_anthropic_stream_sends_the_real_event_sequence_and_the_echo_is_recorded(recorder, tmp_path):
    client = anthropic.Anthropic(base_url=recorder.url + "/s/a2", api_key="dummy", max_retries=0)
    first = client.messages.create(
        model="m", max_tokens=4096, tools=ANTHROPIC_TOOLS, messages=[{"role": "user", "content": "go"}]
    )
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
                for b in first.content
                if b.type == "tool_use"
            ],
        },
    ]
    with client.messages.stream(model="m", max_tokens=4096, tools=ANTHROPIC_TOOLS, messages=history) as stream:
        events = [event.type for event in stream if event.type in _RAW_EVENTS]
        final = stream.get_final_message()
    assert events == list(_RAW_EVENTS)  # one text block: each event once, in this order
    assert final.stop_reason == "end_turn" and final.content[0].text == "All done."
    rows = _wait_rows(tmp_path / "rec", 2)
    echo = rows[1].messages[1]
    assert echo["role"] == "assistant" and echo["reasoning_content"] == "Look, then edit."
    assert [c["id"] for c in echo["tool_calls"]] == [c["id"] for c in rows[0].response["tool_calls"]]
    assert [m["role"] for m in rows[1].messages] == ["user", "assistant", "tool", "tool"]
    assert rows[1].metadata["stream"] is True and rows[1].metadata["script_turn"] == 1


_RAW_EVENTS = (
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
)


def test_anthropic_stream_of_a_tool_turn_reassembles_thinking_text_and_input_json(recorder):
    client = anthropic.Anthropic(base_url=recorder.url + "/s/a3", api_key="dummy", max_retries=0)
    with client.messages.stream(
        model="m", max_tokens=4096, tools=ANTHROPIC_TOOLS, messages=[{"role": "user", "content": "go"}]
    ) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"} <= set(deltas)
    assert final.content[0].signature and final.content[2].input == EDIT_ARGS


def test_count_tokens_counts_the_rendered_prompt(recorder, renderer):
    client = anthropic.Anthropic(base_url=recorder.url, api_key="dummy", max_retries=0)
    counted = client.messages.count_tokens(
        model="m", tools=ANTHROPIC_TOOLS, messages=[{"role": "user", "content": "go"}]
    )
    expected = renderer.render(
        [{"role": "user", "content": "go"}],
        [
            {
                "type": "function",
                "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
            }
            for t in ANTHROPIC_TOOLS
        ],
        True,
    )
    assert counted.input_tokens == len(expected)


def test_title_side_request_is_answered_and_logged_not_recorded(recorder, tmp_path):
    client = anthropic.Anthropic(base_url=recorder.url + "/s/t", api_key="dummy", max_retries=0)
    reply = client.messages.create(
        model="m",
        max_tokens=50,
        system="Generate a concise, sentence-case title for this conversation.",
        messages=[{"role": "user", "content": "hi"}],
    )
    assert reply.content[0].text
    from trace_tools.record.sink import read_requests

    entries = read_requests(tmp_path / "rec" / "requests.jsonl")
    assert [(e["kind"], e["side_request"]) for e in entries] == [("side", "title")]
    assert not list((tmp_path / "rec" / "dump").rglob("*.parquet"))


def test_openai_json_and_stream_carry_tool_calls(recorder, tmp_path):
    client = openai.OpenAI(base_url=recorder.url + "/s/o1/v1", api_key="dummy", max_retries=0)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}], tools=OPENAI_TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [json.loads(c.function.arguments) for c in choice.message.tool_calls] == [
        EDIT_ARGS,
        {"command": "cd /repo && ls", "description": "List"},
    ]
    stream = openai.OpenAI(base_url=recorder.url + "/s/o2/v1", api_key="dummy", max_retries=0).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "go"}],
        tools=OPENAI_TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    calls: dict[int, dict] = {}
    content, finish, usage = "", None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice_delta in chunk.choices:
            content += choice_delta.delta.content or ""
            finish = choice_delta.finish_reason or finish
            for call in choice_delta.delta.tool_calls or ():
                entry = calls.setdefault(call.index, {"id": call.id, "arguments": ""})
                entry["arguments"] += call.function.arguments or ""
    assert finish == "tool_calls" and content == "Editing a.py."
    assert json.loads(calls[0]["arguments"]) == EDIT_ARGS and calls[0]["id"].startswith("call_")
    rows = _wait_rows(tmp_path / "rec", 2)
    assert usage.completion_tokens == len(next(r for r in rows if r.session_id == "o2").output_ids)
    assert {r.session_id for r in rows} == {"o1", "o2"}
    assert all(r.metadata["protocol"] == "openai" for r in rows)


def test_reasoning_as_text_goes_to_the_client_as_text_and_the_row_keeps_the_parse(tmp_path):
    """A gateway that cannot return thinking blocks (`--reasoning text`): an Anthropic text block in
    place of the thinking block, OpenAI content; the dump's response is the parse, reasoning apart."""
    with open_recorder(tmp_path / "rec", script=ScriptBook({"*": SCRIPT}), reasoning="text") as running:
        client = anthropic.Anthropic(base_url=running.url + "/s/t1", api_key="dummy", max_retries=0)
        message = client.messages.create(
            model="m", max_tokens=4096, tools=ANTHROPIC_TOOLS, messages=[{"role": "user", "content": "go"}]
        )
        chat = openai.OpenAI(base_url=running.url + "/s/t2/v1", api_key="dummy", max_retries=0).chat
        reply = chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}], tools=OPENAI_TOOLS)
        rows = _wait_rows(tmp_path / "rec", 2)
    assert [(b.type, getattr(b, "text", None)) for b in message.content[:2]] == [
        ("text", "Look, then edit."),
        ("text", "Editing a.py."),
    ]
    assert reply.choices[0].message.content == "Look, then edit.\n\nEditing a.py."
    for row in rows:
        assert row.response["reasoning_content"] == "Look, then edit." and row.response["content"] == "Editing a.py."
    schema = pq.read_schema(next((tmp_path / "rec" / "dump").rglob("*.parquet")))
    assert json.loads(schema.metadata[b"trace_tools.recorder"])["reasoning"] == "text"


def test_mid_list_system_messages_fold_into_the_user_message_before_them():
    body = {
        "system": [{"type": "text", "text": "S"}],
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "system", "content": "reminder"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        ],
    }
    assert (
        fold_mid_list_system(body["messages"])[0]["content"][-1]["text"]
        == "<system-reminder>\nreminder\n</system-reminder>\n"
    )
    assert request_messages(body) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hello"},
        {"role": "user", "content": "<system-reminder>\nreminder\n</system-reminder>\n"},
        {"role": "assistant", "content": "hi"},
    ]


# -- upstream: a token-in/token-out engine ------------------------------------------------------
class _Engine:
    """A small SGLang-shaped `/generate` server: answers every prompt with fixed token ids."""

    def __init__(self, output_ids: list[int]):
        from aiohttp import web

        self.output_ids, self.prompts = output_ids, []
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        self._runner = web.AppRunner(app)
        self.loop = __import__("asyncio").new_event_loop()
        self.port = free_port()
        ready = threading.Event()

        def main():
            self.loop.run_until_complete(self._runner.setup())
            self.loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            ready.set()
            self.loop.run_forever()

        threading.Thread(target=main, daemon=True).start()
        ready.wait(10)

    async def _generate(self, request):
        from aiohttp import web

        body = await request.json()
        self.prompts.append(body)
        pairs = [[-0.25, token, None] for token in self.output_ids]
        meta = {"finish_reason": {"type": "stop"}, "output_token_logprobs": pairs}
        return web.json_response({"text": "", "output_ids": self.output_ids, "meta_info": meta})

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_upstream_engine_generates_the_ids_the_dump_records(renderer, tmp_path):
    text = (
        '<think>\nok\n</think>\n\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
    )
    engine = _Engine(renderer.encode(text))
    try:
        with open_recorder(tmp_path / "rec", upstream=f"http://127.0.0.1:{engine.port}") as running:
            client = openai.OpenAI(base_url=running.url + "/s/u/v1", api_key="dummy", max_retries=0)
            reply = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "go"}], tools=OPENAI_TOOLS, max_tokens=64
            )
            (row,) = _wait_rows(tmp_path / "rec", 1)
    finally:
        engine.stop()
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "Bash" and json.loads(call.function.arguments) == {"command": "ls"}
    assert engine.prompts[0]["input_ids"] == row.prompt_ids
    assert engine.prompts[0]["sampling_params"]["max_new_tokens"] == 64
    assert row.output_ids == engine.output_ids and row.output_logprobs == [-0.25] * len(engine.output_ids)


# -- a killed recorder ------------------------------------------------------------------------------
def test_sigkilled_recorder_leaves_a_valid_dump_of_its_finished_turns(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({**SCRIPT.to_json(), "turns": [t.to_json() for t in SCRIPT.turns] * 3}))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [
        sys.executable,
        "-m",
        "trace_tools.cli.main",
        "record",
        "--script",
        str(script),
        "--out",
        str(tmp_path / "rec"),
        "--port",
        str(port),
    ]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _wait_port(port, process)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/s/k/v1", api_key="dummy", max_retries=0)
        history = [{"role": "user", "content": "go"}]
        for _ in range(2):
            reply = client.chat.completions.create(model="m", messages=history, tools=OPENAI_TOOLS)
            history += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "next"}]
        _wait_rows(tmp_path / "rec", 2)
        threading.Thread(target=lambda: _quietly(client, history), daemon=True).start()  # a turn in flight
        time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_tools.cli.main",
            "validate",
            str(tmp_path / "rec" / "dump"),
            "--strict",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["valid_sessions"] == 1 and report["turns"] in (2, 3) and report["quarantined"] == 0
    assert not [
        p
        for p in (tmp_path / "rec" / "dump").rglob("*")
        if p.is_file() and not p.name.startswith(".") and p.suffix != ".parquet"
    ]


def _quietly(client, history):
    try:
        client.chat.completions.create(model="m", messages=history, tools=OPENAI_TOOLS)
    except Exception:
        pass


def _wait_port(port: int, process) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"recorder exited: {process.stderr.read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("recorder did not start")


def test_record_refuses_a_non_loopback_address_and_a_bad_script(tmp_path):
    from typer.testing import CliRunner

    from trace_tools.cli.main import app

    bad = CliRunner().invoke(
        app, ["record", "--script", str(tmp_path / "none.json"), "--out", str(tmp_path / "r"), "--host", "0.0.0.0"]
    )
    assert bad.exit_code == 2 and "--allow-remote" in bad.output
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps({"format": "trace-tools-script", "version": 1, "turns": [{"calls": [{"arguments": {}}]}]})
    )
    malformed = CliRunner().invoke(app, ["record", "--script", str(script), "--out", str(tmp_path / "r2")])
    assert malformed.exit_code == 2 and "needs a 'name'" in malformed.output


def test_step_and_weight_version_come_from_the_recorder_or_each_request(tmp_path):
    """`--step` / `--weight-version` label every turn; a gateway's X-Trace-Tools-Step header wins,
    and a step that is not a whole number is refused (400) and recorded nowhere."""
    with open_recorder(tmp_path / "rec", script=ScriptBook({"*": SCRIPT}), step=7, weight_version="ckpt-7") as running:

        def ask(session: str, headers: dict[str, str]) -> None:
            client = openai.OpenAI(
                base_url=f"{running.url}/s/{session}/v1", api_key="dummy", max_retries=0, default_headers=headers
            )
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}], tools=OPENAI_TOOLS)

        ask("plain", {})
        ask("named", {"X-Trace-Tools-Step": "12", "X-Trace-Tools-Weight-Version": "ckpt-12"})
        with pytest.raises(openai.BadRequestError, match="X-Trace-Tools-Step"):
            ask("bad", {"X-Trace-Tools-Step": "twelve"})
        rows = {row.session_id: row for row in _wait_rows(tmp_path / "rec", 2)}
    assert set(rows) == {"plain", "named"}
    assert (rows["plain"].step, rows["plain"].weight_version) == (7, "ckpt-7")
    assert (rows["named"].step, rows["named"].weight_version) == (12, "ckpt-12")
