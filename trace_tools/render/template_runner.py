"""transformers' `render_jinja_template`, with its per-call costs paid once per message.

Replay renders thousands of short windows per session over the same message objects. On every
call transformers rebuilds each message for the template (`_normalize_chat_messages`,
`_plain_template_data`, `_alias_reasoning_fields`: each a map over the messages, one message at
a time), rebuilds the tool schemas, and its Jinja sandbox works out again, for every attribute
the template reads, whether reading it is safe. Here:

* a message's template form is built once and memoised by object identity until `reset()`
  (canonical messages are frozen, `render.canonical.freeze`, so a form never goes stale);
* the sandbox's verdict is memoised per (type, attribute name), the only things it depends
  on, and a key read as an attribute of a plain dict (`message.content`) is looked up
  directly, as the sandbox ends up doing after its attribute lookup fails.

Two ways to build the template and the message forms, each used only where probe
conversations render exactly as `render_jinja_template` renders them:

* **native** (`NativeSteps`): our own environment with the options, filters, globals and
  `{% generation %}` tag that transformers gives its chat templates, and our own message
  preparation for plain JSON data (None-valued keys dropped, reasoning aliased under
  `thinking` and `reasoning_content`). Its verdict is kept on disk per template and library
  versions, so a process that finds it never imports transformers (a second per process). A
  message or option that is not plain JSON is rendered by transformers itself.
* **transformers' own functions** (`TransformersSteps`), in an overlay of its environment.

`build_runner` returns None where neither reproduces the probes, and the renderer then calls
`render_jinja_template` itself.
"""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import datetime
from functools import lru_cache, partial, wraps
from pathlib import Path
from types import BuiltinMethodType, CodeType
from typing import Any, Callable, Sequence

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import Namespace

from trace_tools.io.cache import CacheKey, code_digest
from trace_tools.memo import IdentityMemo
from trace_tools.render import limits
from trace_tools.render.canonical import FrozenDict, FrozenList

_DICT_ATTRIBUTES = frozenset(dir(dict))
# Public str methods the sandbox lets through unwrapped (it wraps only the two format methods), less
# those that can make a string far longer than their inputs (checked first: `render.limits`).
_STR_METHODS = frozenset(name for name in dir(str) if not name.startswith("_")) - {
    "format",
    "format_map",
    *limits.SIZED_STR_METHODS,
}
_ABSENT = object()
_PLAIN_VALUES = frozenset({int, bool, float, str, type(None)})
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
_CALL = [{"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": [True, None, 2.5]}}}]
_TEXT_ARGUMENTS = {"name": "f", "arguments": '{"x": 1}'}
_PROBES: list[tuple[list[dict], list[dict] | None, dict]] = [
    (
        [
            {"role": "system", "content": "s", "name": None},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a", "reasoning_content": "r", "tool_calls": _CALL},
            {"role": "tool", "content": "t", "tool_call_id": None},
            {"role": "user", "content": "v"},
            {"role": "assistant", "content": "b", "thinking": "q"},
            {"role": "user", "content": "w"},
            {"role": "assistant", "content": None, "reasoning": "p", "tool_calls": _CALL},
        ],
        [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
        {},
    ),
    (
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u", "name": None},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": _TEXT_ARGUMENTS}]},
            {"role": "tool", "content": "t"},
            {"role": "assistant", "content": "b", "reasoning_content": "r"},
            {"role": "user", "content": "w"},
        ],
        None,
        {},
    ),
    ([{"role": "user", "content": [{"type": "text", "text": "u"}]}], None, {"enable_thinking": False}),
]


class _NotPlain(Exception):
    """Data that is not plain JSON: the native steps leave it to transformers."""


