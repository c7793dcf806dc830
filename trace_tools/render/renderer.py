"""The renderer: tokenizer + chat template (+ default kwargs) + a parser for the template's tool calls.

`render` is transformers' `apply_chat_template(..., tokenize=True)` with the same template: the
text is `apply_chat_template(tokenize=False)`'s (transformers' input normalisation included:
None-valued keys dropped, reasoning fields aliased), rendered by a `TemplateRunner` that is used
only where probe conversations show it renders exactly what transformers renders
(`template_runner`), and the ids come from encoding that text without special-token additions,
which is what `apply_chat_template` does. Replay renders the same histories over and
over, so both happen incrementally (`trace_tools.render.incremental`): a conversation that extends
one already rendered renders only a short window around its new messages and encodes only the
text after the last shared special token, with every shortcut checked and a full render where
a check fails.

Those shortcuts are the fast path. `RenderSpec.path` (`--reference`, `--verify`) switches to
transformers end to end (`apply_chat_template` on the whole conversation, transformers' tokenizer
for every encode and decode), or runs both and compares every result (`render.spec.RENDER_PATHS`).
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Sequence

from trace_tools.data import DumpMeta
from trace_tools.errors import ReplayError, TemplateLimitExceeded, TemplateUnusable, TraceToolsError, UnknownName
from trace_tools.ids import starts_with
from trace_tools.io.cache import CacheKey, code_digest
from trace_tools.render import families
from trace_tools.render.base import ParsedResponse
from trace_tools.render.incremental import IncrementalRenderer
from trace_tools.render.limits import TemplateLimitHit, TemplateLimits, limited, not_counted
from trace_tools.render.parser import parse_response_text
from trace_tools.render.spec import RENDER_PATHS, RenderSpec
from trace_tools.render.template_runner import TemplateRunner, build_runner, precompile, sized_transformers
from trace_tools.render.tokenizer import Tokenizer, import_transformers, load_tokenizer

_PROBE = [{"role": "user", "content": "probe"}]
_DETECT = object()  # Renderer(family=...) not given: detect it from the template


class TemplateFailed(ReplayError):
    """The chat template raised on some messages (`raise_exception` or a Jinja error).

    `reason` is the template's own message, the same for every request it refuses."""

    def __init__(self, template: str, message: str):
        self.reason = message
        super().__init__(f"chat template {template} failed: {message}")


