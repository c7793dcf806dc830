"""Chat templates are untrusted code (docs/run_directory.md#untrusted-input-bounded): every render
runs under limits on its own work.

A dump carries its own template, and Jinja is a programming language: a loop of 10¹⁰ steps or
`'x' * 10**10` is one line. Four things bound a render:

* **time**: the CPU time of the rendering thread itself (its own clock, `pthread_getcpuclockid`),
  not the wall clock: a process paused by SIGSTOP, a throttled container or a busy machine does
  not spend a template's time, and imports, tokenizer loading and Jinja compilation happen
  outside the measured region (`not_counted`). A watchdog thread per process raises
  `RenderTimeout` inside the rendering thread once the render has used `seconds` (Python checks
  for it between bytecodes, so any loop, macro recursion or long chain of filters stops);
  arming it costs two clock reads and two dictionary writes per render;
* **output**: the text a render (or a macro, or a `{% set %}` block) produces is joined in
  slices and refused past `output` characters, before it is built;
* **growth**: a render may write at most `growth` × the characters of its input (messages,
  tools, options) plus `allowance`: real long contexts pass, while a short conversation cannot
  be made to render megabytes thousands of times (each render under `output`, their sum not);
* **single operations**: the operations that make a value many times larger than their inputs
  are checked before they run: `*`, `**`, `%` and `+`, `~`, `str.format`, the padding,
  `replace` and `join` string methods, and the filters `center`, `indent`, `format`,
  `wordwrap`, `join`, `replace`, `tojson`, `batch`, `slice` and the `lipsum` global. This holds
  on every render path: our own template environment (`template_runner`), and transformers' own
  rendering (`--reference`, `--verify`, and templates our runner cannot reproduce), whose
  template is compiled in the same size-checked environment (`template_runner.sized_transformers`).

Exceeding a limit raises `TemplateLimitHit`, a `BaseException`: no `except Exception` on its way
(a template refusing a window, a strategy counting a server error) can take it for the
template's own error. The replay engine and the CLI turn it into `TemplateLimitExceeded` (exit 2,
naming the template and the limit). The defaults are two orders of magnitude above what real
templates need on real data (`docs/run_directory.md`); `$TRACE_TOOLS_TEMPLATE_SECONDS`,
`$TRACE_TOOLS_TEMPLATE_OUTPUT` (characters), `$TRACE_TOOLS_TEMPLATE_GROWTH` and
`$TRACE_TOOLS_TEMPLATE_ALLOWANCE` (characters) change them.
"""

from __future__ import annotations

import functools
import math
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

from trace_tools.errors import UsageError

DEFAULT_SECONDS = 20.0  # CPU seconds of the rendering thread, per render
DEFAULT_OUTPUT = 16 * 2**20  # characters of one render's text
DEFAULT_GROWTH = 8.0  # a render writes at most this many times its input's characters…
DEFAULT_ALLOWANCE = 2**18  # …plus this many
MAX_INT_BITS = 2**20  # an integer a template computes (`**`, `*`)
MAX_JSON_INDENT = 1024
_NODE_CHARS = 8  # what a key, number or container of the input counts for (its JSON syntax)