class _SizedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with `a ~ b` checked against the size limit once joined (the
    result is at most the sum of its parts, so checking after is enough)."""

    def visit_Concat(self, node: nodes.Concat, frame: Any) -> None:
        self.write("environment.check_size(")
        super().visit_Concat(node, frame)
        self.write(")")


class _SizedSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with the operations that can make a value far larger than their
    inputs checked against `size_limit` before they run, and the text a render joins checked
    against the output limits (`render.limits`). Templates compiled in it render exactly what
    the plain sandbox renders, or stop at a limit."""

    code_generator_class = _SizedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "%", "+"})
    size_limit = limits.DEFAULT_OUTPUT

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is str:
            estimate = limits.SIZED_STR_METHODS.get(attribute)
            if estimate is not None:
                return limits.sized(getattr(obj, attribute), partial(estimate, obj), attribute, self.size_limit)
        return super().getattr(obj, attribute)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        limits.check_binop(operator, left, right, self.size_limit)
        result = self.binop_table[operator](left, right)
        return limits.check_size(result, self.size_limit) if operator == "+" else result

    def check_size(self, value: Any) -> Any:
        return limits.check_size(value, self.size_limit)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None or type(value.__self__) is not str:
            return wrapped
        formatter = _SizedFormatter(self)
        text, is_map = value.__self__, value.__name__ == "format_map"

        def sized_format(*args: Any, **kwargs: Any) -> str:
            if is_map:  # the sandbox's own wrapper reports the misuse
                return wrapped(*args, **kwargs)
            return formatter.vformat(text, args, kwargs)

        return sized_format

    def configure_limits(self, limit: int) -> None:
        """The output and value size limit; the size-checked filters and globals. Called before a
        template is compiled (its code reads `intercepted_binops` and the code generator then)."""
        self.size_limit = limit
        self.concat = limits.bounded_concat(limit)  # type: ignore[method-assign]
        self.filters = dict(self.filters)
        for name, estimate in limits.SIZED_FILTERS.items():
            if name in self.filters:
                self.filters[name] = limits.sized(self.filters[name], estimate, name, limit)
        self.filters["tojson"] = limits.sized_json(self.filters["tojson"])
        self.globals = dict(self.globals)
        lipsum = self.globals.get("lipsum")
        if callable(lipsum):
            words = lambda n=5, html=True, min=20, max=100: int(n) * int(max) * 12  # noqa: E731 - lipsum's signature
            self.globals["lipsum"] = limits.sized(lipsum, words, "lipsum", limit)


class _CheapSandbox(_SizedSandbox):
    """The size-checked sandbox, with its per-attribute verdicts memoised per type.

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
        if type(obj) is str and attribute in _STR_METHODS:  # `content.startswith`: always safe
            return getattr(obj, attribute)
        if type(obj) in _STATE_TYPES and attribute[:1] != "_":
            # `loop.index0`, `ns.last_query_index`: the sandbox finds the public attributes of
            # Jinja's loop and of a namespace safe, and wraps only `str.format` methods, so a
            # number, string or None comes back as it is. Anything else takes the sandbox's path.
            value = getattr(obj, attribute, _ABSENT)
            if type(value) in _PLAIN_VALUES:
                return value
        return super().getattr(obj, attribute)

    def is_safe_callable(self, obj: Any) -> bool:
        # A builtin method cannot carry the `unsafe_callable`/`alters_data` marks the sandbox looks for.
        return type(obj) is BuiltinMethodType or super().is_safe_callable(obj)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        kind = type(obj)
        if obj.__class__ is not kind:  # isinstance() would consult the claimed class too
            return super().is_safe_attribute(obj, attr, value)
        verdict = self._verdicts.get((kind, attr))
        if verdict is None:
            verdict = self._verdicts[kind, attr] = super().is_safe_attribute(obj, attr, value)
        return verdict


# -- native steps ------------------------------------------------------------------------------
class _GenerationTag(Extension):
    """`{% generation %}…{% endgeneration %}` marks assistant spans for transformers' token
    masks; a plain render writes the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Unlike Jinja's own filter: no HTML escaping, and the json.dumps options exposed.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(date_format: str) -> str:
    return datetime.now().strftime(date_format)


