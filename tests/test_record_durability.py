"""`trace-tools record` keeps every turn it served, and refuses what a client should not send.

Real loopback servers and raw HTTP (http.client, sockets): sessions whose names escape alike, a
recorder restarted into the same folder, a second recorder on it, clients that leave mid-stream
or while queued, a recorder SIGKILLed the moment its client has the final event, every kind of
malformed body (each a 4xx in the API's own error shape), the body size and time limits, a
render past the template limits, and a 12 MB prompt beside a small session.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from io_support import free_port
from test_record import OPENAI_TOOLS, SCRIPT, _Engine, _wait_port
from trace_tools.errors import UsageError
from trace_tools.record import open_recorder
from trace_tools.record.checks import DEFAULT_MAX_BODY
from trace_tools.record.script import ScriptBook
from trace_tools.record.server import Recorder
from trace_tools.record.sink import read_requests

ROOT = Path(__file__).resolve().parents[1]
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


@pytest.fixture()
def recorder(tmp_path):
    with open_recorder(tmp_path / "rec", script=ScriptBook({"*": SCRIPT})) as running:
        yield running


def _port(running) -> int:
    return int(running.url.rsplit(":", 1)[1])


def _post(port: int, path: str, body: bytes | dict, headers: dict | None = None, timeout: float = 60):
    """(status, parsed JSON or raw text) of one POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.putrequest("POST", path)
        for name, value in {"Content-Type": "application/json", **(headers or {}), "Content-Length": len(data)}.items():
            connection.putheader(name, value)
        connection.endheaders(data)
        response = connection.getresponse()
        text = response.read()
    finally:
        connection.close()
    try:
        return response.status, json.loads(text)
    except ValueError:
        return response.status, text.decode(errors="replace")


def _chat(content: str = "go", **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "tools": OPENAI_TOOLS, **extra}


def _dump_turns(out: Path) -> list:
    from trace_tools.io.load import load

    loaded = load(out / "dump")
    assert not loaded.quarantine
    return [turn for session in loaded.sessions for turn in session.turns]


# -- folders, files and numbering ---------------------------------------------------------------
def test_sessions_whose_names_escape_alike_each_keep_their_turns(recorder, tmp_path):
    names = ["a b", "a_b", "a.b.", "a.b", "x" * 80 + "1", "x" * 80 + "2"]
    for name in names:
        status, _ = _post(_port(recorder), CHAT, _chat(), {"X-Session-Id": name})
        assert status == 200
    turns = _dump_turns(tmp_path / "rec")
    assert sorted(t.session_id for t in turns) == sorted(names)
    folders = [p for p in (tmp_path / "rec" / "dump").iterdir() if p.is_dir()]
    assert len(folders) == len(names)
    assert {f.name.rsplit("-", 1)[0] for f in folders} == {"a_b", "a.b", "x" * 60}  # still readable


def test_a_restarted_recorder_numbers_on_from_the_turns_on_disk(tmp_path):
    out = tmp_path / "rec"
    history = [{"role": "user", "content": "go"}]
    for _ in range(2):
        with open_recorder(out, script=ScriptBook({"*": SCRIPT})) as running:
            for _ in range(2):
                status, reply = _post(_port(running), "/s/r" + CHAT, {"model": "m", "messages": history})
                assert status == 200
                history += [reply["choices"][0]["message"], {"role": "user", "content": "next"}]
    turns = _dump_turns(out)
    assert [t.turn_index for t in turns] == [0, 1, 2, 3]
    assert len({t.request_id for t in turns}) == 4  # four recordings, none written over another
    assert len(turns[3].messages) == len(turns[0].messages) + 6


def test_a_second_recorder_into_the_same_out_is_refused_in_one_line(recorder, tmp_path):
    with pytest.raises(UsageError, match="another recorder .* is writing into"):
        open_recorder(tmp_path / "rec", script=ScriptBook({"*": SCRIPT}))
    command = [sys.executable, "-m", "trace_tools.cli.main", "record", "--script", str(tmp_path / "none.json")]
    command += ["--out", str(tmp_path / "rec"), "--port", str(free_port())]
    script = tmp_path / "none.json"
    script.write_text(json.dumps({**SCRIPT.to_json(), "turns": [t.to_json() for t in SCRIPT.turns]}))
    result = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "another recorder" in result.stderr
    assert _post(_port(recorder), CHAT, _chat())[0] == 200  # the first one is untouched


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


# -- clients that leave ---------------------------------------------------------------------------------
class _SlowEngine(_Engine):
    """The upstream engine, taking `delay` seconds per generation."""

    delay = 2.0

    async def _generate(self, request):
        await asyncio.sleep(self.delay)
        return await super()._generate(request)