@dataclass(frozen=True)
class TemplateLimits:
    seconds: float = DEFAULT_SECONDS
    output: int = DEFAULT_OUTPUT
    growth: float = DEFAULT_GROWTH
    allowance: int = DEFAULT_ALLOWANCE

    @classmethod
    def from_env(cls) -> "TemplateLimits":
        return cls(
            _env_number("TRACE_TOOLS_TEMPLATE_SECONDS", DEFAULT_SECONDS),
            int(_env_number("TRACE_TOOLS_TEMPLATE_OUTPUT", DEFAULT_OUTPUT)),
            _env_number("TRACE_TOOLS_TEMPLATE_GROWTH", DEFAULT_GROWTH),
            int(_env_number("TRACE_TOOLS_TEMPLATE_ALLOWANCE", DEFAULT_ALLOWANCE)),
        )

    def identity(self) -> dict[str, float]:
        return {
            "seconds": self.seconds,
            "output_chars": self.output,
            "growth": self.growth,
            "allowance_chars": self.allowance,
        }

    def output_cap(self, input_chars: int) -> "OutputCap":
        """How much a render of `input_chars` characters of input may write."""
        grown = int(self.growth * input_chars) + self.allowance
        if grown < self.output:
            return OutputCap(
                grown,
                f"wrote more than {grown:,} characters from {input_chars:,} characters of input (the growth "
                f"limit: {self.growth:g} × input + {self.allowance:,})",
                "$TRACE_TOOLS_TEMPLATE_GROWTH / $TRACE_TOOLS_TEMPLATE_ALLOWANCE",
            )
        return OutputCap(self.output, _over_output(self.output), "$TRACE_TOOLS_TEMPLATE_OUTPUT")


def _over_output(limit: int) -> str:
    return f"wrote more than {limit:,} characters (the output limit)"


@dataclass(frozen=True)
class OutputCap:
    """The most characters one render may write, and how to say it was hit."""

    chars: int
    what: str
    setting: str

    def refusal(self) -> "TemplateLimitHit":
        return TemplateLimitHit(self.what, setting=self.setting)


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name, "")
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"${name} is {text!r}; set a positive number or unset it")
    return value