class _SizedFormatter(SandboxedFormatter):
    """The sandbox's `str.format`, refusing a field width or precision past the size limit."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        limits.check_format_spec(format_spec, self._env.size_limit)  # type: ignore[attr-defined]
        return super().format_field(value, format_spec)


class _DictFactory:
    """`dict(...)` and `dict.fromkeys(...)` inside a template, without exposing the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _SafeNamespace(Namespace):
    """`namespace(...)` that refuses underscore names, the way into Python's internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's own signature trick
        self, values = args[0], dict(*args[1:], **kwargs)
        for name in values:
            _SafeNamespace._refuse_private(name)
        Namespace.__init__(self, values)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._refuse_private(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _refuse_private(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template cannot set the underscore name {name!r} on a namespace")


# The objects a template keeps its state in: what `_CheapSandbox.getattr` reads directly.
_STATE_TYPES = frozenset({LoopContext, _SafeNamespace})


def _plain_json(value: Any) -> Any:
    """A copy of exact JSON types (str-keyed dicts, lists, scalars); anything else is `_NotPlain`."""
    kind = type(value)
    if kind is dict or kind is FrozenDict:
        if not all(type(key) is str for key in value):
            raise _NotPlain
        return {key: _plain_json(item) for key, item in value.items()}
    if kind is list or kind is FrozenList:
        return [_plain_json(item) for item in value]
    if value is None or kind is str or kind is int or kind is float or kind is bool:
        return value
    raise _NotPlain


class NativeSteps:
    """The template and message forms built here (see the module docstring)."""

    name = "native"

    @staticmethod
    def environment(chat_template: str) -> Any:
        env = _CheapSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals.update(
            raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_DictFactory(), namespace=_SafeNamespace
        )
        return env

    @staticmethod
    def message(message: Any) -> dict:
        if type(message) is not dict and type(message) is not FrozenDict:
            raise _NotPlain
        form = {key: _plain_json(value) for key, value in message.items() if value is not None}
        reasoning = next((form[key] for key in _REASONING_KEYS if form.get(key) is not None), None)
        if reasoning is not None:
            form = {"thinking": reasoning, **form, "reasoning_content": reasoning}
        return form

    plain = staticmethod(_plain_json)


class TransformersSteps:
    """transformers' own functions, and its environment under an overlay."""

    name = "transformers"

    def __init__(self) -> None:
        from transformers.utils import chat_template_utils as ctu

        self._ctu = ctu
        self.plain = ctu._plain_template_data
        for name in ("_compile_jinja_template", "_normalize_chat_messages", "_alias_reasoning_fields"):
            getattr(ctu, name)  # an AttributeError here: this transformers renders another way

    def environment(self, chat_template: str) -> Any:
        return _overlay(self._ctu, _CheapSandbox)

    def message(self, message: Any) -> dict:
        ctu = self._ctu
        return ctu._alias_reasoning_fields([ctu._plain_template_data(ctu._normalize_chat_messages([message])[0])])[0]


def _overlay(ctu: Any, kind: type[_SizedSandbox]) -> Any:
    """An overlay of the environment transformers compiles chat templates in, of class `kind`.

    transformers' environment is the same for every template; it is taken from an empty one,
    since compiling the template itself there would fold its constant expressions unchecked
    (`'x' * 10**9` is computed at compile time where `*` is not intercepted)."""
    env = ctu._compile_jinja_template("").environment
    if type(env) is not ImmutableSandboxedEnvironment:
        raise AttributeError("transformers' chat template environment is not the one expected")
    overlay = env.overlay()
    overlay.__class__ = kind
    overlay.filters = dict(env.filters)  # an overlay shares the dict; the runner replaces tojson
    return overlay


# -- transformers' own rendering, size-checked -------------------------------------------------
_SIZED = threading.local()  # per thread: {template text: its size-checked compiled template}


def sized_transformers(render: Callable[..., str], chat_template: str, size_limit: int) -> Callable[..., str]:
    """`render`, a call into transformers' chat-template rendering (`apply_chat_template`,
    `render_jinja_template`), with the template it compiles for `chat_template` compiled instead
    in an overlay of transformers' own environment that checks sizes (`_SizedSandbox`): the same
    text, and every value-size check of our own runner, on `--reference`, `--verify` and for
    templates only transformers renders.

    transformers looks its compiled template up through `_compile_jinja_template` on every call:
    that function is wrapped once per process to return ours while `render` runs in this thread
    (and transformers' own otherwise, so other callers in the process see no change). The import
    and the compilation happen here, outside any render's measured time."""
    from transformers.utils import chat_template_utils as ctu

    try:
        _hook_compilation(ctu)
        compiled = _sized_template(chat_template, size_limit)
    except AttributeError:  # a transformers that renders another way: its own rendering, time-limited only
        return render

    def sized(*args: Any) -> str:
        outer = getattr(_SIZED, "templates", None)
        _SIZED.templates = {chat_template: compiled}
        try:
            return render(*args)
        finally:
            _SIZED.templates = outer

    return sized


