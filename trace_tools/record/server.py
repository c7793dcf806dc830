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
* `POST /v1/responses` (also without `/v1`; the OpenAI Responses API, JSON or SSE; Codex CLI);
* `POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent` (`?alt=sse`) and
  `:countTokens` (Google's Gemini API; also under `/v1/`; Gemini CLI);
* `GET /v1/models`, `GET /health`; anything else is logged and answered 404.

One turn: convert the request (`protocols.py`, over `anthropic.py`, `openai_chat.py`,
`responses.py` and `gemini.py`), canonicalize it (slime's translate, `render/canonical.py`),
render it with the chat template and tokenizer (prompt ids), generate (`model.py`), parse the
output ids with the family's parser, write the turn (`sink.py`), answer in the client's protocol.
A session's requests are served one at a time, in arrival order. A side request (a conversation
title, a next-speaker check, a memory or skill pass: `side_requests.py`) is answered (a short
title, ...) or, for the probe, declined, and logged as a side request, never recorded as a turn,
as slime's adapter does with Claude Code's title request.

What the recorder promises (docs/probe.md, "What the recorder keeps"): a reply a client received
is in the dump. A turn is persisted before the bytes that complete its reply are sent (a JSON
reply: before any; a stream: before the events that carry the stop reason), whether the client
is still there or not; a turn whose client left first is written with what was produced and
`metadata.abandoned` saying so; a request whose client left while it waited for its session's
earlier turn is logged `abandoned` and never numbered. Requests are checked first (`checks.py`):
a malformed one is a 4xx in its API's error shape, never a traceback. Renders, generations and
writes run in a pool of `RENDER_THREADS` threads, each with its own renderer (the incremental
render caches are per thread), so one huge prompt does not hold up other sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator

from trace_tools.data import DumpMeta, Turn
from trace_tools.errors import ReplayError, TraceToolsError, UnknownName, UsageError
from trace_tools.record import anthropic, gemini, protocols
from trace_tools.record.checks import (
    BODY_SECONDS,
    DEFAULT_MAX_BODY,
    BadRequest,
    check_anthropic,
    check_gemini,
    error_body,
    parse_body,
)
from trace_tools.record.model import Generation, Request, ScriptedModel, UpstreamModel
from trace_tools.record.side_requests import CLAUDE_TITLE, POLICIES, SideMarker, side_answer, side_request_kind
from trace_tools.record.sink import OutLock, RequestLog, TurnSink, redact
from trace_tools.render.canonical import canonicalize_messages
from trace_tools.render.limits import TemplateLimitHit

# Headers a gateway in front of the recorder may send to place a call in training (docs/probe.md).
STEP_HEADER, WEIGHT_VERSION_HEADER = "X-Trace-Tools-Step", "X-Trace-Tools-Weight-Version"
# How a reply carries the model's reasoning: `separate` (Anthropic thinking blocks, OpenAI
# `reasoning_content`) or `text` (as plain text ahead of the visible text: an Anthropic text block in
# place of the thinking block, which a gateway in front of an open model cannot sign; OpenAI
# `content`). Either way the row's `response` is the gateway's parse, reasoning kept apart.
REASONING_MODES = ("separate", "text")
RENDER_THREADS = 4  # requests of this many sessions render at once; more wait for a thread
BODIES_AT_THE_LIMIT = 2  # bodies served at once, in bytes: this many at --max-body (docs/probe.md)


@dataclass
class RecorderStats:
    turns: int = 0
    side_requests: int = 0
    rejected: int = 0
    errors: int = 0
    abandoned: int = 0  # turns written, or requests logged, after their client had left


class Recorder:
    """Serves one recording into `out_dir` (`dump/`, `requests.jsonl`, `rejected.jsonl`), which it
    locks (`sink.OutLock`) until `close`.

    `max_body` (bytes) and `body_seconds` bound what one request may send and how long it may take
    to send it (`checks.py`); `render_threads` is the size of the render pool."""

    def __init__(
        self,
        out_dir: str | Path,
        renderer: Any,
        model: ScriptedModel | UpstreamModel,
        *,
        harness: str = "",
        reasoning: str = "separate",
        max_body: int = DEFAULT_MAX_BODY,
        body_seconds: float = BODY_SECONDS,
        render_threads: int = RENDER_THREADS,
        step: int | None = None,
        weight_version: str | None = None,
        side_requests: str = "answer",
    ):
        if reasoning not in REASONING_MODES:
            raise UnknownName("reasoning mode", reasoning, list(REASONING_MODES))
        if side_requests not in POLICIES:
            raise UnknownName("side-request policy", side_requests, list(POLICIES))
        if not max_body > 0 or not body_seconds > 0 or render_threads < 1:
            raise UsageError("--max-body, the body read time and the render threads must be positive")
        self.out_dir = Path(out_dir)
        self.renderer, self.model, self.reasoning = renderer, model, reasoning
        self.side_requests = side_requests  # answer (record) or decline (probe): record/side_requests.py
        self.max_body, self.body_seconds = max_body, body_seconds
        self.step, self.weight_version = step, weight_version  # a request's headers may name its own
        self._lock = OutLock(self.out_dir)
        # A one-message render now: a template that cannot serve fails at start, and the shared
        # tokenizer's encoder is built before the first client waits on it.
        renderer.render([{"role": "user", "content": "warm-up"}], None, True)
        source = "upstream" if isinstance(model, UpstreamModel) else "script"
        self.meta = recording_meta(renderer, harness, source, reasoning)
        self.sink = TurnSink(self.out_dir / "dump", self.meta, renderer.vocab_size)
        self.log = RequestLog(self.out_dir / "requests.jsonl")
        self.stats = RecorderStats()
        self._executor = ThreadPoolExecutor(render_threads, thread_name_prefix="recorder-render")
        self._per_thread = threading.local()
        self._model_lock = threading.Lock()  # the scripted model encodes with the shared renderer
        self._sessions: dict[str, asyncio.Lock] = {}
        self._budget = _ByteBudget(BODIES_AT_THE_LIMIT * max_body)
        self._client: Any = None

    # -- the application ---------------------------------------------------------------------
    def app(self) -> Any:
        from aiohttp import web

        app = web.Application(client_max_size=self.max_body)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _cleanup(self, app: Any) -> None:
        if self._client is not None:
            await self._client.close()

    async def _dispatch(self, request: Any) -> Any:
        session, path = split_session(request.path)
        protocol = protocols.protocol_of(path)
        try:
            if request.method == "POST" and path == "/v1/messages":
                return await self._turn(request, session, "anthropic")
            if request.method == "POST" and path == "/v1/messages/count_tokens":
                return await self._count_tokens(request, session)
            if request.method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
                return await self._turn(request, session, "openai")
            if request.method == "POST" and path in ("/v1/responses", "/responses"):
                return await self._turn(request, session, "responses")
            route = gemini.route(path)
            if request.method == "POST" and route is not None:
                if route[1] == "countTokens":
                    return await self._count_tokens(request, session, "gemini")
                return await self._turn(request, session, "gemini")
            if request.method == "GET" and path in ("/v1/models", "/models"):
                return self._answer(request, session, "other", {"object": "list", "data": [_model_entry()]})
            if request.method in ("GET", "HEAD") and path in ("/", "/health", "/healthz"):
                return self._answer(request, session, "other", {"status": "ok"})
            payload = error_body(protocol, "not_found_error", f"no route {path}", status=404)
            return self._answer(request, session, "unknown", payload, status=404)
        except BadRequest as bad:
            payload = error_body(protocol, "invalid_request_error", str(bad), bad.param, bad.status)
            return self._answer(request, session, "bad_request", payload, status=bad.status)
        except Exception as exc:  # a recorder bug: the client gets its API's error, the log the cause
            self.stats.errors += 1
            self.log.write(
                {
                    "kind": "error",
                    "session": session,
                    "path": request.path_qs,
                    "error": repr(exc),
                    "traceback": traceback.format_exc(),
                }
            )
            payload = error_body(protocol, "api_error", f"the recorder failed on this request: {exc!r}", status=500)
            return self._answer(request, session, "error", payload, status=500)

    def _answer(
        self, request: Any, session: str | None, kind: str, payload: dict, *, status: int = 200, **log: Any
    ) -> Any:
        from aiohttp import web

        entry = {"kind": kind, "session": session, "method": request.method, "path": request.path_qs}
        self.log.write({**entry, "headers": redact(request.headers), "status": status, "reply": payload, **log})
        return web.json_response(payload, status=status)

    async def _body(self, request: Any) -> dict:
        """The request's JSON body, within `max_body` bytes and `body_seconds` (checks.parse_body)."""
        from aiohttp import web

        too_large = BadRequest(
            f"the request body is larger than the recorder's limit of {self.max_body} bytes (record --max-body)",
            status=413,
        )
        if request.content_length is not None and request.content_length > self.max_body:
            raise too_large
        try:
            raw = await asyncio.wait_for(request.read(), self.body_seconds)
        except web.HTTPRequestEntityTooLarge:
            raise too_large from None
        except asyncio.TimeoutError:
            raise BadRequest(f"the request body did not arrive within {self.body_seconds:g} s", status=408) from None
        return await self._run(parse_body, raw)

    # -- count_tokens ----------------------------------------------------------------------------
    async def _count_tokens(self, request: Any, session: str | None, protocol: str = "anthropic") -> Any:
        """The rendered prompt's length: Anthropic `count_tokens`, Gemini `countTokens`."""
        async with self._budget.hold(self._declared_size(request)):
            body = await self._body(request)
            if protocol == "gemini":
                check_gemini(body, count_tokens=True)
                counted = gemini.count_body(body)
                messages, (tools, _) = gemini.request_messages(counted), gemini.request_tools(counted)
            else:
                check_anthropic(body, count_tokens=True)
                messages, tools = anthropic.request_messages(body), anthropic.request_tools(body)
            ids = await self._run(self._render, messages, tools)
        reply = {"totalTokens": len(ids)} if protocol == "gemini" else {"input_tokens": len(ids)}
        return self._answer(request, session, "count_tokens", reply, body=body)

    # -- one turn -------------------------------------------------------------------------------
    async def _turn(self, request: Any, session: str | None, protocol: str) -> Any:
        """A session's requests one at a time; each body is read only when its turn comes and
        its bytes fit the recorder's budget (so waiting requests hold no memory)."""
        named = _header_session(request)  # checked even when the path names the session
        session = session or named or "default"
        async with self._sessions.setdefault(session, asyncio.Lock()):
            if _client_gone(request):  # it left while an earlier request of its session was served
                self.stats.abandoned += 1
                return self._answer(request, session, "abandoned", {}, status=499)
            async with self._budget.hold(self._declared_size(request)):
                body = await self._body(request)
                return await self._serve(request, session, protocol, body)

    async def _serve(self, request: Any, session: str, protocol: str, body: dict) -> Any:
        protocols.CHECKS[protocol](body)
        messages, tools, unrendered = protocols.conversation(protocol, body)
        side = CLAUDE_TITLE if protocol == "anthropic" and anthropic.is_title_request(body) else None
        side = side or side_request_kind(messages)
        if side is not None:
            return await self._side_request(request, session, protocol, body, side)
        return await self._serve_turn(request, session, protocol, body, messages, tools, unrendered)

    async def _side_request(self, request: Any, session: str, protocol: str, body: dict, side: SideMarker) -> Any:
        """Answered (`record`) or declined (`probe`), logged with its kind, never a turn."""
        self.stats.side_requests += 1
        log: dict[str, Any] = {"side_request": side.kind, "marker": side.text}
        if self.side_requests == "decline":
            message = f"side request ({side.kind}) declined by the recorder: it is not a turn of the session"
            payload = error_body(protocol, "invalid_request_error", message, status=400)
            return self._answer(request, session, "side", payload, status=400, body=body, **log)
        path = split_session(request.path)[1]
        reply = protocols.reply(
            protocol,
            {"role": "assistant", "content": side_answer(side.kind)},
            f"{session}/side",
            body,
            protocols.model(protocol, path, body),
            "stop",
            (0, 0),
            False,
        )[0]
        return await self._send(request, protocol, body, reply, session=session, kind="side", **log)

    def _declared_size(self, request: Any) -> int:
        """The bytes a request's body will take (a chunked one: the limit); a larger one is refused unread."""
        length = request.content_length
        return self.max_body if length is None else min(length, self.max_body)

    async def _serve_turn(
        self, request: Any, session: str, protocol: str, body: dict, messages: list, tools: Any, unrendered: list[str]
    ) -> Any:
        from aiohttp import web

        started = datetime.now(timezone.utc)
        step, weight_version = _header_step(request, self.step), _text_header(request, WEIGHT_VERSION_HEADER)
        try:
            prompt_ids = await self._run(self._render, messages, tools)
            generation = await self._generate(
                Request(session, messages, tools, prompt_ids, protocols.max_tokens(protocol, body))
            )
            parsed = await self._run(lambda: self._renderer().parse_response(generation.output_ids, tools).message)
        except BadRequest:
            raise
        except TraceToolsError as exc:
            self.stats.errors += 1
            self.log.write(
                {"kind": "error", "session": session, "path": request.path_qs, "error": str(exc), "body": body}
            )
            status = 502 if "upstream" in str(exc) else 400
            return web.json_response(error_body(protocol, "api_error", str(exc), status=status), status=status)
        turn_index = self.sink.reserve(session)
        seed = f"{session}/{turn_index}"
        path = split_session(request.path)[1]
        reply, response, finish = protocols.reply(
            protocol,
            parsed,
            seed,
            body,
            protocols.model(protocol, path, body),
            generation.finish,
            (len(prompt_ids), len(generation.output_ids)),
            self.reasoning == "text",
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
            request_id=protocols.reply_id(protocol, reply),
            started_at=started,
            finished_at=datetime.now(timezone.utc),
            metadata=_turn_metadata(request, body, protocol, generation, unrendered),
            step=step,
            weight_version=weight_version or self.weight_version,
        )
        return await self._send(request, protocol, body, reply, session=session, kind="turn", turn=turn)

    async def _send(
        self,
        request: Any,
        protocol: str,
        body: dict,
        reply: dict,
        *,
        session: str,
        kind: str,
        turn: Turn | None = None,
        **log: Any,
    ) -> Any:
        """Log and answer; a turn is persisted before the bytes that complete its reply are sent."""
        from aiohttp import web

        path = split_session(request.path)[1]
        stream = protocols.streams(protocol, path, request.query, body)
        entry = {
            "kind": kind,
            "session": session,
            "method": request.method,
            "path": request.path_qs,
            "headers": redact(request.headers),
            "body": body,
            "stream": stream,
            "reply": reply,
            **log,
        }
        if turn is not None:
            entry["turn_index"] = turn.turn_index
        await self._run(self.log.write, entry)
        if not stream:
            gone = "the client left before the reply was sent" if _client_gone(request) else None
            await self._persist(turn, gone)
            # Gemini's streamGenerateContent without `alt=sse` answers the chunks as one JSON array.
            return web.json_response(gemini.stream_chunks(reply) if protocols.json_array(protocol, path) else reply)
        opening, closing = protocols.stream_frames(protocol, body, reply)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        cut = await _write_frames(request, response, opening, "the client left mid-stream, before the stop reason")
        await self._persist(turn, cut)
        if cut is None:
            cut = await _write_frames(request, response, closing, "the client left during the last events", eof=True)
            if cut is not None:
                self.log.write(
                    {"kind": "delivery", "session": session, "turn_index": entry.get("turn_index"), "error": cut}
                )
        return response

    async def _persist(self, turn: Turn | None, abandoned: str | None) -> None:
        """Write `turn` (marked when its client left first); it completes even if this request is cancelled."""
        if turn is None:
            return
        if abandoned:
            turn.metadata = {**(turn.metadata or {}), "abandoned": abandoned}
            self.stats.abandoned += 1
        reason = await asyncio.shield(self._run(self.sink.write, turn))
        if reason is None:
            self.stats.turns += 1
        else:
            self.stats.rejected += 1

    # -- helpers ------------------------------------------------------------------------------------
    def _renderer(self) -> Any:
        """This thread's renderer: one built from the recording's recipe (`Renderer.__reduce__`: the
        same template, the same tokenizer object) with render caches of its own, which are not
        safe to share between threads."""
        renderer = getattr(self._per_thread, "renderer", None)
        if renderer is None:
            factory, arguments = self.renderer.__reduce__()[:2]
            renderer = self._per_thread.renderer = factory(*arguments)
        return renderer

    def _render(self, messages: list[dict], tools: Any) -> list[int]:
        try:
            return self._renderer().render(canonicalize_messages(messages, "slime"), tools, True)
        except ReplayError as exc:
            raise BadRequest(str(exc)) from exc
        except TemplateLimitHit as hit:  # this request's prompt, not the recording: refuse it alone
            raise BadRequest(
                f"this request's prompt {hit.what} when rendered with the chat template; send a shorter "
                "conversation (the limits: $TRACE_TOOLS_TEMPLATE_SECONDS, $TRACE_TOOLS_TEMPLATE_OUTPUT)",
                param="messages",
            ) from None

    def _generate_scripted(self, request: Request) -> Generation:
        with self._model_lock:
            return self.model.generate(request)  # type: ignore[union-attr]

    async def _generate(self, request: Request) -> Generation:
        if isinstance(self.model, UpstreamModel):
            import aiohttp

            if self._client is None:
                self._client = aiohttp.ClientSession()
            return await self.model.agenerate(request, self._client)
        return await self._run(self._generate_scripted, request)

    async def _run(self, function: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.log.close()
        self._lock.release()


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
    """The session the headers name (both are checked: the Claude Code one is also kept in each row)."""
    named, claude_code = _text_header(request, "X-Session-Id"), _text_header(request, "X-Claude-Code-Session-Id")
    return named or claude_code


def _header_step(request: Any, default: int | None) -> int | None:
    """The training step a request names (`X-Trace-Tools-Step`, a whole number), else the recorder's `--step`."""
    text = _text_header(request, STEP_HEADER)
    if text is None:
        return default
    if not text.strip().lstrip("-").isdigit():
        raise BadRequest(f"is {text!r}; send the step as a whole number", param=f"header {STEP_HEADER}")
    return int(text)


def _text_header(request: Any, name: str) -> str | None:
    """A header the recorder keeps (a session key): refused unless it is UTF-8 (aiohttp hands other
    bytes over as lone surrogates, which no Parquet file or JSON line can hold)."""
    value = request.headers.get(name)
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("is not UTF-8 text; send the session key as UTF-8", param=f"header {name}") from None
    return value


def _client_gone(request: Any) -> bool:
    return request.transport is None or request.transport.is_closing()


async def _write_frames(request: Any, response: Any, frames: list[bytes], why: str, *, eof: bool = False) -> str | None:
    """Send `frames` (starting the response first); None, or `why` when the client had left."""
    try:
        if not response.prepared:
            await response.prepare(request)
        for frame in frames:
            await response.write(frame)
        if eof:
            await response.write_eof()
    except ConnectionError:  # aiohttp's ClientConnectionResetError: the client has gone
        return why
    return None


def _turn_metadata(request: Any, body: dict, protocol: str, generation: Generation, unrendered: list[str]) -> dict:
    path = split_session(request.path)[1]
    stream = protocols.streams(protocol, path, request.query, body) or protocols.json_array(protocol, path)
    meta = {"protocol": protocol, "stream": stream, "model": protocols.model(protocol, path, body)}
    if unrendered:
        meta["unrendered_tools"] = unrendered
    client_session = request.headers.get("X-Claude-Code-Session-Id")
    if client_session:
        meta["client_session"] = client_session
    if generation.scenario is not None:
        meta.update(scenario=generation.scenario, script_turn=generation.script_turn)
    return meta


def _model_entry() -> dict:
    return {"id": "trace-tools-recorder", "object": "model", "type": "model", "display_name": "trace-tools recorder"}


class _ByteBudget:
    """At most `limit` bytes of request bodies being served at once (a request's parsed body,
    prompt and row follow its size, so this bounds the recorder's memory); a request waits, its
    body unread, until it fits. One request always fits when none is served."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used == 0 or self.used + size <= self.limit)
            self.used += size
        try:
            yield
        finally:
            async with self._changed:
                self.used -= size
                self._changed.notify_all()


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
            self.recorder.close()  # lets go of the output folder's lock
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