def input_chars(value: Any) -> int:
    """The size of a render's input in characters: its strings' lengths, and `_NODE_CHARS` for
    every key, number and container (the JSON syntax a template may write around them)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return _NODE_CHARS + sum(_NODE_CHARS + len(key) + input_chars(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return _NODE_CHARS + sum(map(input_chars, value))
    return _NODE_CHARS


class TemplateLimitHit(BaseException):
    """A render went past a limit. `what` says which ("ran past the 20 s CPU-time limit"),
    `setting` the environment variable that raises it."""

    def __init__(self, what: str, template: str = "", setting: str = "") -> None:
        super().__init__(what, template, setting)
        self.what, self.template = what, template
        self.setting = setting or "$TRACE_TOOLS_TEMPLATE_OUTPUT"

    def __str__(self) -> str:
        where = f"chat template {self.template}" if self.template else "a chat template"
        return (
            f"{where} {self.what} in one render; it is not run further (templates are untrusted code). "
            f"Fix or replace the template (--chat-template), or raise the limit with {self.setting} "
            "if the template is trusted"
        )


class RenderTimeout(BaseException):
    """Raised by the watchdog inside a render that ran past its time (no arguments: it is
    raised by type)."""


# -- time -----------------------------------------------------------------------------------------
def _thread_clock() -> int | None:
    """The CPU-time clock of the calling thread (None where the platform has none: the wall
    clock is used instead)."""
    if not hasattr(_LOCAL, "clock"):
        try:
            _LOCAL.clock = time.pthread_getcpuclockid(threading.get_ident())
            time.clock_gettime(_LOCAL.clock)
        except (AttributeError, OSError):
            _LOCAL.clock = None
    return _LOCAL.clock


def _read(clock: int | None) -> float:
    return time.monotonic() if clock is None else time.clock_gettime(clock)


_LOCAL = threading.local()  # per thread: its CPU clock, and the output cap of its render


@dataclass
class _Render:
    clock: int | None
    deadline: float  # on `clock`
    token: int
    paused_at: float | None = None  # on `clock`, while `not_counted` work runs
    outer: "_Render | None" = None  # the render this one runs inside (a probe while a runner is built)


class _Watchdog:
    """One daemon thread per process; `arm` and `disarm` bracket each render of each thread.

    A render's budget is CPU time of its own thread, which can never pass faster than the wall
    clock: the watchdog sleeps until the earliest moment a budget could be spent, then reads each
    thread's clock and sleeps again for what is left. `arm` wakes it only when the new render's
    budget could be spent before that moment. When a look finds no render armed but some were
    armed since the last look (short renders come and go between looks), it looks again one time
    limit later instead of waiting to be woken: a process that renders thousands of times a
    second, back to back or between other work, wakes it about once per time limit, not once per
    render, which would take the GIL from the renders and cost the Ray driver CPU. Only a look
    after a whole quiet time limit sleeps until the next `arm`."""

    def __init__(self) -> None:
        self.start_afresh()

    def start_afresh(self) -> None:
        """No render armed, no thread yet (a forked child's state: its parent's thread is not in it)."""
        self._lock = threading.Condition()
        self._renders: dict[int, _Render] = {}  # thread id → its render
        self._fired: set[int] = set()  # tokens the watchdog raised into
        self._token = 0
        self._wakes_at = math.inf  # wall time the watchdog thread will look next (inf: when notified)
        self._armed_since_look = False
        self._last_seconds = 0.0  # the time limit of the latest render armed
        self.wakeups = 0
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> int:
        if self._thread is None:
            self._start()
        clock = _thread_clock()
        deadline = _read(clock) + seconds
        thread = threading.get_ident()
        with self._lock:
            self._token += 1
            self._renders[thread] = _Render(clock, deadline, self._token, outer=self._renders.get(thread))
            self._armed_since_look = True
            self._last_seconds = seconds
            self._wake_by(time.monotonic() + seconds)
            return self._token

    def disarm(self, token: int) -> bool:
        """End a render; True when the watchdog fired into it (a pending exception is cleared)."""
        thread = threading.get_ident()
        with self._lock:
            render = self._renders.pop(thread, None)
            if render is not None and render.outer is not None:
                self._renders[thread] = render.outer
            fired = token in self._fired
            self._fired.discard(token)
        if fired:
            _raise_in(thread, None)
        return fired

    @contextmanager
    def not_counted(self) -> Iterator[None]:
        """Work inside a render that is not the template's (an import, loading a tokenizer,
        compiling a template): its CPU time is added back to the render's budget."""
        thread = threading.get_ident()
        with self._lock:
            render = self._renders.get(thread)
            if render is not None and render.paused_at is None:
                render.paused_at = _read(render.clock)
            else:
                render = None  # not armed, or already paused by an outer `not_counted`
        try:
            yield
        finally:
            if render is not None:
                with self._lock:
                    spent = _read(render.clock) - (render.paused_at or 0.0)
                    render.deadline += spent
                    render.paused_at = None
                    self._wake_by(time.monotonic() + max(render.deadline - _read(render.clock), 0.0))

    def _wake_by(self, moment: float) -> None:
        if moment < self._wakes_at:
            self._wakes_at = moment
            self._lock.notify()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="trace-tools-template-watchdog", daemon=True)
                self._thread.start()

    def _watch(self) -> None:
        with self._lock:
            while True:
                self.wakeups += 1
                now = time.monotonic()
                self._wakes_at = math.inf
                for thread, render in list(self._renders.items()):
                    if render.token in self._fired or render.paused_at is not None:
                        continue  # a paused render wakes the watchdog when it resumes
                    try:
                        left = render.deadline - _read(render.clock)
                    except OSError:  # the thread is gone
                        del self._renders[thread]
                        continue
                    if left <= 0:
                        self._fired.add(render.token)
                        _raise_in(thread, RenderTimeout)
                    else:
                        self._wakes_at = min(self._wakes_at, now + left)
                if self._wakes_at == math.inf and self._armed_since_look:
                    self._wakes_at = now + self._last_seconds  # no render can be spent before then
                self._armed_since_look = False
                self._lock.wait(None if self._wakes_at == math.inf else max(self._wakes_at - now, 0.0))


