"""The renderer: tokenizer + chat template (+ default kwargs) + a parser for the template's tool calls.

`render` is, by construction, transformers' `apply_chat_template(..., tokenize=True)` with the same
template: the text comes from `apply_chat_template(tokenize=False)` on a `PreTrainedTokenizerFast`
built from the same tokenizer.json (so transformers' input normalisation applies: None-valued keys
dropped, reasoning fields aliased), and the ids from encoding that text without special-token
additions, which is what `apply_chat_template` does. Results are memoised on a canonical JSON of
the inputs because replay renders the same prefixes over and over.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Sequence

from trace_tools.data import DumpMeta
from trace_tools.errors import ReplayError, TraceToolsError
from trace_tools.render.base import ParsedResponse
from trace_tools.render.parser import parse_response_text
from trace_tools.render.templates import resolve_template
from trace_tools.render.tokenizer import STOP_TOKENS, Tokenizer, load_tokenizer

# tool-call format -> family name of the templates that use it
FAMILIES = {"json": "qwen3", "xml": "qwen3.5"}
_PROBE = [{"role": "user", "content": "probe"}]


def detect_tool_format(template: str) -> str | None:
    """`xml` for `<function=NAME>` templates (Qwen3-Coder/3.5), `json` for `{"name": ...}` ones (Qwen3)."""
    if "<function=" in template:
        return "xml"
    if "<tool_call>" in template and '"name"' in template:
        return "json"
    return None


class _LRU:
    """A small thread-safe LRU map (functools.lru_cache cannot key on unhashable messages)."""

    def __init__(self, maxsize: int):
        self.maxsize, self._data, self._lock = maxsize, OrderedDict(), threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: str) -> Any:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
            self.misses += 1
            return None

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)


class Renderer:
    """Implements `trace_tools.render.base.RendererLike` for a real tokenizer and Jinja template."""

    def __init__(self, tokenizer: Tokenizer | str, chat_template: str, template_kwargs: dict | None = None,
                 template_identity: str = "", parser: str | None = None, cache_size: int = 2048):
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})
        self.template_identity = template_identity
        self._parser, self._cache_size = parser, cache_size
        self.tool_format = parser or detect_tool_format(chat_template)
        self.family = FAMILIES.get(self.tool_format or "", "unknown")
        self._text_cache, self._ids_cache = _LRU(cache_size), _LRU(cache_size)
        self._reasoning_open: dict[str, bool] = {}

    def __reduce__(self):
        # Picklable for process pools: ship the recipe, not the caches and locks.
        return (Renderer, (self.tokenizer, self.chat_template, self.template_kwargs, self.template_identity,
                           self._parser, self._cache_size))

    @classmethod
    def from_spec(cls, tokenizer: str | None, chat_template: str | None = None, dump_meta: DumpMeta | None = None,
                  template_kwargs: dict | None = None) -> "Renderer":
        """Resolve names the way the CLI does: options first, then the dump's own metadata."""
        name = tokenizer or (dump_meta.tokenizer if dump_meta else None)
        if not name:
            raise TraceToolsError("no tokenizer: the dump names none (`trace_tools.tokenizer`); "
                                  "pass `--tokenizer qwen3|qwen3.5|PATH`")
        tokenizer_obj = load_tokenizer(name)  # first, so a wrong name is reported as a tokenizer, not a template
        text, identity = resolve_template(chat_template, tokenizer_name=name,
                                          dump_template=dump_meta.chat_template if dump_meta else None)
        return cls(tokenizer_obj, text, template_kwargs=template_kwargs, template_identity=identity)

    # -- RendererLike -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def render(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
               add_generation_prompt: bool = True, **template_kwargs: Any) -> list[int]:
        key = _cache_key(messages, tools, add_generation_prompt, {**self.template_kwargs, **template_kwargs})
        cached = self._ids_cache.get(key) if key else None
        if cached is None:
            cached = tuple(self.encode(self.render_text(messages, tools, add_generation_prompt, **template_kwargs)))
            if key:
                self._ids_cache.put(key, cached)
        return list(cached)

    def render_text(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                    add_generation_prompt: bool = True, **template_kwargs: Any) -> str:
        kwargs = {**self.template_kwargs, **template_kwargs}
        key = _cache_key(messages, tools, add_generation_prompt, kwargs)
        text = self._text_cache.get(key) if key else None
        if text is None:
            text = self._apply_template(messages, tools, add_generation_prompt, kwargs)
            if key:
                self._text_cache.put(key, text)
        return text

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def parse_response(self, output_ids: Sequence[int], tools: Sequence[dict] | None = None,
                       **template_kwargs: Any) -> ParsedResponse:
        return parse_response_text(self.decode(output_ids), fmt=self.tool_format, tools=tools,
                                   reasoning_open=self.reasoning_open(**template_kwargs), stop_strings=STOP_TOKENS)

    # -- beyond the protocol --------------------------------------------------------------------
    def render_delta(self, prev: Sequence[dict], new: Sequence[dict], tools: Sequence[dict] | None = None,
                     **template_kwargs: Any) -> list[int] | None:
        """Ids D with `render(prev, gen=False) + D == render(prev + new, gen=True)`, or None.

        None when the extended text does not start with the prefix text (the template rewrites
        history, e.g. Qwen3 dropping earlier reasoning) or when tokenizing the tail alone would
        split differently at the boundary than tokenizing the whole text.
        """
        prefix_text = self.render_text(prev, tools, False, **template_kwargs)
        full_text = self.render_text([*prev, *new], tools, True, **template_kwargs)
        if not full_text.startswith(prefix_text):
            return None
        tail = full_text[len(prefix_text):]
        delta = self.encode(tail)
        prefix_ids = self.render(prev, tools, False, **template_kwargs)
        return delta if self._boundary_ok(prefix_text, prefix_ids, tail, delta) else None

    def _boundary_ok(self, prefix_text: str, prefix_ids: list[int], tail: str, delta: list[int]) -> bool:
        # Added tokens are hard boundaries for the tokenizer: text before one is tokenized
        # independently of text after it. So it suffices to re-encode from the last added token of
        # the prefix through the tail and compare; without one, compare the whole encoding.
        start = self._last_hard_boundary(prefix_text)
        if start is None:
            return self.encode(prefix_text + tail) == prefix_ids + delta
        window = self.encode(prefix_text[start:])
        if prefix_ids[len(prefix_ids) - len(window):] != window:
            return False
        return self.encode(prefix_text[start:] + tail) == window + delta

    def _last_hard_boundary(self, text: str) -> int | None:
        positions = [text.rfind(token) for token in self._special_strings()]
        best = max(positions, default=-1)
        return best if best >= 0 else None

    def _special_strings(self) -> tuple[str, ...]:
        if not hasattr(self, "_specials"):
            decoder = self.tokenizer.backend.get_added_tokens_decoder()
            self._specials = tuple(t.content for t in decoder.values() if t.special)
        return self._specials

    def reasoning_open(self, **template_kwargs: Any) -> bool:
        """True when the generation prompt ends inside `<think>` (e.g. Qwen3.5's think template)."""
        kwargs = {**self.template_kwargs, **template_kwargs}
        key = json.dumps(kwargs, sort_keys=True, default=repr)
        if key not in self._reasoning_open:
            try:
                text = self._apply_template(_PROBE, None, True, kwargs)
            except ReplayError:
                text = ""
            self._reasoning_open[key] = text.endswith("<think>\n")
        return self._reasoning_open[key]

    @property
    def stop_token_ids(self) -> list[int]:
        ids = [self.tokenizer.token_to_id(t) for t in STOP_TOKENS]
        return [i for i in ids if i is not None]

    @property
    def eos_token_id(self) -> int | None:
        ids = self.stop_token_ids
        return ids[0] if ids else None

    @property
    def identity(self) -> dict[str, Any]:
        import tokenizers

        from trace_tools.render.tokenizer import import_transformers

        transformers = import_transformers()
        return {"tokenizer": self.tokenizer.name, "template": self.template_identity,
                "template_kwargs": self.template_kwargs, "tool_format": self.tool_format,
                "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}

    def cache_info(self) -> dict[str, int]:
        return {"text_hits": self._text_cache.hits, "text_misses": self._text_cache.misses,
                "ids_hits": self._ids_cache.hits, "ids_misses": self._ids_cache.misses}

    def _apply_template(self, messages: Sequence[dict], tools: Sequence[dict] | None,
                        add_generation_prompt: bool, kwargs: dict) -> str:
        from jinja2 import TemplateError

        try:
            return self.tokenizer.hf.apply_chat_template(
                list(messages), tools=list(tools) if tools else None, chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)
        except TemplateError as exc:
            raise ReplayError(f"chat template {self.template_identity or '(inline)'} failed: {exc}") from exc


def _cache_key(messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool, kwargs: dict) -> str | None:
    # Key order is kept (templates serialise dicts in insertion order); non-JSON inputs skip the cache.
    try:
        return json.dumps([messages, tools, generation, kwargs], ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return None