class Renderer:
    """Implements `trace_tools.render.base.RendererLike` for a real tokenizer and Jinja template."""

    def __init__(
        self,
        tokenizer: Tokenizer | str,
        chat_template: str,
        template_kwargs: dict | None = None,
        template_identity: str = "",
        parser: str | None = None,
        render_date: str | None = None,
        limits: TemplateLimits | None = None,
        path: str = "fast",
        family: Any = _DETECT,
    ):
        """`family`: the model family when the caller resolved it already (`RenderSpec.family`);
        by default it is detected from the template."""
        if parser is not None and parser not in families.TOOL_FORMATS:
            raise UnknownName("tool-call format", parser, families.TOOL_FORMATS)
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})
        self.template_identity = template_identity
        self._parser, self.render_date = parser, render_date
        self.limits = limits or TemplateLimits.from_env()
        known = families.resolve_family(chat_template, parser) if family is _DETECT else family
        self.tool_format = parser or (known.tool_format if known else None)
        self._family = known
        self.family = known.name if known else "unknown"
        self.stop_tokens = known.stop_tokens if known else families.DEFAULT_STOP_TOKENS
        self._rendered_template = families.pin_clock(chat_template, render_date)
        self._text_arguments = families.concatenates_arguments(chat_template)
        if path not in RENDER_PATHS:
            raise UnknownName("render path", path, RENDER_PATHS)
        self.path = path
        self.engine = IncrementalRenderer(
            self._apply_template, self.tokenizer.encode, self.tokenizer.hard_boundaries, verdict_path=self._verdict_path
        )
        self._reasoning_open: dict[str, bool] = {}
        self._jinja: Any = None  # the template as a function: a TemplateRunner, or transformers' own
        self._guarded: Any = None  # the same, under the template limits
        self._reference: Any = None  # transformers' apply_chat_template, under the template limits
        self._encoded: OrderedDict[str, list[int]] = OrderedDict()

    def __reduce__(self):
        # Picklable for process pools: ship the recipe, not the caches and locks.
        return (
            Renderer,
            (
                self.tokenizer,
                self.chat_template,
                self.template_kwargs,
                self.template_identity,
                self._parser,
                self.render_date,
                self.limits,
                self.path,
            ),
        )

    @classmethod
    def from_spec(
        cls,
        tokenizer: str | None,
        chat_template: str | None = None,
        dump_meta: DumpMeta | None = None,
        template_kwargs: dict | None = None,
        tool_format: str | None = None,
    ) -> "Renderer":
        """Resolve names the way the CLI does: options first, then the dump's own metadata
        (`RenderSpec.resolve`), and build the renderer.

        `tool_format` overrides the format detected from the template (`--tool-format`); the
        dump's `trace_tools.render_date` pins the date a template stamps into its prompts.
        """
        spec = RenderSpec.resolve(tokenizer, chat_template, dump_meta, template_kwargs, tool_format)
        return cls.from_render_spec(spec)

    @classmethod
    def from_render_spec(cls, spec: RenderSpec) -> "Renderer":
        return cls(
            spec.tokenizer,
            spec.template,
            template_kwargs=json.loads(spec.template_kwargs),
            template_identity=spec.template_identity,
            parser=spec.tool_format,
            render_date=spec.render_date,
            limits=spec.limits,
            path=spec.path,
            family=spec.family,
        )

    @property
    def spec(self) -> RenderSpec:
        """Every input this renderer reads (`render.spec`), with the family this renderer already
        resolved (the spec's cached `family`), so run.json's identity does not detect it again."""
        spec = RenderSpec(
            self.tokenizer.name,
            self.chat_template,
            self.template_identity,
            json.dumps(self.template_kwargs, sort_keys=True, default=repr),
            self._parser,
            self.render_date,
            self.limits,
            self.path,
        )
        spec.__dict__["family"] = self._family  # functools.cached_property's own slot
        return spec

    # -- RendererLike -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def render(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        return list(self.render_shared(messages, tools, add_generation_prompt, **template_kwargs))

    def render_shared(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        """`render` without the copy: the cached list itself, which callers must not modify."""
        arguments = (messages, tools or None, add_generation_prompt, {**self.template_kwargs, **template_kwargs})
        return self._on_path("ids", self.engine.ids, self._reference_ids, arguments)

    def render_text(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        arguments = (messages, tools or None, add_generation_prompt, {**self.template_kwargs, **template_kwargs})
        return self._on_path("text", self.engine.text, self._reference_text, arguments)

    def preload(self) -> None:
        """Build the tokenizer's encoder (0.15 s for a built-in tokenizer's) and compile the template
        (`template_runner.precompile`) now, rendering nothing, so that no thread starts: worker
        processes forked afterwards (`replay.engine`, `reconstruct.workers`) share both instead of
        each building its own."""
        self.tokenizer.encode("")
        if self.path != "reference":
            try:
                precompile(self._rendered_template, self.limits.output)
            except (Exception, TemplateLimitHit):
                pass  # compiled again where it is checked (`check_template`), which says what is wrong

    def reset_caches(self) -> None:
        """Drop the incremental render caches (the pipeline calls this between sessions)."""
        self.engine.reset()
        self._encoded.clear()
        if isinstance(self._jinja, TemplateRunner):
            self._jinja.reset()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (a copy: the strategies encode the same closers and tails again and
        again, so encodings are memoised in a small per-renderer LRU)."""
        return list(self._on_path("encode", self._encode_memoised, self.tokenizer.encode_reference, (text,)))

    def encode_growing(self, text: str) -> list[int]:
        """`encode` of a text that usually extends the previous one passed here (AReaL's ChatML
        text of a whole conversation, a turn longer each call): the ids of the part the two share,
        up to its last hard boundary, are reused (`IncrementalRenderer.encode_text`). The list is
        shared: callers must not modify it."""
        return self._on_path("encode", self.engine.encode_text, self.tokenizer.encode_reference, (text,))

    def _encode_memoised(self, text: str) -> list[int]:
        ids = self._encoded.get(text)
        if ids is None:
            ids = self.tokenizer.encode(text)
            self._encoded[text] = ids
            if len(self._encoded) > 4096:
                self._encoded.pop(next(iter(self._encoded)))
        else:
            self._encoded.move_to_end(text)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._on_path("decode", self.tokenizer.decode, self.tokenizer.decode_reference, (ids,))

    def parse_response(
        self, output_ids: Sequence[int], tools: Sequence[dict] | None = None, **template_kwargs: Any
    ) -> ParsedResponse:
        return parse_response_text(
            self.decode(output_ids),
            fmt=self.tool_format,
            tools=tools,
            reasoning_open=self.reasoning_open(**template_kwargs),
            stop_strings=self.stop_tokens,
        )

    # -- beyond the protocol --------------------------------------------------------------------
    @property
    def text_arguments(self) -> bool:
        """True when the template joins tool-call arguments to text, so dict arguments raise in it
        and every render here passes them as JSON text (`families.template_messages`)."""
        return self._text_arguments

    def render_text_as_given(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """One full render of `messages` exactly as given: tool-call arguments are not turned into
        text and no cache is used. Raises what the template raises (e.g. the TypeError of a
        template that concatenates dict arguments), as `apply_chat_template` would."""
        kwargs = {**self.template_kwargs, **template_kwargs}
        call = (list(messages), list(tools) if tools else None, add_generation_prompt, kwargs)
        text = self._template_fn()(*call)
        if self.path == "verify":
            return self._checked("text", text, lambda: self._reference_fn()(*call))
        return text

    def render_delta(
        self, prev: Sequence[dict], new: Sequence[dict], tools: Sequence[dict] | None = None, **template_kwargs: Any
    ) -> list[int] | None:
        """Ids D with `render(prev, gen=False) + D == render(prev + new, gen=True)`, or None.

        None when the extended render does not start with the prefix's (the template rewrites
        history, e.g. Qwen3 dropping earlier reasoning) or when tokenizing the extension splits
        differently at the boundary than the prefix alone.
        """
        prefix = self.render_shared(prev, tools, False, **template_kwargs)
        full = self.render_shared([*prev, *new], tools, True, **template_kwargs)
        if not starts_with(full, prefix):
            return None
        prefix_text = self.render_text(prev, tools, False, **template_kwargs)
        if not self.render_text([*prev, *new], tools, True, **template_kwargs).startswith(prefix_text):
            return None
        return full[len(prefix) :]

    @property
    def generation_prompt_tokens(self) -> int:
        """How many tokens the generation prompt adds (e.g. `<|im_start|>assistant\n<think>\n`)."""
        if not hasattr(self, "_generation_prompt_tokens"):
            with_prompt = self.encode(self._apply_template(_PROBE, None, True, self.template_kwargs))
            without = self.encode(self._apply_template(_PROBE, None, False, self.template_kwargs))
            self._generation_prompt_tokens = max(len(with_prompt) - len(without), 0)
        return self._generation_prompt_tokens

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
        ids = [self.tokenizer.token_to_id(t) for t in self.stop_tokens]
        return [i for i in ids if i is not None]

    @property
    def eos_token_id(self) -> int | None:
        ids = self.stop_token_ids
        return ids[0] if ids else None

    @property
    def identity(self) -> dict[str, Any]:
        return self.spec.identity()

    def cache_info(self) -> dict[str, int]:
        """What the incremental engine did: renders by path, fallbacks by reason, tokens encoded/reused."""
        return dict(self.engine.stats)

    def _verdict_path(self) -> Path:
        return self._check_path("rules", self._text_arguments)

    def _runner_verdict_path(self) -> Path:
        return self._check_path("native")

    def _check_path(self, kind: str, *parts: Any) -> Path:
        """Where a verdict about this template is kept: keyed by the template, its variables, the
        render layer's source and the library versions (`io.cache`)."""
        inputs = (self._rendered_template, self.tokenizer.special_tokens_map, *parts)
        key = CacheKey("render-checks", kind, inputs, code_digest("render"), ("transformers", "jinja2"))
        return key.path(".json")

    def _guard(self, render: Any) -> Any:
        """`render` under the template limits (`render.limits`)."""
        return limited(render, limits=self.limits, template=self.template_identity or "(inline)")

    def _template_fn(self) -> Any:
        """The template as a function, run under the template limits: the fast runner, or on the
        reference path transformers' `apply_chat_template` itself."""
        if self.path == "reference":
            return self._reference_fn()
        if self._guarded is None:
            self._jinja = _jinja_renderer(
                self.tokenizer, self._rendered_template, self._runner_verdict_path(), self.limits.output, self._guard
            )
            self._guarded = self._guard(self._jinja)
        return self._guarded

    def _reference_fn(self) -> Any:
        if self._reference is None:
            template = self._rendered_template
            with not_counted():  # loading transformers' tokenizer is not the template's work
                self.tokenizer.hf
                render = transformers_template(self.tokenizer, template)
                render = sized_transformers(render, template, self.limits.output)
            self._reference = self._guard(render)
        return self._reference

    def _apply_template(
        self, messages: Sequence[dict], tools: Sequence[dict] | None, add_generation_prompt: bool, kwargs: dict
    ) -> str:
        return self._run(self._template_fn(), messages, tools, add_generation_prompt, kwargs)

    def _reference_text(
        self, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool, kwargs: dict
    ) -> str:
        self.engine.stats["reference_renders"] += 1
        return self._run(self._reference_fn(), messages, tools, generation, kwargs)

    def _reference_ids(
        self, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool, kwargs: dict
    ) -> list[int]:
        """`apply_chat_template(tokenize=True)`'s ids: transformers' render, encoded by its tokenizer."""
        return self.tokenizer.encode_reference(self._reference_text(messages, tools, generation, kwargs))

    def _on_path(self, what: str, fast: Callable[..., Any], reference: Callable[..., Any], arguments: tuple) -> Any:
        """`fast(*arguments)` or `reference(*arguments)` as the render path says; `verify` runs
        both and compares them (`_checked`)."""
        if self.path == "reference":
            return reference(*arguments)
        result = fast(*arguments)
        if self.path == "verify":
            return self._checked(what, result, lambda: reference(*arguments))
        return result

    def _checked(self, what: str, fast: Any, reference: Callable[[], Any]) -> Any:
        """`--verify`: the fast result compared with the reference one; a difference is counted
        under `verify:<what>_differs` and the reference result is used."""
        expected = reference()
        self.engine.stats["verify:checked"] += 1
        if fast == expected:
            return fast
        self.engine.stats[f"verify:{what}_differs"] += 1
        return expected

    def _run(self, template: Any, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool, kwargs):
        from jinja2 import TemplateError

        try:
            return template(
                families.template_messages(messages, self._text_arguments),
                list(tools) if tools else None,
                generation,
                kwargs,
            )
        except TemplateError as exc:
            raise TemplateFailed(self.template_identity or "(inline)", str(exc)) from exc


def verify_summary(stats: dict[str, int]) -> dict[str, Any]:
    """`--verify`'s counters (`Renderer._checked`): fast results compared with
    transformers' own, and per kind of result (ids, text, encode, decode) how many differed."""
    differing = {
        key.split(":", 1)[1].removesuffix("_differs"): int(value)
        for key, value in sorted(stats.items())
        if key.startswith("verify:") and key.endswith("_differs")
    }
    return {
        "checked": int(stats.get("verify:checked", 0)),
        "differences": sum(differing.values()),
        "by_kind": differing,
    }


def transformers_template(tokenizer: Tokenizer, chat_template: str) -> Callable[..., str]:
    """The template as transformers renders it: `apply_chat_template(tokenize=False)`."""

    def render(messages, tools, generation, kwargs):
        return tokenizer.hf.apply_chat_template(
            messages,
            tools=tools,
            chat_template=chat_template,
            add_generation_prompt=generation,
            tokenize=False,
            **kwargs,
        )

    return render


def _jinja_renderer(tokenizer: Tokenizer, chat_template: str, verdict: Path | None, size_limit: int, guard: Any):
    """`apply_chat_template(tokenize=False)`'s text, without its per-call overhead.

    A `TemplateRunner` renders where it reproduces transformers on probe conversations (its
    verdict is kept at `verdict`, so a later process need not import transformers at all).
    Otherwise transformers' steps are replayed with its own functions (message normalisation,
    then `render_jinja_template` with the special-token map as template variables), or, where
    this transformers lacks them, `apply_chat_template` itself is used; so is it for a
    tokenizer directory whose own special-token map a probe shows is not reproduced (the
    built-in tokenizers' map is known, which spares building a transformers tokenizer in every
    worker).
    """
    specials = tokenizer.special_tokens_map
    reference = transformers_template(tokenizer, chat_template)

    @functools.cache
    def transformers_render():
        # Built inside a render when our runner hands it data that is not plain JSON: importing
        # and compiling are not the template's work.
        with not_counted():
            return _transformers_render()

    def _transformers_render():
        import_transformers()
        sized_reference = sized_transformers(reference, chat_template, size_limit)
        try:
            from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template
        except ImportError:
            return sized_reference

        def direct(messages, tools, generation, kwargs):
            rendered, _ = render_jinja_template(
                conversations=[_normalize_chat_messages(messages)],
                tools=tools,
                documents=None,
                chat_template=chat_template,
                return_assistant_tokens_mask=False,
                continue_final_message=False,
                add_generation_prompt=generation,
                **{**specials, **kwargs},
            )
            return rendered[0]

        sized_direct = sized_transformers(direct, chat_template, size_limit)
        if tokenizer.builtin:
            return sized_direct
        tokenizer.hf  # loaded before the probes are timed
        probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u", "name": None}]
        try:
            same = all(
                guard(sized_direct)(probe, None, g, {}) == guard(sized_reference)(probe, None, g, {})
                for g in (False, True)
            )
        except Exception:
            same = False
        return sized_direct if same else sized_reference

    return (
        build_runner(chat_template, specials, transformers_render, verdict, size_limit, guard) or transformers_render()
    )


_PROBE = [{"role": "user", "content": "Hello"}]


def check_template(spec: RenderSpec) -> None:
    """The template compiles and renders a one-message conversation within its limits; otherwise
    every session would fail the same way, so this raises `TemplateUnusable` or
    `TemplateLimitExceeded` (exit 2) with the template's own error."""
    try:
        Renderer.from_render_spec(spec).render_text(_PROBE, None, True)
    except TemplateLimitHit as hit:
        raise TemplateLimitExceeded(str(hit)) from None
    except TraceToolsError as error:
        if not isinstance(error, ReplayError):
            raise  # a tokenizer that does not load, say: its own message
        raise TemplateUnusable(_unusable(spec, getattr(error, "reason", str(error)), error.__cause__)) from None
    except Exception as error:  # a template may raise anything: a TypeError, a RecursionError, ...
        raise TemplateUnusable(_unusable(spec, f"{type(error).__name__}: {error}", error)) from None


def _unusable(spec: RenderSpec, error: str, cause: BaseException | None) -> str:
    line = getattr(cause, "lineno", None)  # a syntax error knows where
    return (
        f"chat template {spec.template_identity} fails on a one-message conversation, so it would fail "
        f"every session: {error}{f' (line {line})' if line else ''}; fix the template or pass --chat-template"
    )