def _raise_in(thread: int, exception: type[BaseException] | None) -> None:
    """Raise `exception` in `thread` at its next bytecode; None clears one not raised yet."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread), None if exception is None else ctypes.py_object(exception)
    )


WATCHDOG = _Watchdog()
not_counted = WATCHDOG.not_counted


def _start_afresh_in_child() -> None:
    """A forked child has none of its parent's threads: its watchdog starts afresh (a new lock, no
    renders, its own thread at the first `arm`), and its thread finds its own CPU clock (the
    inherited one names the parent's thread, and reading it fails: EINVAL)."""
    _LOCAL.__dict__.pop("clock", None)
    WATCHDOG.start_afresh()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_start_afresh_in_child)


def limited(render: Callable[..., str], limits: TemplateLimits, template: str) -> Callable[..., str]:
    """`render(messages, tools, generation, kwargs)` under the time limit, its text checked against
    the output and growth limits while it is joined (`bounded_concat`) and once written."""

    def guarded(*args: Any) -> str:
        cap = limits.output_cap(input_chars([args[0], args[1], args[3]]) if len(args) > 3 else 0)
        outer = getattr(_LOCAL, "cap", None)
        _LOCAL.cap = cap
        token = WATCHDOG.arm(limits.seconds)
        try:
            try:
                text = render(*args)
            finally:
                fired = WATCHDOG.disarm(token)
                _LOCAL.cap = outer
        except RenderTimeout:
            fired = True
        except TemplateLimitHit as hit:
            raise TemplateLimitHit(hit.what, template, hit.setting) from None
        except MemoryError:
            raise TemplateLimitHit("ran out of memory", template) from None
        if fired:
            raise TemplateLimitHit(
                f"ran past the {limits.seconds:g} s CPU-time limit", template, "$TRACE_TOOLS_TEMPLATE_SECONDS"
            )
        if len(text) > cap.chars:
            raise TemplateLimitHit(cap.what, template, cap.setting)
        return text

    return guarded


# -- size: checks the template environment calls ------------------------------------------------
def too_big(what: str) -> TemplateLimitHit:
    return TemplateLimitHit(what)


def bounded_concat(limit: int) -> Callable[[Iterable[str]], str]:
    """`Environment.concat` that refuses a text longer than `limit`, or than the output cap of the
    render under way (`limited`), before joining it."""
    absolute = OutputCap(limit, _over_output(limit), "$TRACE_TOOLS_TEMPLATE_OUTPUT")

    def concat(pieces: Iterable[str]) -> str:
        cap: OutputCap | None = getattr(_LOCAL, "cap", None)
        if cap is None or cap.chars > limit:
            cap = absolute
        iterator = iter(pieces)
        parts: list[str] = []
        total = 0
        while batch := list(islice(iterator, 512)):
            total += sum(map(len, batch))
            if total > cap.chars:
                raise cap.refusal()
            parts += batch
        return "".join(parts)

    return concat


def check_size(value: Any, limit: int) -> Any:
    """`value` when it is not a string or sequence longer than `limit`."""
    if isinstance(value, (str, list, tuple)) and len(value) > limit:
        raise too_big(f"built a value of more than {limit:,} items")
    return value


def check_binop(operator: str, left: Any, right: Any, limit: int) -> None:
    """Refuse `left <operator> right` when the result would be too large, before computing it."""
    if operator == "*":
        for sequence, count in ((left, right), (right, left)):
            if isinstance(sequence, (str, list, tuple)) and isinstance(count, int):
                _need(len(sequence) * max(count, 0) <= limit, f"repeated a value past {limit:,} items")
        if isinstance(left, int) and isinstance(right, int):
            _need(abs(left).bit_length() + abs(right).bit_length() <= MAX_INT_BITS, "multiplied too large numbers")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        _need(abs(left).bit_length() * max(right, 0) <= MAX_INT_BITS, "raised a number to too large a power")
    elif operator == "%" and isinstance(left, str):
        check_printf(left, right if isinstance(right, tuple) else (right,), limit)


_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_SPEC = re.compile(r"(?:.?[<>=^])?[+\- ]?z?#?0?(\d*)[,_]?(?:\.(\d+))?")