def _send_and_leave(port: int, path: str, body: dict, after: float) -> None:
    """Send a streamed request, wait `after` seconds without reading, then reset the connection."""
    data = json.dumps({**body, "stream": True}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(head.encode() + data)
    time.sleep(after)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_clients_that_leave_mid_stream_or_while_queued_leave_no_turn_index_gap(renderer, tmp_path):
    engine = _SlowEngine(renderer.encode("Done.<|im_end|>"))
    out = tmp_path / "rec"
    try:
        with open_recorder(out, upstream=f"http://127.0.0.1:{engine.port}") as running:
            port = _port(running)
            leaving = [  # one generating when its client leaves, one queued behind it
                threading.Thread(target=_send_and_leave, args=(port, "/s/q" + CHAT, _chat(), 0.8)),
                threading.Thread(target=_send_and_leave, args=(port, "/s/q" + CHAT, _chat("again"), 0.8)),
            ]
            leaving[0].start()
            time.sleep(0.2)
            leaving[1].start()
            for thread in leaving:
                thread.join()
            status, _ = _post(port, "/s/q" + CHAT, _chat("stays"))  # queued behind both
            assert status == 200
    finally:
        engine.stop()
    log = read_requests(out / "requests.jsonl")
    served = sorted(e["turn_index"] for e in log if e["kind"] == "turn")
    turns = _dump_turns(out)
    assert sorted(t.turn_index for t in turns) == served == list(range(len(served)))
    assert not (out / "rejected.jsonl").exists()
    first = turns[0]
    assert first.messages[-1]["content"] == "go" and "left mid-stream" in first.metadata["abandoned"]
    assert turns[-1].messages[-1]["content"] == "stays" and "abandoned" not in turns[-1].metadata
    queued = [e for e in log if e["kind"] == "abandoned"] + [t for t in turns if t.messages[-1]["content"] == "again"]
    assert len(queued) == 1  # never generated (logged abandoned), or written and marked


@pytest.fixture(scope="module")
def renderer():
    from trace_tools.record import make_renderer

    return make_renderer("qwen3")


def test_a_recorder_killed_as_its_client_gets_the_final_event_has_the_turn(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({**SCRIPT.to_json(), "turns": [t.to_json() for t in SCRIPT.turns]}))
    port = free_port()
    command = [sys.executable, "-m", "trace_tools.cli.main", "record", "--script", str(script)]
    process = subprocess.Popen(
        command + ["--out", str(tmp_path / "rec"), "--port", str(port)], env=_env(), stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_port(port, process)
        for session, path, last in (("o", CHAT, b"data: [DONE]"), ("a", MESSAGES, b"event: message_stop")):
            body = _chat(stream=True) if path == CHAT else {"model": "m", "max_tokens": 99, "stream": True}
            body.setdefault("messages", [{"role": "user", "content": "go"}])
            events = _stream_until(port, f"/s/{session}{path}", body, last)
            assert last in events
        process.send_signal(signal.SIGKILL)  # right after the client has the last event of the second
    finally:
        process.kill()
        process.wait(10)
    turns = _dump_turns(tmp_path / "rec")
    assert sorted(t.session_id for t in turns) == ["a", "o"]
    assert not any("abandoned" in t.metadata for t in turns)


def _stream_until(port: int, path: str, body: dict, last: bytes) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode() + data)
        received = b""
        while last not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    return received


# -- malformed requests ----------------------------------------------------------------------------------------
_DEEP = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
_NESTED = {"role": "user", "content": [{"type": "text", "text": "x", "extra": json.loads("[" * 150 + "]" * 150)}]}
MALFORMED = [
    # (path, body, headers, the field the error names)
    (CHAT, _chat(tools="x"), {}, "tools"),
    (CHAT, _chat(tools=[{"type": "function"}]), {}, "tools[0].function"),
    (MESSAGES, {"messages": [{"role": "user", "content": "hi"}], "tools": [5]}, {}, "tools[0]"),
    (CHAT, b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800 x"}]}', {}, "messages[0].content"),
    (MESSAGES, b'{"messages": [{"role": "user", "content": "\\udfff"}]}', {}, "messages[0].content"),
    (CHAT, _DEEP, {}, "deeper than"),
    (MESSAGES, {"messages": [_NESTED]}, {}, "messages[0].content[0].extra"),
    (MESSAGES + "/count_tokens", {"model": "m", "messages": 5}, {}, "messages"),
    (CHAT, _chat(stream="yes", stream_options="x"), {}, "stream"),
    (CHAT, _chat(stream=True, stream_options="x"), {}, "stream_options"),
    (CHAT, _chat(), {"X-Session-Id": b"caf\xe9 \xff"}, "header X-Session-Id"),
    (MESSAGES, {"messages": [{"role": "user", "content": "hi"}]}, {"X-Claude-Code-Session-Id": b"\xff"}, "header"),
    (MESSAGES, {"model": "m", "max_tokens": 10}, {}, "messages"),
    (MESSAGES, {"messages": [{"role": "user", "content": 5}]}, {}, "messages[0].content"),
    (MESSAGES, {"messages": [{"role": "user", "content": [{"type": "tool_use", "input": 1}]}]}, {}, "content[0].name"),
    (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, {}, "messages[0].role"),
    (CHAT, _chat(max_tokens="10"), {}, "max_tokens"),
    (CHAT, b"[1, 2]", {}, "JSON object"),
    (CHAT, b'{"messages": [', {}, "not UTF-8 JSON"),
]


@pytest.mark.parametrize("path, body, headers, field", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_a_malformed_request_is_a_400_naming_the_field_in_the_apis_shape(
    recorder, tmp_path, path, body, headers, field
):
    status, reply = _post(_port(recorder), "/s/m" + path, body, headers)
    assert status == 400, reply
    message = _error_message(path, reply)
    assert field in message and "template" not in message
    assert _post(_port(recorder), "/s/ok" + CHAT, _chat())[0] == 200  # the recorder serves on
    assert not [e for e in read_requests(tmp_path / "rec" / "requests.jsonl") if e["kind"] == "error"]


def _error_message(path: str, reply: dict) -> str:
    if path == CHAT:  # OpenAI: {"error": {"message", "type", "param", "code"}}
        assert set(reply) == {"error"} and reply["error"]["type"] == "invalid_request_error"
        return reply["error"]["message"]
    assert reply["type"] == "error" and reply["error"]["type"] == "invalid_request_error"  # Anthropic
    return reply["error"]["message"]


# -- limits ------------------------------------------------------------------------------------------------------
def _raw(port: int, head: str, body: bytes, timeout: float = 20) -> tuple[int, dict]:
    """Send headers and (part of) a body, then read the one response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.encode() + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


def test_a_100_mb_body_is_refused_413_before_it_is_read(recorder):
    head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {100 * 2**20}\r\n\r\n"
    started = time.monotonic()
    status, reply = _raw(_port(recorder), head, b'{"messages": [' + b" " * 2**16)
    assert status == 413 and "--max-body" in reply["error"]["message"]
    assert time.monotonic() - started < 10


def test_a_body_just_over_the_default_limit_is_413_and_one_at_it_is_served(recorder):
    padding = DEFAULT_MAX_BODY - len(json.dumps(_chat(pad="")).encode())
    at_limit = json.dumps(_chat(pad=" " * padding)).encode()
    assert len(at_limit) == DEFAULT_MAX_BODY
    assert _post(_port(recorder), CHAT, at_limit)[0] == 200
    status, reply = _post(_port(recorder), MESSAGES, at_limit + b" ")
    assert status == 413 and reply["type"] == "error" and "16777216 bytes" in reply["error"]["message"]


def test_a_chunked_body_past_a_lower_limit_is_413_and_a_stalled_one_408(tmp_path):
    with open_recorder(tmp_path / "rec", script=ScriptBook({"*": SCRIPT}), max_body=2**20, body_seconds=1) as running:
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b" " * 2**16
        chunks = (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 20 + b"0\r\n\r\n"
        status, reply = _raw(_port(running), head, chunks)
        assert status == 413 and reply["error"]["type"] == "invalid_request_error"
        head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        started = time.monotonic()
        status, reply = _raw(_port(running), head, b'{"messages": ')
        assert status == 408 and "did not arrive within 1 s" in reply["error"]["message"]
        assert time.monotonic() - started < 5


def test_a_render_past_the_template_limit_refuses_that_request_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_TOOLS_TEMPLATE_OUTPUT", "20000")
    with open_recorder(tmp_path / "rec", script=ScriptBook({"*": SCRIPT})) as running:
        status, reply = _post(_port(running), "/s/big" + CHAT, _chat("word " * 10_000), timeout=30)
        assert status == 400 and reply["error"]["param"] == "messages" and "shorter" in reply["error"]["message"]
        assert _post(_port(running), "/s/small" + CHAT, _chat())[0] == 200
    assert [t.session_id for t in _dump_turns(tmp_path / "rec")] == ["small"]


def test_a_small_session_answers_within_5_s_while_a_12_mb_prompt_renders(recorder, monkeypatch):
    """The small request goes out once the big prompt's render has begun (it takes seconds: about
    1.4 s on the 2-core development machine), not after a fixed sleep, which a fast host could
    outlast and a slow one could cut short of the render."""
    rng = random.Random(0)
    words = " ".join(rng.choice(["alpha", "beta", "gamma", "x1", "foo_bar", "(x)", "λ", "\n"]) for _ in range(300_000))
    text = (words * 100)[: 12 * 2**20]
    done: dict[str, float] = {}
    rendering = threading.Event()
    render = Recorder._render

    def watched(self, messages, tools):
        if len(messages[-1].get("content") or "") == len(text):
            rendering.set()
        return render(self, messages, tools)

    monkeypatch.setattr(Recorder, "_render", watched)

    def big() -> None:
        assert _post(_port(recorder), "/s/big" + CHAT, _chat(text), timeout=300)[0] == 200
        done["big"] = time.monotonic()

    thread = threading.Thread(target=big)
    thread.start()
    assert rendering.wait(120), "the big prompt never reached its render"
    started = time.monotonic()
    assert _post(_port(recorder), "/s/small" + CHAT, _chat())[0] == 200
    finished = time.monotonic()
    thread.join()
    assert finished - started < 5 and finished < done["big"]
