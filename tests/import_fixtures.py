"""Writers for the importers' source formats, and the committed fixtures under tests/fixtures/import/.

The converters turn schema-v1 sessions back into what each recorder writes (the shapes the
importer modules document); `conversations()` is a small hand-written pair of sessions tokenized
with the real Qwen3 tokenizer and template, so the fixtures replay with exact prompt fidelity.

Regenerate the committed fixtures with `python tests/import_fixtures.py tests/fixtures/import`
(a test checks they still equal what this module writes).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agent_fixtures import write_agent_fixtures
from trace_tools.data import Session, Turn

FIXTURES = Path(__file__).parent / "fixtures" / "import"
SESSION_HEADER = "X-Session-Id"
BASH = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command in the repository and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command."}},
                "required": ["command"],
            },
        },
    }
]


# -- recorder formats --------------------------------------------------------------------------------


def _epoch(moment) -> float | None:
    return None if moment is None else moment.timestamp()


def _completion(turn: Turn) -> dict[str, Any]:
    return {
        "id": turn.request_id,
        "object": "chat.completion",
        "model": "policy",
        "choices": [
            {
                "index": 0,
                "message": turn.response,
                "finish_reason": turn.finish_reason,
                "meta_info": {
                    "output_token_logprobs": [[lp, t] for lp, t in zip(turn.output_logprobs, turn.output_ids)],
                    "completion_tokens": len(turn.output_ids),
                    "prompt_tokens": len(turn.prompt_ids or []),
                    "weight_version": "step-3",
                },
            }
        ],
    }


def miles_record(turn: Turn) -> dict[str, Any]:
    """A miles `SessionRecord` for a turn (the request as miles mutated it: input_ids added)."""
    request = {
        "model": "policy",
        "messages": turn.messages,
        "input_ids": turn.prompt_ids,
        "logprobs": True,
        "return_meta_info": True,
        "no_stop_trim": False,
    }
    if turn.tools:
        request["tools"] = turn.tools
    if turn.chat_template_kwargs:
        request["chat_template_kwargs"] = turn.chat_template_kwargs
    return {
        "timestamp": _epoch(turn.finished_at),
        "request_timestamp": _epoch(turn.started_at),
        "method": "POST",
        "path": "/v1/chat/completions",
        "request": request,
        "response": _completion(turn),
        "status_code": 200,
    }


def miles_document(session: Session) -> dict[str, Any]:
    """What miles' `GET /sessions/{id}` returns for a session."""
    return {
        "session_id": session.session_id,
        "records": [miles_record(t) for t in session.turns],
        "metadata": {"max_trim_tokens": 0},
    }


def rejected_record(turn: Turn) -> dict[str, Any]:
    record = miles_record(turn)
    record.update(status_code=400, response={"error": {"message": "messages do not extend the session's history"}})
    return record


def sglang_exchange(turn: Turn) -> dict[str, Any]:
    """An OpenAI chat-completion exchange answered by SGLang with return_meta_info, session in a header."""
    request = {"model": "policy", "messages": turn.messages, "tools": turn.tools, "input_ids": turn.prompt_ids}
    return {
        "headers": {SESSION_HEADER: turn.session_id},
        "request": request,
        "response": _completion(turn),
        "status_code": 200,
        "started_at": _epoch(turn.started_at),
        "finished_at": _epoch(turn.finished_at),
    }


