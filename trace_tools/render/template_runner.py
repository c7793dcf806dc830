"""transformers' `render_jinja_template`, with its per-call costs paid once per message.

Replay renders thousands of short windows per session over the same message objects. On every
call transformers rebuilds each message for the template (`_normalize_chat_messages`,
`_plain_template_data`, `_alias_reasoning_fields`: each a map over the messages, one message at
a time), rebuilds the tool schemas, and its Jinja sandbox works out again, for every attribute
the template reads, whether reading it is safe. Here:

* a message's template form is built by those same transformers functions, once, and memoised by
  object identity until `reset()` (messages are never mutated once built; see `incremental`);
* the sandbox's verdict is memoised per (type, attribute name), the only things it depends
  on, and a key read as an attribute of a plain dict (`message.content`) is looked up
  directly, as the sandbox ends up doing after its attribute lookup fails;
* the template is compiled in an overlay of transformers' own environment, so its filters,
  globals, extensions and options are transformers'.

`TemplateRunner.build` returns None where this transformers renders differently (its functions
are missing, or a probe conversation renders otherwise than `render_jinja_template` does), and
the renderer then uses `render_jinja_template` itself.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from jinja2.sandbox import ImmutableSandboxedEnvironment

_DICT_ATTRIBUTES = frozenset(dir(dict))
_PROBES: list[tuple[list[dict], list[dict] | None]] = [
    (
        [
            {"role": "system", "content": "s", "name": None},
            {"role": "user", "content": "u"},
            {
                "role": "assistant",
                "content": "a",
                "reasoning_content": "r",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}],
            },
            {"role": "tool", "content": "t", "tool_call_id": None},
            {"role": "assistant", "content": "b", "thinking": "q"},
        ],
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    ),
    ([{"role": "user", "content": [{"type": "text", "text": "u"}]}], None),
]


class _CheapSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with its per-attribute verdicts memoised per type.

    The sandbox decides from `isinstance` checks on the object and the attribute's name alone,
    so the verdict is a function of (type, name) for any object that does not claim another class.
    """

    _verdicts: dict[tuple[type, str], bool] = {}

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            # A plain dict has no instance attributes: the sandbox's attribute lookup would fail
            # and it would subscript, exactly as here.
            try:
                return obj[attribute]
            except LookupError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        kind = type(obj)
        if obj.__class__ is not kind:  # isinstance() would consult the claimed class too
            return super().is_safe_attribute(obj, attr, value)
        verdict = self._verdicts.get((kind, attr))
        if verdict is None:
            verdict = self._verdicts[kind, attr] = super().is_safe_attribute(obj, attr, value)
        return verdict


class TemplateRunner:
    """Renders one chat template as `render_jinja_template` does; `variables` are the extra
    template variables (the special-token map) that `apply_chat_template` passes."""

    def __init__(self, chat_template: str, variables: dict, steps: dict[str, Callable], fallback: Callable[..., str]):
        self._steps, self._fallback = steps, fallback
        compiled = steps["compile"](chat_template)
        env = compiled.environment
        self._json: dict[tuple, tuple[Any, str]] = {}
        if type(env) is ImmutableSandboxedEnvironment:
            overlay = env.overlay()
            overlay.__class__ = _CheapSandbox
            overlay.filters = {**env.filters, "tojson": self._memoised_json(env.filters["tojson"])}
            compiled = overlay.from_string(chat_template)
        self._template = compiled
        self._variables = dict(variables)
        self.reset()

    @classmethod
    def build(cls, chat_template: str, variables: dict, reference: Callable[..., str]) -> "TemplateRunner | None":
        """A runner, or None when it cannot be shown to render as `reference` does."""
        try:
            from transformers.utils import chat_template_utils as ctu

            steps = {
                "compile": ctu._compile_jinja_template,
                "normalize": ctu._normalize_chat_messages,
                "plain": ctu._plain_template_data,
                "alias": ctu._alias_reasoning_fields,
            }
            runner = cls(chat_template, variables, steps, reference)
        except (ImportError, AttributeError):
            return None
        for messages, tools in _PROBES:
            for generation in (False, True):
                try:
                    same = runner(messages, tools, generation, {}) == reference(messages, tools, generation, {})
                except Exception:
                    same = False
                if not same:
                    return None
        runner.reset()
        return runner

    def reset(self) -> None:
        """Forget the memoised messages, tools and JSON texts (between sessions)."""
        self._messages: dict[int, tuple[Any, dict]] = {}
        self._tools: dict[tuple[int, ...], tuple[Sequence, Any]] = {}
        self._json.clear()

    def _memoised_json(self, tojson: Callable[..., str]) -> Callable[..., str]:
        """The template's `tojson` filter, memoised by the identity of what it serialises: the
        same tool schemas are written into every full render of a session's system prompt."""

        def memoised(value: Any, *args: Any, **kwargs: Any) -> str:
            key = (id(value), args, tuple(kwargs.items()))
            try:
                hit = self._json.get(key)
            except TypeError:  # an unhashable option (a list of separators): nothing to share
                return tojson(value, *args, **kwargs)
            if hit is None or hit[0] is not value:
                hit = self._json[key] = (value, tojson(value, *args, **kwargs))
            return hit[1]

        return memoised

    def __call__(self, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool, kwargs: dict) -> str:
        if tools is not None and not all(isinstance(tool, dict) for tool in tools):
            return self._fallback(messages, tools, generation, kwargs)  # it reports what is wrong
        plain = self._steps["plain"]
        return self._template.render(
            messages=[self._message(message) for message in messages],
            tools=self._tool_schemas(tools),
            documents=None,
            add_generation_prompt=generation,
            **plain({**self._variables, **kwargs}),
        )

    def _message(self, message: Any) -> dict:
        hit = self._messages.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        steps = self._steps
        form = steps["alias"]([steps["plain"](steps["normalize"]([message])[0])])[0]
        self._messages[id(message)] = (message, form)
        return form

    def _tool_schemas(self, tools: Sequence[dict] | None) -> Any:
        if tools is None:
            return None
        key = tuple(map(id, tools))
        hit = self._tools.get(key)
        if hit is None:
            hit = self._tools[key] = (tools, self._steps["plain"](list(tools)))
        return hit[1]
