"""The renderer contract every other layer codes against.

A renderer = tokenizer + chat template (+ default kwargs) + response parser. The real
implementation is `trace_tools.render.renderer.Renderer`; tests may pass any object with these
methods (e.g. a fake renderer over a toy vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence


@dataclass(slots=True)
class ParsedResponse:
    """An assistant message parsed from generated text, in OpenAI chat format.

    `message` = {"role": "assistant", "content": str, ["reasoning_content": str],
    ["tool_calls": [{"type": "function", "function": {"name": str, "arguments": dict}}]]}.
    `ill_formed` is True when a tool call could not be parsed (its raw text is kept).
    """

    message: dict[str, Any]
    ill_formed: bool = False
    errors: list[str] = field(default_factory=list)


class RendererLike(Protocol):
    """What strategies, the simulator and reconstruction need from a renderer."""

    vocab_size: int

    def render(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        """Token ids, equal to `tokenizer.apply_chat_template(..., tokenize=True)`."""

    def render_text(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The rendered text (no tokenization)."""

    def encode(self, text: str) -> list[int]:
        """Encode text with every special/added token recognised, no BOS/EOS added."""

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids keeping special tokens."""

    def parse_response(self, output_ids: Sequence[int], tools: Sequence[dict] | None = None) -> ParsedResponse:
        """Parse generated ids (stop token included) into an assistant message."""
