"""The four APIs the recorder speaks, behind one seam: which API a request speaks, its checks,
its conversation, and its half of a turn's reply (the server does the rest the same way for all).

`protocol_of` names the API from the path (a malformed request's error takes that API's shape):
`anthropic` (Messages), `openai` (Chat Completions), `responses` (the OpenAI Responses API) or
`gemini` (Google's Gemini API, whose model and streaming are named in the path, not the body).
`reply` turns a parsed generation into what the client is sent, the row's `response` and its
`finish_reason`; `stream_frames` gives a streamed reply's frames, split before the first that
tells the client the reply is complete, so the turn is persisted in between.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Mapping

from trace_tools.record import anthropic, gemini, openai_chat, responses
from trace_tools.record.checks import check_anthropic, check_gemini, check_openai, check_responses

CHECKS = {"anthropic": check_anthropic, "openai": check_openai, "responses": check_responses, "gemini": check_gemini}


def protocol_of(path: str) -> str:
    """Which API a path (without its session prefix) speaks."""
    if path.endswith("/chat/completions"):
        return "openai"
    if path.endswith("/responses"):
        return "responses"
    return "gemini" if gemini.route(path) is not None else "anthropic"


def conversation(protocol: str, body: dict) -> tuple[list[dict], list[dict] | None, list[str]]:
    """A checked request's messages and tools in trace-schema form, and the tools with no chat form."""
    if protocol == "anthropic":
        return anthropic.request_messages(body), anthropic.request_tools(body), []
    if protocol == "responses":
        return (responses.request_messages(body), *responses.request_tools(body))
    if protocol == "gemini":
        return (gemini.request_messages(body), *gemini.request_tools(body))
    return body["messages"], body.get("tools") or None, []


def model(protocol: str, path: str, body: dict) -> Any:
    if protocol == "gemini":
        route = gemini.route(path)
        return route[0] if route else ""
    return body.get("model")


def streams(protocol: str, path: str, query: Mapping[str, str], body: dict) -> bool:
    """Whether the reply is sent as Server-Sent Events (Gemini: `:streamGenerateContent?alt=sse`)."""
    if protocol == "gemini":
        return path.endswith(":streamGenerateContent") and query.get("alt") == "sse"
    return body.get("stream") is True


def json_array(protocol: str, path: str) -> bool:
    """Gemini's `streamGenerateContent` without `alt=sse`: the chunks as one JSON array."""
    return protocol == "gemini" and path.endswith(":streamGenerateContent")


def max_tokens(protocol: str, body: dict) -> int | None:
    if protocol == "anthropic":
        value = body.get("max_tokens")
    elif protocol == "responses":
        value = body.get("max_output_tokens")
    elif protocol == "gemini":
        value = gemini.max_tokens(body)
    else:
        value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) and value > 0 else None


def reply(
    protocol: str,
    parsed: dict,
    seed: str,
    body: dict,
    model_name: Any,
    finish: str,
    usage: tuple[int, int],
    as_text: bool,
) -> tuple[dict, dict, str]:
    """(what the client is sent, the row's `response`, the row's `finish_reason`) for a parsed
    generation; `as_text`: the reasoning goes to the client as text (`--reasoning text`)."""
    usage_in, usage_out = usage
    if protocol == "anthropic":
        blocks = anthropic.reply_blocks(parsed, seed)
        sent = anthropic.reply_blocks(parsed, seed, reasoning_as_text=as_text)
        stop = anthropic.stop_reason(blocks, finish)
        counts = {"input_tokens": usage_in, "output_tokens": usage_out}
        body_out = anthropic.message_body(new_id("msg_"), model_name or "", sent, stop, counts)
        return body_out, anthropic.response_message(blocks), "tool_calls" if stop == "tool_use" else finish
    response = openai_chat.reply_message(parsed, seed)
    message = openai_chat.reasoning_in_content(response) if as_text else response
    row_finish = openai_chat.finish_reason(message, finish)
    if protocol == "responses":
        items = responses.output_items(message, seed)
        return (
            responses.response_body(new_id("resp_"), body, int(time.time()), items, finish, usage),
            response,
            row_finish,
        )
    if protocol == "gemini":
        sent_body = gemini.reply_body(new_id("resp_"), model_name, gemini.reply_parts(message), finish, usage)
        return sent_body, gemini.response_message(response), row_finish
    counts = {"prompt_tokens": usage_in, "completion_tokens": usage_out, "total_tokens": usage_in + usage_out}
    sent_body = openai_chat.completion_body(
        new_id("chatcmpl-"), model_name or "", int(time.time()), message, row_finish, counts
    )
    return sent_body, response, row_finish


def reply_id(protocol: str, sent: dict) -> str:
    return sent["responseId"] if protocol == "gemini" else sent["id"]


def stream_frames(protocol: str, body: dict, sent: dict) -> tuple[list[bytes], list[bytes]]:
    """A streamed reply's frames, split before the first that completes it (Anthropic
    `message_delta` with the stop reason; OpenAI the chunk with `finish_reason`; Responses
    `response.completed`; Gemini the chunk with `finishReason`)."""
    if protocol == "anthropic":
        frames = [anthropic.sse_frame(event, data) for event, data in anthropic.sse_events(sent)]
        return frames[:-2], frames[-2:]
    if protocol == "responses":
        frames = [responses.sse_frame(event) for event in responses.sse_events(sent)]
        return frames[:-1], frames[-1:]
    if protocol == "gemini":
        frames = [gemini.sse_frame(chunk) for chunk in gemini.stream_chunks(sent)]
        return frames[:-1], frames[-1:]
    include_usage = (body.get("stream_options") or {}).get("include_usage") is True
    chunks = list(openai_chat.chunks(sent, include_usage))
    finish = next(i for i, chunk in enumerate(chunks) if chunk["choices"] and chunk["choices"][0]["finish_reason"])
    frames = [openai_chat.sse_frame(chunk) for chunk in chunks] + [openai_chat.sse_frame("[DONE]")]
    return frames[:finish], frames[finish:]


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)