def vllm_exchange(turn: Turn) -> dict[str, Any]:
    """An exchange answered by vLLM with return_token_ids and logprobs; the session in the body's `user`."""
    choice = {
        "index": 0,
        "message": turn.response,
        "finish_reason": turn.finish_reason,
        "token_ids": turn.output_ids,
        "logprobs": {
            "content": [
                {"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(turn.output_ids, turn.output_logprobs)
            ]
        },
    }
    response = {
        "id": turn.request_id,
        "object": "chat.completion",
        "prompt_token_ids": turn.prompt_ids,
        "choices": [choice],
        "usage": {"prompt_tokens": len(turn.prompt_ids or []), "completion_tokens": len(turn.output_ids)},
    }
    request = {
        "model": "policy",
        "messages": turn.messages,
        "tools": turn.tools,
        "user": turn.session_id,
        "return_token_ids": True,
        "logprobs": True,
    }
    return {"request": request, "response": response, "started_at": turn.started_at.isoformat()}


def gateway_trace(turn: Turn) -> dict[str, Any]:
    """An agentcore/slime gateway's per-call trace: the TurnRecord plus the request it rendered."""
    return {
        "session_id": turn.session_id,
        "prompt_ids": turn.prompt_ids,
        "output_ids": turn.output_ids,
        "finish_reason": turn.finish_reason,
        "output_log_probs": turn.output_logprobs,
        "ill_formed": False,
        "messages": turn.messages,
        "tools": turn.tools,
        "response_message": turn.response,
        "timestamp": _epoch(turn.finished_at),
        "task_index": 7,
    }


def interleaved(sessions: list[Session]) -> list[Turn]:
    """Turns in arrival order across sessions (round robin), as a per-request log records them."""
    longest = max(len(s.turns) for s in sessions)
    return [s.turns[i] for i in range(longest) for s in sessions if i < len(s.turns)]


# -- the hand-written conversations ----------------------------------------------------------------


def _steps() -> dict[str, list[tuple[list[dict], dict]]]:
    """Per session: (messages appended before the call, the assistant reply) for each call."""
    system = {"role": "system", "content": "You are a careful coding agent. Use Bash to inspect the repository."}
    call = {"id": "call_7", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "pytest -q"}'}}
    return {
        "fix-flaky-test": [
            (
                [system, {"role": "user", "content": "test_retry fails now and then. Find out why."}],
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "Running the suite shows the failure.",
                    "tool_calls": [call],
                },
            ),
            (
                [{"role": "tool", "tool_call_id": "call_7", "content": "1 failed: test_retry (timeout 0.01s)"}],
                {
                    "role": "assistant",
                    "content": "The retry test uses a 10 ms timeout; raising it to 1 s removes the race.",
                    "reasoning_content": "The timeout is too tight.",
                },
            ),
        ],
        "explain-config": [
            (
                [system, {"role": "user", "content": "What does the `strict` flag in config.toml do?"}],
                {"role": "assistant", "content": "It makes unknown keys an error instead of a warning."},
            ),
            (
                [{"role": "user", "content": "And its default?"}],
                {"role": "assistant", "content": "It defaults to false."},
            ),
        ],
    }


def conversations(renderer) -> list[Session]:
    """The two sessions, with the ids a Qwen3 gateway would have served (byte-exact echoes)."""
    start = datetime(2025, 5, 1, 9, 0, tzinfo=UTC)
    sessions = []
    for number, (sid, steps) in enumerate(_steps().items()):
        history, turns = [], []
        for index, (added, reply) in enumerate(steps):
            history = history + added
            prompt = renderer.render_text(history, BASH, True)
            served = renderer.render_text(history + [reply], BASH, False)
            output = renderer.encode(served[len(prompt) :].rstrip("\n"))
            moment = start + timedelta(minutes=10 * number + index)
            turns.append(
                Turn(
                    session_id=sid,
                    turn_index=index,
                    messages=list(history),
                    tools=BASH,
                    output_ids=output,
                    output_logprobs=[-round(0.001 * (i % 13), 3) for i in range(len(output))],
                    prompt_ids=renderer.encode(prompt),
                    response=reply,
                    finish_reason="tool_calls" if reply.get("tool_calls") else "stop",
                    request_id=f"chatcmpl-{sid}-{index}",
                    started_at=moment,
                    finished_at=moment + timedelta(seconds=2),
                )
            )
            history = history + [reply]
        sessions.append(Session(sid, turns))
    return sessions


def write_fixtures(directory: Path, renderer) -> list[Path]:
    """Every committed fixture: one file per format and shape."""
    sessions = conversations(renderer)
    directory.mkdir(parents=True, exist_ok=True)
    documents = [miles_document(s) for s in sessions]
    documents[1]["records"].insert(1, rejected_record(sessions[1].turns[1]))
    lines = {
        "miles_requests.jsonl": [{"session_id": t.session_id, **miles_record(t)} for t in interleaved(sessions)],
        "sglang_exchanges.jsonl": [sglang_exchange(t) for t in interleaved(sessions)],
        "vllm_exchanges.jsonl": [vllm_exchange(t) for t in interleaved(sessions)],
        "gateway_traces.jsonl": [gateway_trace(t) for t in interleaved(sessions)],
    }
    written = [directory / "miles_sessions.json"]
    written[0].write_text(json.dumps(documents, indent=1) + "\n")
    for name, records in lines.items():
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in records))
        written.append(directory / name)
    return written + write_agent_fixtures(directory, sessions)


if __name__ == "__main__":
    from trace_tools.render.renderer import Renderer

    for path in write_fixtures(Path(sys.argv[1]), Renderer.from_spec("qwen3", "qwen3")):
        print(path)
