"""The recording gateway: an aiohttp server between a harness and a model (`trace-tools record`).

Why aiohttp: one maintained asyncio package gives both halves the recorder needs, a server
that streams Server-Sent Events chunk by chunk (`StreamResponse`) and listens on TCP or a Unix
socket (the probe's network namespace reaches it through one), and the HTTP client that posts
to an upstream engine (`--upstream`); slime's own gateway adapters run on it too. Starlette
would need uvicorn for serving and httpx for the client.

Routes (an optional `/s/<session>` prefix names the session: a harness pointed at
`http://127.0.0.1:PORT/s/abc` records as session `abc`; without it the session is the client's
`X-Claude-Code-Session-Id` or `X-Session-Id` header, else `default`):

* `POST /v1/messages` (Anthropic Messages, JSON or SSE) and `POST /v1/messages/count_tokens`;
* `POST /v1/chat/completions` (also without `/v1`; OpenAI Chat Completions, JSON or SSE);
* `GET /v1/models`, `GET /health`; anything else is logged and answered 404.

One turn: convert the request (`anthropic.py` / `openai_chat.py`), canonicalize it (slime's
translate, `render/canonical.py`), render it with the chat template and tokenizer (prompt ids),
generate (`model.py`), parse the output ids with the family's parser, answer in the client's
protocol, then write the turn (`sink.py`). A session's requests are served one at a time, in
arrival order. Claude Code's conversation-title request is answered (a short title) and logged as
a side request, never recorded as a turn, as slime's adapter does.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trace_tools.data import DumpMeta, Turn
from trace_tools.errors import TraceToolsError, UnknownName
from trace_tools.record import anthropic, openai_chat
from trace_tools.record.model import Generation, Request, ScriptedModel, UpstreamModel
from trace_tools.record.sink import RequestLog, TurnSink, redact
from trace_tools.render.canonical import canonicalize_messages

SIDE_TITLE = "Scripted session"
# How a reply carries the model's reasoning: `separate` (Anthropic thinking blocks, OpenAI
# `reasoning_content`) or `text` (as plain text ahead of the visible text: an Anthropic text block in
# place of the thinking block, which a gateway in front of an open model cannot sign; OpenAI
# `content`). Either way the row's `response` is the gateway's parse, reasoning kept apart.
REASONING_MODES = ("separate", "text")


@dataclass
class RecorderStats:
    turns: int = 0
    side_requests: int = 0
    rejected: int = 0
    errors: int = 0


class Recorder:
    """Serves one recording into `out_dir` (`dump/`, `requests.jsonl`, `rejected.jsonl`)."""

    def __init__(
        self,
        out_dir: str | Path,
        renderer: Any,
        model: ScriptedModel | UpstreamModel,
        *,
        harness: str = "",
        reasoning: str = "separate",
    ):
        if reasoning not in REASONING_MODES:
            raise UnknownName("reasoning mode", reasoning, list(REASONING_MODES))
        self.out_dir = Path(out_dir)
        self.renderer, self.model, self.reasoning = renderer, model, reasoning
        source = "upstream" if isinstance(model, UpstreamModel) else "script"
        self.meta = recording_meta(renderer, harness, source, reasoning)
        self.sink = TurnSink(self.out_dir / "dump", self.meta, renderer.vocab_size)
        self.log = RequestLog(self.out_dir / "requests.jsonl")
        self.stats = RecorderStats()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="recorder-render")
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._next_turn: dict[str, int] = defaultdict(int)
        self._client: Any = None

    # -- the application ---------------------------------------------------------------------
    def app(self) -> Any:
        from aiohttp import web

        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _cleanup(self, app: Any) -> None:
        if self._client is not None:
            await self._client.close()

    async def _dispatch(self, request: Any) -> Any:
        session, path = split_session(request.path)
        try:
            if request.method == "POST" and path == "/v1/messages":
                return await self._turn(request, session, "anthropic")
            if request.method == "POST" and path == "/v1/messages/count_tokens":
                return await self._count_tokens(request, session)
            if request.method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
                return await self._turn(request, session, "openai")
            if request.method == "GET" and path in ("/v1/models", "/models"):
                return self._answer(request, session, "other", {"object": "list", "data": [_model_entry()]})
            if request.method in ("GET", "HEAD") and path in ("/", "/health", "/healthz"):
                return self._answer(request, session, "other", {"status": "ok"})
            return self._answer(request, session, "unknown", _error("not_found", f"no route {path}"), status=404)
        except _BadRequest as bad:
            return self._answer(request, session, "bad_request", _error("invalid_request_error", str(bad)), status=400)

    def _answer(
        self, request: Any, session: str | None, kind: str, payload: dict, *, status: int = 200, **log: Any
    ) -> Any:
        from aiohttp import web

        entry = {"kind": kind, "session": session, "method": request.method, "path": request.path_qs}
        self.log.write({**entry, "headers": redact(request.headers), "status": status, "reply": payload, **log})
        return web.json_response(payload, status=status)

    # -- count_tokens ----------------------------------------------------------------------------
    async def _count_tokens(self, request: Any, session: str | None) -> Any:
        body = await _json_body(request)
        messages, tools = anthropic.request_messages(body), anthropic.request_tools(body)
        ids = await self._run(self._render, messages, tools)
        return self._answer(request, session, "count_tokens", {"input_tokens": len(ids)}, body=body)

    # -- one turn -------------------------------------------------------------------------------
    async def _turn(self, request: Any, session: str | None, protocol: str) -> Any:
        body = await _json_body(request)
        session = session or _header_session(request) or "default"
        if protocol == "anthropic" and anthropic.is_title_request(body):
            self.stats.side_requests += 1
            reply = anthropic.message_body(
                _id("msg_"),
                body.get("model", ""),
                [{"type": "text", "text": SIDE_TITLE}],
                "end_turn",
                {"input_tokens": 0, "output_tokens": 0},
            )
            return await self._send(request, protocol, body, reply, session=session, kind="side", body_log=body)
        if protocol == "anthropic":
            messages, tools = anthropic.request_messages(body), anthropic.request_tools(body)
        else:
            messages, tools = _openai_request(body)
        async with self._locks[session]:
            return await self._serve_turn(request, session, protocol, body, messages, tools)

    async def _serve_turn(
        self, request: Any, session: str, protocol: str, body: dict, messages: list, tools: Any
    ) -> Any:
        started = datetime.now(timezone.utc)
        try:
            prompt_ids = await self._run(self._render, messages, tools)
            generation = await self._generate(
                Request(session, messages, tools, prompt_ids, _max_tokens(body, protocol))
            )
            parsed = await self._run(lambda: self.renderer.parse_response(generation.output_ids, tools).message)
        except TraceToolsError as exc:
            self.stats.errors += 1
            self.log.write(
                {"kind": "error", "session": session, "path": request.path_qs, "error": str(exc), "body": body}
            )
            from aiohttp import web

            return web.json_response(_error("api_error", str(exc)), status=502 if "upstream" in str(exc) else 400)
        turn_index = self._next_turn[session]
        self._next_turn[session] += 1
        seed = f"{session}/{turn_index}"
        usage_in, usage_out = len(prompt_ids), len(generation.output_ids)
        if protocol == "anthropic":
            blocks = anthropic.reply_blocks(parsed, seed)
            sent = anthropic.reply_blocks(parsed, seed, reasoning_as_text=self.reasoning == "text")
            stop = anthropic.stop_reason(blocks, generation.finish)
            reply = anthropic.message_body(
                _id("msg_"), body.get("model", ""), sent, stop, {"input_tokens": usage_in, "output_tokens": usage_out}
            )
            response, finish = (
                anthropic.response_message(blocks),
                "tool_calls" if stop == "tool_use" else generation.finish,
            )
        else:
            response = openai_chat.reply_message(parsed, seed)
            message = openai_chat.reasoning_in_content(response) if self.reasoning == "text" else response
            finish = openai_chat.finish_reason(message, generation.finish)
            usage = {"prompt_tokens": usage_in, "completion_tokens": usage_out, "total_tokens": usage_in + usage_out}
            reply = openai_chat.completion_body(
                _id("chatcmpl-"), body.get("model", ""), int(time.time()), message, finish, usage
            )
        sent = await self._send(
            request, protocol, body, reply, session=session, kind="turn", turn_index=turn_index, body_log=body
        )
        turn = Turn(
            session_id=session,
            turn_index=turn_index,
            messages=messages,
            output_ids=generation.output_ids,
            tools=tools,
            output_logprobs=generation.logprobs,
            prompt_ids=prompt_ids,
            response=response,
            finish_reason=finish,
            request_id=reply["id"],
            started_at=started,
            finished_at=datetime.now(timezone.utc),
            metadata=_turn_metadata(request, body, protocol, generation),
        )
        reason = await self._run(self.sink.write, turn)
        if reason is None:
            self.stats.turns += 1
        else:
            self.stats.rejected += 1
        return sent

    async def _send(
        self,
        request: Any,
        protocol: str,
        body: dict,
        reply: dict,
        *,
        session: str,
        kind: str,
        body_log: dict,
        turn_index: int | None = None,
    ) -> Any:
        from aiohttp import web

        stream = bool(body.get("stream"))
        entry = {
            "kind": kind,
            "session": session,
            "method": request.method,
            "path": request.path_qs,
            "headers": redact(request.headers),
            "body": body_log,
            "stream": stream,
            "reply": reply,
        }
        if turn_index is not None:
            entry["turn_index"] = turn_index
        self.log.write(entry)
        if not stream:
            return web.json_response(reply)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        if protocol == "anthropic":
            for event, data in anthropic.sse_events(reply):
                await response.write(anthropic.sse_frame(event, data))
        else:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            for chunk in openai_chat.chunks(reply, include_usage):
                await response.write(openai_chat.sse_frame(chunk))
            await response.write(openai_chat.sse_frame("[DONE]"))
        await response.write_eof()
        return response

    # -- helpers ------------------------------------------------------------------------------------
    def _render(self, messages: list[dict], tools: Any) -> list[int]:
        from trace_tools.errors import ReplayError

        try:
            return self.renderer.render(canonicalize_messages(messages, "slime"), tools, True)
        except ReplayError as exc:
            raise _BadRequest(str(exc)) from exc

    async def _generate(self, request: Request) -> Generation:
        if isinstance(self.model, UpstreamModel):
            import aiohttp

            if self._client is None:
                self._client = aiohttp.ClientSession()
            return await self.model.agenerate(request, self._client)
        return await self._run(self.model.generate, request)

    async def _run(self, function: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def close(self) -> None:
        self.log.close()
        self._executor.shutdown(wait=True)


class _BadRequest(TraceToolsError):
    pass


def recording_meta(renderer: Any, harness: str, source: str, reasoning: str = "separate") -> DumpMeta:
    recorder = {"source": source, "canonicalization": "slime"}
    if reasoning != "separate":
        recorder["reasoning"] = reasoning
    extra = {"recorder": json.dumps(recorder)}
    if getattr(renderer, "render_date", None):
        extra["render_date"] = renderer.render_date
    return DumpMeta(
        schema_version="1",
        tokenizer=renderer.tokenizer.name,
        chat_template=renderer.chat_template,
        history_mode="tree",
        harness=harness or "trace-tools record",
        extra=extra,
    )


def split_session(path: str) -> tuple[str | None, str]:
    """(`abc`, `/v1/messages`) for `/s/abc/v1/messages`; (None, path) without the prefix."""
    if path.startswith("/s/"):
        key, _, rest = path[3:].partition("/")
        return (key or None), "/" + rest
    return None, path


def _header_session(request: Any) -> str | None:
    return request.headers.get("X-Session-Id") or request.headers.get("X-Claude-Code-Session-Id")


async def _json_body(request: Any) -> dict:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError as exc:
        raise _BadRequest(f"request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    return body


def _openai_request(body: dict) -> tuple[list[dict], list[dict] | None]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty array")
    return messages, body.get("tools") or None


def _max_tokens(body: dict, protocol: str) -> int | None:
    value = (
        body.get("max_tokens") if protocol == "anthropic" else body.get("max_completion_tokens", body.get("max_tokens"))
    )
    return value if isinstance(value, int) and value > 0 else None


def _turn_metadata(request: Any, body: dict, protocol: str, generation: Generation) -> dict:
    meta = {"protocol": protocol, "stream": bool(body.get("stream")), "model": body.get("model")}
    client_session = request.headers.get("X-Claude-Code-Session-Id")
    if client_session:
        meta["client_session"] = client_session
    if generation.scenario is not None:
        meta.update(scenario=generation.scenario, script_turn=generation.script_turn)
    return meta


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def _model_entry() -> dict:
    return {"id": "trace-tools-recorder", "object": "model", "type": "model", "display_name": "trace-tools recorder"}


def _error(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


class RecorderThread:
    """Runs a Recorder's server on its own event loop in a background thread (probe, tests).

    `tcp=(host, port)` (port 0 picks a free one; `url` tells which) and/or `unix=PATH`.
    """

    def __init__(self, recorder: Recorder, *, tcp: tuple[str, int] | None = None, unix: str | Path | None = None):
        self.recorder, self.tcp, self.unix = recorder, tcp, unix
        self.url: str | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="recorder", daemon=True)

    def __enter__(self) -> "RecorderThread":
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    async def _start(self) -> None:
        from aiohttp import web

        self._runner = web.AppRunner(self.recorder.app(), access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        if self.unix is not None:
            site = web.UnixSite(self._runner, str(self.unix))
            await site.start()
        if self.tcp is not None:
            tcp_site = web.TCPSite(self._runner, self.tcp[0], self.tcp[1])
            await tcp_site.start()
            host, port = tcp_site._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
            self.url = f"http://{host}:{port}"

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(60)
        self.recorder.close()