@lru_cache(maxsize=16)
def _sized_template(chat_template: str, size_limit: int) -> Any:
    from transformers.utils import chat_template_utils as ctu

    env = _overlay(ctu, _SizedSandbox)
    env.configure_limits(size_limit)
    return env.from_string(chat_template)


def _hook_compilation(ctu: Any) -> None:
    original = ctu._compile_jinja_template
    if getattr(original, "trace_tools_sized", False):
        return

    @wraps(original)
    def compile_template(chat_template: str) -> Any:
        templates = getattr(_SIZED, "templates", None)
        sized = templates.get(chat_template) if templates else None
        return original(chat_template) if sized is None else sized

    compile_template.trace_tools_sized = True  # type: ignore[attr-defined]
    ctu._compile_jinja_template = compile_template


class TemplateRunner:
    """Renders one chat template as `render_jinja_template` does; `variables` are the extra
    template variables (the special-token map) that `apply_chat_template` passes, `fallback`
    renders what the steps refuse."""

    def __init__(
        self,
        chat_template: str,
        variables: dict,
        steps: Any,
        fallback: Callable[..., str],
        size_limit: int = limits.DEFAULT_OUTPUT,
    ):
        self.steps, self._fallback = steps, fallback
        self._json: IdentityMemo[str] = IdentityMemo()
        env = steps.environment(chat_template)
        env.filters["tojson"] = self._memoised_json(env.filters["tojson"])
        env.configure_limits(size_limit)
        self._template = _compiled(env, chat_template, (type(steps), size_limit))
        self._variables = dict(variables)
        self.reset()

    def reproduces(self, reference: Callable[[], Callable[..., str]], guard: Callable = lambda render: render) -> bool:
        """True when the probe conversations render as `reference()` renders them: the same text,
        or an error where it fails (templates refuse different probes); at least one must render.

        Each probe renders here first, under `guard` (the template limits), and only then through
        the reference, whose environment checks no value sizes: a hostile template stops here."""
        own = guard(self)
        rendered = 0
        for messages, tools, kwargs in _PROBES:
            for generation in (False, True):
                try:
                    mine: str | None = own(messages, tools, generation, kwargs)
                except Exception:
                    mine = None
                try:
                    expected = guard(reference())(messages, tools, generation, kwargs)
                except Exception:
                    expected = None
                if mine != expected:
                    return False
                rendered += expected is not None
        self.reset()
        return rendered > 0

    def reset(self) -> None:
        """Forget the memoised messages, tools and JSON texts (between sessions)."""
        self._messages: IdentityMemo[dict] = IdentityMemo()
        self._tools: dict[tuple[int, ...], tuple[Sequence, Any]] = {}
        self._json.clear()

    def _memoised_json(self, tojson: Callable[..., str]) -> Callable[..., str]:
        """The template's `tojson` filter, memoised by the identity of what it serialises: the
        same tool schemas are written into every full render of a session's system prompt."""

        def memoised(value: Any, *args: Any, **kwargs: Any) -> str:
            options = (args, tuple(kwargs.items()))
            try:
                hash(options)
            except TypeError:  # an unhashable option (a list of separators): nothing to share
                return tojson(value, *args, **kwargs)
            return self._json.get(value, lambda _: tojson(value, *args, **kwargs), key=options)

        return memoised

    def __call__(self, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool, kwargs: dict) -> str:
        if tools is not None and not all(isinstance(tool, dict) for tool in tools):
            return self._fallback(messages, tools, generation, kwargs)  # it reports what is wrong
        try:
            chat = [self._messages.get(message, self.steps.message) for message in messages]
            variables = self.steps.plain({**self._variables, **kwargs})
            schemas = self._tool_schemas(tools)
        except _NotPlain:
            return self._fallback(messages, tools, generation, kwargs)
        return self._template.render(
            messages=chat, tools=schemas, documents=None, add_generation_prompt=generation, **variables
        )

    def _tool_schemas(self, tools: Sequence[dict] | None) -> Any:
        if tools is None:
            return None
        key = tuple(map(id, tools))
        hit = self._tools.get(key)
        if hit is None:
            hit = self._tools[key] = (tools, self.steps.plain(list(tools)))
        return hit[1]


