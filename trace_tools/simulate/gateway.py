"""The simulated gateway's prompt recording, and the ideal token sequences of a session.

Recording modes for `prompt_ids` (`trace_tools.history_mode` in the dump):

* `tree`: the gateway rendered the canonical (slime-translated) request messages in full;
* `linear`: the gateway healed: while the canonical request is an append-only extension of what
  it stored (dict equality, same tools) and the template renders the extension as a pure
  suffix, it fed `served prefix (previous prompt + output) + closing glue + the new tail`; on
  anything else it re-anchored on a full render. Written here from the agentcore description
  (not by calling the replay strategy), so replaying the linear strategy against it is a check
  between two implementations;
* `none`: no prompt ids.

The ideal sequences model a manager that knows the ground truth: one token sequence per genuine
branch, extended turn by turn with served ids, glue and the new messages' tail (the per-family
boundary rules of `trace_tools.render.boundary`: closer, stop-token overlap, stop token standing
in for the closer). When the template re-renders earlier turns (Qwen and GLM drop earlier
reasoning once a new user message arrives, gpt-oss drops analysis once a final answer is in the
history), the ideal still extends the served ids; the tail is the appended messages' rendering.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trace_tools.render.boundary import BoundaryUnverified, Closers, join, split_extension
from trace_tools.render.canonical import canonicalize_messages

RECORDINGS = ("tree", "linear", "none")


class Splicer:
    """Extends served ids by new messages: `served + glue + tail` (rules in `trace_tools.render.boundary`)."""

    def __init__(self, renderer: Any):
        self.renderer = renderer
        self._closers: Closers | None = None
        self._stop_ids = list(getattr(renderer, "stop_token_ids", None) or [])

    @property
    def closers(self) -> Closers:
        """The template's closers, probed once (no tools: the simulated templates close alike with them)."""
        if self._closers is None:
            self._closers = Closers.probe(self.renderer, None, {})
        return self._closers

    def extend(
        self, served: list[int], prev: list[dict], new: list[dict], tools: list[dict] | None, follow_rewrites: bool
    ) -> tuple[list[int] | None, bool]:
        """(extended ids, whether the template rewrote earlier messages).

        Without `follow_rewrites`, a rewrite gives None (a linear gateway cannot splice there).
        """
        before = self.renderer.render_text(prev, tools, False)
        after = self.renderer.render_text([*prev, *new], tools, True)
        rewrite = not after.startswith(before)
        if rewrite and not follow_rewrites:
            return None, True
        try:
            closer, tail, _ = split_extension(self.renderer, prev, new, tools, {}, self.closers)
        except BoundaryUnverified as exc:
            raise AssertionError(f"simulator bug: no verified boundary after a stored reply ({exc})") from exc
        glue, tail_ids = join(served, self.renderer.encode(closer), self.renderer.encode(tail), self._stop_ids)
        return served + glue + tail_ids, rewrite


@dataclass
class _Held:
    served: list[int]
    messages: list[dict]
    tools: list[dict] | None


class LinearGateway:
    """One session's healing state, as a `history_mode="linear"` gateway keeps it."""

    def __init__(self, renderer: Any):
        self.renderer, self.splicer = renderer, Splicer(renderer)
        self.held: _Held | None = None

    def prompt(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], str]:
        """(ids fed to the engine, "healed" | "rendered" | "reset")."""
        held = self.held
        if held is not None and messages[: len(held.messages)] == held.messages and tools == held.tools:
            ids, _ = self.splicer.extend(held.served, held.messages, messages[len(held.messages) :], tools, False)
            if ids is not None:
                return ids, "healed"
        return self.renderer.render(messages, tools, True), "rendered" if held is None else "reset"

    def commit(
        self,
        prompt_ids: list[int],
        output_ids: list[int],
        messages: list[dict],
        response: dict,
        tools: list[dict] | None,
    ) -> None:
        self.held = _Held(prompt_ids + output_ids, [*messages, response], tools)


class IdealSequences:
    """Per genuine branch, the one token sequence an ideal manager would train."""

    def __init__(self, renderer: Any):
        self.renderer, self.splicer = renderer, Splicer(renderer)
        self.branches: dict[str, _Held] = {}

    def turn(
        self,
        branch: str,
        messages: list[dict],
        tools: list[dict] | None,
        output_ids: list[int],
        response: dict,
        commit: bool,
    ) -> bool:
        """Account one turn on `branch` (canonical messages); returns whether the template rewrote history."""
        held = self.branches.get(branch)
        if held is None:
            prompt, rewrite = self.renderer.render(messages, tools, True), False
        else:
            if messages[: len(held.messages)] != held.messages:
                raise AssertionError(f"simulator bug: branch {branch} is not append-only")
            prompt, rewrite = self.splicer.extend(
                held.served, held.messages, messages[len(held.messages) :], tools, True
            )
        if commit:
            self.branches[branch] = _Held(prompt + output_ids, [*messages, response], tools)
        return rewrite

    def forwarded_tokens(self) -> int:
        return sum(len(held.served) for held in self.branches.values())


def canonical(messages: list[dict]) -> list[dict]:
    """What the gateway stores and renders: slime's translate of the request (docs/rendering.md#canonicalization)."""
    return canonicalize_messages(messages, "slime")
