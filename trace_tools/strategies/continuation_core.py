"""The cumulative-token family, offline: every later turn continues from the ids already served.

slime PR #2287 (`preserve_reasoning_history`), verl's Continuous Token and rLLM's gateway
`cumulative_token_mode` all feed turn N+1 the exact ids of turn N (its prompt and its output) and
append only what the client added since, rendered as a suffix: render(history + new) with the
generation prompt, minus render(history) (slime's token diff over the real history). Sampled
tokens are never rendered again. Between the served output and that suffix sits the family's
junction (verl's per-family builders; the same rules as miles' TITO table, `families.TitoFamily`):
Qwen's newline after a final `<|im_end|>`, which the model never generates, is inserted; GLM's
stop token that opens the next message (`<|observation|>`, `<|user|>`) is dropped, as the suffix
renders it again; every other family joins as it is.

A request continues the served history when, after every echoed assistant is restored from the
server's copy (slime: aligned from the newest back, replaced whole, so a client that drops
reasoning or normalizes text and arguments never breaks it), it is that history plus new messages:

* `history`: a system, user or tool message of the history changed, went missing or moved, the
  request is no longer than the history, or its tools or template kwargs changed (verl's and
  rLLM's exact prefix check; slime looks at assistants only);
* `role`: an appended message is an assistant's (verl refuses it);
* `template`: the render of the history is not a prefix of the extended render (slime's "chat
  template rewrote messages", verl's "suffix diff failed").

What a break does is `on_break`: `raise` fails the request and keeps the served state (slime's
adapter answers it with an error; verl's agent loop raises), `reset` starts afresh from the
request's own prompt (rLLM's chat path), `fork` continues from the latest earlier turn the
request does extend, else resets.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from trace_tools.ids import starts_with
from trace_tools.render.base import RendererLike
from trace_tools.strategies.declarations import ON_BREAK
from trace_tools.strategies.session_core.tito import TitoTokenizer, family_for

BREAK_CAUSES = ("history", "role", "template")
# Every counter a session reports (zeros included); the breaks by cause and `junction_fixes` go
# to `extra_counters`, the rest are the shared counters of docs/metrics.md#per-session.
COUNTER_KEYS = (
    "healed_turns",
    "healed_prefix_tokens",
    "nonlinear",
    "nonlinear_history",
    "nonlinear_template",
    "resets",
    "restored_echoes",
    *(f"breaks_{cause}" for cause in BREAK_CAUSES),
    "junction_fixes",
)


@dataclass(slots=True)
class Served:
    """One turn the engine was fed: its history (request, echoes restored, then its response),
    prompt and output ids, and the tools and template kwargs of its request."""

    messages: list[dict]
    prompt_ids: list[int]
    output_ids: list[int]
    tools: list[dict] | None
    kwargs: dict[str, Any]


@dataclass(slots=True)
class Step:
    """How one request is served: `ids` to feed (None when it fails), the prompt event
    (`rendered`, `continued`, `forked`, `reset`, `failed`), the break behind a reset, fork or
    failure, and the request's messages as served (echoes restored)."""

    ids: list[int] | None
    event: str
    cause: str | None = None
    messages: list[dict] = field(default_factory=list)


def continued_messages(history: Sequence[dict], request: Sequence[dict]) -> tuple[list[dict], str | None, int]:
    """(the request with echoed assistants restored, the break cause or None, echoes restored).

    slime compares the latest echo's content and tool calls with the served response, but after
    the restore, so that check cannot fail; an echo is restored whatever it says."""
    k = len(history)
    if len(request) <= k:
        return [], "history", 0
    restored, count = list(request), 0
    for i in range(k):
        served, echo = history[i], request[i]
        if served.get("role") != echo.get("role"):
            return [], "history", 0
        if served.get("role") == "assistant":
            count += echo != served
            restored[i] = served
        elif echo != served:
            return [], "history", 0
    if any(m.get("role") == "assistant" for m in request[k:]):
        return [], "role", 0
    return restored, None, count


class Continuation:
    """One session's cumulative-token state over `renderer` (the upstream view of the renderer)."""

    def __init__(self, renderer: RendererLike, on_break: str):
        if on_break not in ON_BREAK:
            raise ValueError(f"on_break must be one of {', '.join(ON_BREAK)}, not {on_break!r}")
        self.renderer, self.on_break = renderer, on_break
        self.junction = TitoTokenizer(renderer, family_for(renderer))
        self.served: list[Served] = []  # the latest turn only, unless `fork` needs every one
        self.counters: Counter = Counter({key: 0 for key in COUNTER_KEYS})

    def step(self, prepared: Any) -> Step:
        """The ids to feed for one prepared turn (`pipeline.PreparedTurn`), and how they were made."""
        if not self.served:
            return Step(list(prepared.prompt_ids), "rendered", messages=list(prepared.messages))
        step = self._continue(self.served[-1], prepared)
        if step.ids is not None:
            return step
        cause = step.cause
        self._count_break(cause)
        if self.on_break == "raise":
            return Step(None, "failed", cause)
        if self.on_break == "fork":
            for base in reversed(self.served[:-1]):
                forked = self._continue(base, prepared)
                if forked.ids is not None:
                    forked.event, forked.cause = "forked", cause
                    return forked
        self.counters["resets"] += 1
        return Step(list(prepared.prompt_ids), "reset", cause, list(prepared.messages))

    def commit(self, prepared: Any, step: Step) -> None:
        """Hold a served turn: the next request continues from its prompt and output ids."""
        assert step.ids is not None, "a failed request is not served"
        closing = prepared.response_message or {"role": "assistant", "content": ""}
        served = Served(
            [*step.messages, closing],
            step.ids,
            list(prepared.turn.output_ids),
            list(prepared.tools) if prepared.tools else None,
            prepared.template_kwargs,
        )
        self.served = [*self.served, served] if self.on_break == "fork" else [served]

    def _continue(self, base: Served, prepared: Any) -> Step:
        """Continue `base` with the request's new messages, or a failed step naming the break."""
        restored, cause, count = continued_messages(base.messages, prepared.messages)
        tools = list(prepared.tools) if prepared.tools else None
        if cause is None and (tools != base.tools or prepared.template_kwargs != base.kwargs):
            cause = "history"
        if cause is not None:
            return Step(None, "failed", cause)
        render = getattr(self.renderer, "render_shared", self.renderer.render)  # no copy where it can
        before = render(base.messages, tools, False, **base.kwargs)
        after = render(restored, tools, True, **base.kwargs)
        if not starts_with(after, before):
            return Step(None, "failed", "template")
        served = len(base.prompt_ids) + len(base.output_ids)
        ids = self.junction.fix_boundary_in_place(base.prompt_ids + base.output_ids)
        self.counters["junction_fixes"] += len(ids) != served
        self.counters["restored_echoes"] += count
        self.counters["healed_turns"] += 1
        self.counters["healed_prefix_tokens"] += len(ids)
        ids += after[len(before) :]
        return Step(ids, "continued", None, restored)

    def _count_break(self, cause: str | None) -> None:
        self.counters["nonlinear"] += 1
        self.counters["nonlinear_template" if cause == "template" else "nonlinear_history"] += 1
        self.counters[f"breaks_{cause}"] += 1