# A template's compiled code, by its source and how its runner's environment was set. Compiling the
# Qwen3 template takes about 0.05 s, and each renderer of a process compiled it again (a replay's
# workers, each on its first session). The code depends on the environment's settings, which the
# steps fix (`NativeSteps.environment`, transformers' overlay), and on its filters, which Jinja
# calls at compile time on constant arguments: the size limit sets those (`configure_limits`),
# so that a constant too large is refused at render time instead of built while compiling.
_CODE: dict[tuple[Any, str], Any] = {}
_CODE_ENTRIES = 16


def _compiled(env: Any, source: str, setting: tuple[type, int]) -> Any:
    """`env.from_string(source)`, compiled once per process for each `setting` (the steps' class and
    the size limit) and inherited by workers forked afterwards (`precompile`); the code is also
    kept in the cache (`_stored_code`)."""
    key = (setting, source)
    code = _CODE.get(key)
    if code is None:
        code = _stored_code(env, source, setting)
        if len(_CODE) >= _CODE_ENTRIES:
            _CODE.pop(next(iter(_CODE)))
        _CODE[key] = code
    return env.template_class.from_code(env, code, env.make_globals(None), None)


def _stored_code(env: Any, source: str, setting: tuple[type, int]) -> CodeType:
    """`env.compile(source)`, kept in the cache as marshal data (kind `templates`): compiling costs
    every command that renders 15–30 ms before its workers fork, loading the code 0.1 ms. Keyed by
    the template text, the setting, the source of this module and of the limits (the environment
    and the filters that Jinja folds constants with) and the Python, Jinja2 and transformers
    versions (the code's format, the compiler, transformers' environment)."""
    steps, size_limit = setting
    key = CacheKey(
        "templates",
        "code",
        inputs=(hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest(), steps.__qualname__, size_limit),
        code=code_digest("render/template_runner.py", "render/limits.py"),
        libraries=("python", "jinja2", "transformers"),
    )
    from trace_tools.io.write import marshalled  # pyarrow's import is not this module's to pay

    return marshalled(key.path(".marshal"), CodeType, lambda: env.compile(source))


def precompile(chat_template: str, size_limit: int) -> None:
    """Compile `chat_template` as the fast runner compiles it (`TemplateRunner`, the same
    environment and limits), rendering nothing, so no thread starts: worker processes forked
    afterwards find its code compiled."""
    TemplateRunner(chat_template, {}, NativeSteps(), lambda *call: "", size_limit)


def build_runner(
    chat_template: str,
    variables: dict,
    reference: Callable[[], Callable[..., str]],
    verdict: Path | None,
    size_limit: int = limits.DEFAULT_OUTPUT,
    guard: Callable = lambda render: render,
) -> TemplateRunner | None:
    """The fastest runner that reproduces `reference()` (transformers' render), or None.

    `verdict` is where the native steps' verdict for this template is kept; a stored "yes"
    spares building the reference (and importing transformers) at all. `size_limit` bounds
    what one render and each value it builds may hold, `guard` runs a probe render under the
    template limits (`render.limits`).
    """
    native = TemplateRunner(chat_template, variables, NativeSteps(), lambda *call: reference()(*call), size_limit)
    stored = _read_verdict(verdict)
    if stored is True:
        return native
    same = stored is None and native.reproduces(reference, guard)
    if stored is None:
        _write_verdict(verdict, same)
    if same:
        return native
    try:
        runner = TemplateRunner(chat_template, variables, TransformersSteps(), reference(), size_limit)
    except (ImportError, AttributeError):
        return None
    return runner if runner.reproduces(reference, guard) else None


def _read_verdict(path: Path | None) -> bool | None:
    from trace_tools.io.write import read_cached

    value = read_cached(path, "native", None)
    return value if isinstance(value, bool) else None


def _write_verdict(path: Path | None, same: bool) -> None:
    from trace_tools.io.write import write_cached

    write_cached(path, "native", same)