def check_printf(text: str, args: tuple, limit: int) -> None:
    """`text % args` pads to widths and precisions no larger than `limit`."""
    for match in _PRINTF.finditer(text):
        for number in match.groups():
            if number == "*":
                _need(all(not isinstance(a, int) or a <= limit for a in args), f"padded past {limit:,} characters")
            elif number:
                _need(int(number) <= limit, f"padded past {limit:,} characters")


def check_format_spec(spec: str, limit: int) -> None:
    """A `str.format` field spec whose width and precision are no larger than `limit`."""
    match = _SPEC.match(spec)
    for number in match.groups() if match else ():
        if number:
            _need(len(number) < 12 and int(number) <= limit, f"padded past {limit:,} characters")


def _need(condition: bool, what: str) -> None:
    if not condition:
        raise too_big(what)


def _lines(text: Any) -> int:
    return str(text).count("\n") + 1


def _width(value: Any) -> int:
    return value if isinstance(value, int) else len(str(value))


def _sequence_length(value: Any) -> int:
    try:
        return len(value)
    except TypeError:
        return 0


# What each amplifying string method or filter would make, from its arguments, before it runs.
SIZED_STR_METHODS: dict[str, Callable[..., int]] = {
    "center": lambda s, width, *rest: width,
    "ljust": lambda s, width, *rest: width,
    "rjust": lambda s, width, *rest: width,
    "zfill": lambda s, width: width,
    "expandtabs": lambda s, tabsize=8: len(s) + s.count("\t") * tabsize,
    "replace": lambda s, old, new, count=-1: (
        len(s) + max(len(new) - len(old), 0) * (len(s) + 1 if not old else s.count(old))
    ),
    "join": lambda s, items: len(s) * _sequence_length(items),
}
SIZED_FILTERS: dict[str, Callable[..., int]] = {
    "center": lambda value, width=80: _width(width),
    "indent": lambda value, width=4, *rest, **kw: len(str(value)) + _lines(value) * _width(width),
    "format": lambda value, *args, **kw: 0,  # checked as printf below
    "wordwrap": lambda value, width=79, break_long_words=True, wrapstring=None, *rest, **kw: (
        len(str(value)) + (len(str(value)) // max(_width(width), 1) + _lines(value)) * len(wrapstring or "\n")
    ),
    "join": lambda value, d="", *rest, **kw: _sequence_length(value) * len(str(d)),
    "replace": lambda value, old, new, count=None, *rest: (
        len(str(value)) + max(len(str(new)) - len(str(old)), 0) * (len(str(value)) + 1)
    ),
    "batch": lambda value, linecount, *rest: _width(linecount),
    "slice": lambda value, slices, *rest: _width(slices),
}


def sized(function: Callable[..., Any], estimate: Callable[..., int], name: str, limit: int) -> Callable[..., Any]:
    """`function`, refused when `estimate` of its arguments says the result exceeds `limit`. A
    filter that takes Jinja's context, eval context or environment first keeps its mark (copied
    by `wraps`), and the estimate sees the arguments after it."""
    skip = 1 if getattr(function, "jinja_pass_arg", None) else 0

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        given = args[skip:]
        try:
            size = estimate(*given, **kwargs)
        except (TypeError, ValueError, AttributeError):
            size = 0  # arguments the function itself will refuse
        if name == "format" and given:
            check_printf(str(given[0]), tuple(given[1:]), limit)
        _need(size <= limit, f"asked `{name}` for more than {limit:,} characters")
        return function(*args, **kwargs)

    return checked


def sized_json(tojson: Callable[..., str]) -> Callable[..., str]:
    """`tojson`, refusing an indent wider than MAX_JSON_INDENT (each nested line repeats it)."""

    @functools.wraps(tojson)
    def checked(value: Any, *args: Any, **kwargs: Any) -> str:
        indent = kwargs.get("indent", args[1] if len(args) > 1 else None)
        _need(indent is None or _width(indent) <= MAX_JSON_INDENT, f"asked for a JSON indent over {MAX_JSON_INDENT}")
        return tojson(value, *args, **kwargs)

    return checked
