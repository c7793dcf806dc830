"""Where the recorder's generations come from: a scripted model or a token-in/token-out engine.

Both return token ids, so the dump is a trace of what a model emitted, never of text the
recorder made up after the fact:

* `ScriptedModel` plays a script (`record/script.py`): the turn a request is at is the number of
  assistant messages its conversation already holds, so a retried request gets the same turn
  again and the script reacts to the conversation only as far as it must. Each turn is written
  the way the template family's model writes it (the simulator's writers, `simulate/formats.py`:
  reasoning, content and tool calls in the family's own format, stop token included) and
  tokenized with the renderer's tokenizer. A turn past the script's end is its final answer.
* `UpstreamModel` posts the prompt ids to SGLang's native `/generate` endpoint (`input_ids` in;
  `output_ids`, per-token logprobs and the finish reason out; stop token kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from trace_tools.errors import TraceToolsError, UsageError
from trace_tools.record.script import Script, ScriptTurn


@dataclass
class Request:
    """What a model is asked: one session's conversation, rendered."""

    session: str
    messages: list[dict]
    tools: list[dict] | None
    prompt_ids: list[int]
    max_tokens: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    output_ids: list[int]
    logprobs: list[float] | None
    finish: str  # "stop" or "length"
    script_turn: int | None = None
    scenario: str | None = None


class GenerationFailed(TraceToolsError):
    """The upstream engine failed or answered something that is not a generation."""


class ScriptedModel:
    """Plays scripts through the renderer's template family; one script per session key.

    `scripts(session, tools)` returns the session's script; it is called on the session's first
    request (so a script can be built for the tool schemas the harness offers) and kept.
    """

    def __init__(self, renderer: Any, scripts: Callable[[str, list[dict] | None], Script]):
        from trace_tools.simulate.formats import FAMILIES

        family = FAMILIES.get(getattr(renderer, "family", ""))
        if family is None:
            raise UsageError(
                f"the scripted model writes turns in a known template family's format; "
                f"the chat template's format ({getattr(renderer, 'tool_format', None)}) is not one: "
                f"pass --template with one of {', '.join(FAMILIES)}, or use --upstream"
            )
        self.renderer, self.family, self._scripts = renderer, family, scripts
        self._by_session: dict[str, Script] = {}

    def script(self, session: str, tools: list[dict] | None) -> Script:
        if session not in self._by_session:
            self._by_session[session] = self._scripts(session, tools)
        return self._by_session[session]

    def generate(self, request: Request) -> Generation:
        script = self.script(request.session, request.tools)
        position = sum(1 for m in request.messages if m.get("role") == "assistant")
        turn = script.turn(position)
        text = self.text(turn, request.prompt_ids)
        ids = self.renderer.encode(text)
        finish = "stop"
        if request.max_tokens is not None and len(ids) > request.max_tokens:
            ids, finish = ids[: request.max_tokens], "length"
        return Generation(ids, None, finish, script_turn=min(position, len(script.turns)), scenario=script.name)

    def text(self, turn: ScriptTurn, prompt_ids: Sequence[int]) -> str:
        """The turn as the family's model writes it after this prompt (stop token included)."""
        from trace_tools.simulate.episode import Call, Step

        step = Step("scripted", turn.reasoning, turn.content, [Call(c.name, dict(c.arguments)) for c in turn.calls])
        if self.family.one_call_per_turn and len(step.calls) > 1:
            raise UsageError(
                f"the {self.family.name} family makes one tool call per turn; "
                f"a script turn asks for {len(step.calls)} (split it, or record with another --template)"
            )
        _, text = self.family.emitted(step, self.renderer.decode(list(prompt_ids[-4:])))
        return text


class UpstreamModel:
    """SGLang's native `/generate`: input ids in, output ids and logprobs out."""

    def __init__(self, url: str, *, max_new_tokens: int = 4096, timeout_s: float = 600.0):
        self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/generate") else "/generate")
        self.max_new_tokens, self.timeout_s = max_new_tokens, timeout_s

    def payload(self, request: Request) -> dict:
        limit = min(request.max_tokens or self.max_new_tokens, self.max_new_tokens)
        sampling = {"max_new_tokens": limit, "skip_special_tokens": False, "no_stop_trim": True, **request.sampling}
        return {"input_ids": list(request.prompt_ids), "sampling_params": sampling, "return_logprob": True}

    async def agenerate(self, request: Request, session: Any) -> Generation:
        """Post one generation (`session` is an `aiohttp.ClientSession`)."""
        import aiohttp

        try:
            async with session.post(
                self.url, json=self.payload(request), timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as response:
                if response.status != 200:
                    text = await response.text()
                    raise GenerationFailed(f"upstream {self.url} answered HTTP {response.status}: {text[:200]}")
                body = await response.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise GenerationFailed(f"upstream {self.url} unreachable: {exc}") from exc
        return parse_generate_reply(body)


def parse_generate_reply(body: Any) -> Generation:
    """A `/generate` reply as a Generation (SGLang's layout: `output_ids`, `meta_info`)."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict) or not isinstance(body.get("output_ids"), list):
        raise GenerationFailed("upstream /generate reply has no output_ids list")
    ids = [int(i) for i in body["output_ids"]]
    meta = body.get("meta_info") or {}
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    pairs = meta.get("output_token_logprobs")
    logprobs = [float(p[0]) for p in pairs] if isinstance(pairs, list) and len(pairs) == len(ids) else None
    return Generation(ids, logprobs, "length" if kind == "length" else "stop")
