"""Audit a chat template for the facts trajectory managers rely on (`trace-tools audit-template`).

Every check renders small generated conversations (with and without tools, with and without
reasoning) through the template and tokenizer and counts the cases where a property holds:

* `generation_prompt`: the generation prompt is the opening the template writes for the
  assistant message that follows it (served ids = prompt + output line up with the re-render);
* `prefix_stability`: the history rendered with `add_generation_prompt=False` is a prefix of the
  next request's render;
* `last_assistant`: an assistant renders the same as the last message as when more messages
  follow (Qwen3 writes an empty think block only for a *last* assistant without reasoning);
* `reasoning_history`: earlier turns' reasoning stays in later renders (n/a when the template
  never renders `reasoning_content`);
* `closer_text`, `closer_tool`: the closer probe (common suffix of two renders whose assistant
  bodies differ) is non-empty and ends the history after a text / a tool-call assistant;
* `tokenizer_merges`: tokenizing pieces separately gives the ids of tokenizing them together
  (prompt | output, history | next turn): no BPE merge across a message boundary;
* `key_order`, `whitespace`: whether reordered tool-argument keys, string arguments and
  edge or line-end whitespace reach the prompt unchanged. Informational: no strategy depends on
  the template here, but a sensitive template lets a harness's echo rewrites reach the tokens.

Which checks each strategy relies on is part of the strategy's declaration
(`strategies.declarations`); the caller passes that table in (`relies_on`), so the render layer
knows no strategies, and the audit fails for a strategy when one of its checks fails. The views
of an audit (terminal tables, the Markdown table of docs/templates.md) are `report.audit_view`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_tools.errors import TemplateNotFound, TraceToolsError
from trace_tools.families import FAMILIES
from trace_tools.render.renderer import Renderer
from trace_tools.render.templates import NAMED_TEMPLATES, embedded_metadata, resolve_template, trl_template_dir
from trace_tools.render.tokenizer import load_tokenizer

CHECKS = (
    "generation_prompt",
    "prefix_stability",
    "last_assistant",
    "reasoning_history",
    "closer_text",
    "closer_tool",
    "tokenizer_merges",
    "key_order",
    "whitespace",
)
PROBES = ("audit closer probe, first body ends in A", "audit closer probe, second body ends in Z")
EDGE_WHITESPACE = "\n  Done: the fix is in.  \nSecond line\t\n"


@dataclass
class Check:
    """One check's verdict: `status` is pass, fail or n/a; `passed` of `total` cases held."""

    name: str
    status: str
    passed: int
    total: int
    errors: int = 0  # cases the template refused to render (not counted in total)
    detail: str = ""


@dataclass
class Audit:
    """A template's checks and, per chosen strategy, the checks it relies on that failed.

    `relies_on`: strategy name -> the checks it relies on (its declaration's `relies_on`)."""

    template: str
    tokenizer: str
    tokenizer_note: str = ""
    checks: list[Check] = field(default_factory=list)
    relies_on: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how the conversations were adapted to the template

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    @property
    def failing(self) -> dict[str, list[str]]:
        failed = {c.name for c in self.checks if c.status == "fail"}
        return {s: [c for c in checks if c in failed] for s, checks in self.relies_on.items()}

    @property
    def ok(self) -> bool:
        return not any(self.failing.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "tokenizer": self.tokenizer,
            "tokenizer_note": self.tokenizer_note,
            "notes": self.notes,
            "ok": self.ok,
            "checks": [asdict(c) for c in self.checks],
            "failing_by_strategy": self.failing,
        }


# -- conversations -------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Edit",
            "description": "Replace text in a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "file_path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"},
                    "replace_all": {"type": "boolean"},
                },
                "required": ["file_path", "old_string", "new_string"],
            },
        },
    },
]
_EDIT_ARGS = {"file_path": "src/app.py", "old_string": "retries = 1", "new_string": "retries = 3", "replace_all": False}


def _call(number: int, name: str, arguments: Any) -> dict:
    return {"id": f"call_{number}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _assistant(content: str, reasoning: str | None, calls: list[dict] | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(number: int, name: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{number}", "name": name, "content": content}


def conversation(tools: bool, reasoning: bool, edit_args: dict | None = None) -> list[dict]:
    """A short agent episode: two user queries, with tool loops when `tools`, reasoning when `reasoning`."""
    think = (lambda text: text) if reasoning else (lambda text: None)
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "The retry test is flaky. Fix it."},
    ]
    if tools:
        messages += [
            _assistant("", think("Run the tests first."), [_call(1, "Bash", {"command": "pytest -q"})]),
            _tool(1, "Bash", "1 failed: test_retry"),
            _assistant(
                "Raising the retry count.", think("One retry is too few."), [_call(2, "Edit", edit_args or _EDIT_ARGS)]
            ),
            _tool(2, "Edit", "edited src/app.py"),
        ]
    messages += [
        _assistant("Fixed: retries are now 3.", think("The edit is in place.")),
        {"role": "user", "content": "Does the suite pass now?"},
    ]
    if tools:
        messages += [
            _assistant("", think("Check again."), [_call(3, "Bash", {"command": "pytest -q", "timeout": 60})]),
            _tool(3, "Bash", "12 passed"),
        ]
    messages += [_assistant("Yes, all 12 tests pass.", think("Green.")), {"role": "user", "content": "Thanks."}]
    return messages


def _label(tools: bool, reasoning: bool) -> str:
    return {
        (False, False): "text",
        (True, False): "tools",
        (False, True): "reasoning",
        (True, True): "tools+reasoning",
    }[(tools, reasoning)]


CONVERSATIONS = [(_label(t, r), conversation(t, r)) for t in (False, True) for r in (False, True)]


# -- the audit -----------------------------------------------------------------------------------


class _Cases:
    """Counts one check's cases; a case whose render raises is an error, not a failure."""

    def __init__(self, name: str):
        self.name, self.passed, self.total, self.errors = name, 0, 0, 0
        self.failures: list[str] = []
        self.error_text = ""

    def run(self, case: Callable[..., tuple[bool, str] | None], *args: Any) -> None:
        try:
            outcome = case(*args)
        except Exception as exc:  # a template may refuse any conversation shape (jinja raises freely)
            self.errors += 1
            self.error_text = self.error_text or _error_text(exc)
            return
        if outcome is None:
            return  # not applicable to this case
        held, why = outcome
        self.total += 1
        self.passed += held
        if not held and why not in self.failures:
            self.failures.append(why)

    def result(self, detail_pass: str = "", status: str | None = None) -> Check:
        if status is None:
            status = "n/a" if self.total == 0 else "pass" if self.passed == self.total else "fail"
        detail = "; ".join(self.failures[:3]) if status == "fail" else detail_pass
        if self.errors:
            detail = (detail + "; " if detail else "") + f"{self.errors} cases not renderable ({self.error_text})"
        return Check(self.name, status, self.passed, self.total, self.errors, detail)


@dataclass(frozen=True)
class _Shape:
    """How a template wants messages: without a system role, content as text parts, arguments as JSON text."""

    no_system: bool = False
    parts: bool = False
    string_arguments: bool = False

    def apply(self, messages: Sequence[dict]) -> list[dict]:
        return [self._message(m) for m in messages if not (self.no_system and m["role"] == "system")]

    def _message(self, message: dict) -> dict:
        message = dict(message)
        if self.parts and isinstance(message.get("content"), str):
            message["content"] = [{"type": "text", "text": message["content"]}]
        if self.string_arguments and message.get("tool_calls"):
            message["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _json_text(c["function"]["arguments"])}}
                for c in message["tool_calls"]
            ]
        return message

    def notes(self) -> list[str]:
        return [
            text
            for flag, text in (
                (self.no_system, "no system role: conversations start with the user"),
                (self.parts, "content given as text parts"),
                (self.string_arguments, "tool arguments given as JSON text"),
            )
            if flag
        ]


def _json_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


class _Auditor:
    """Runs the checks over the conversations the template can render, in the message shape it accepts."""

    def __init__(self, renderer: Any, stand_in: bool):
        self.renderer, self.stand_in = renderer, stand_in
        self.shape = _Shape()
        self.notes: list[str] = []
        self.conversations = self._renderable()
        self._reasoning_rendered = False  # set by reasoning_history's cases
        self._closers: list[str] = []  # collected by closer's cases

    def text(self, messages: Sequence[dict], generation: bool, tools: bool = True) -> str:
        return self.renderer.render_text(self.shape.apply(messages), TOOLS if tools else None, generation)

    def _renders(self, messages: list[dict]) -> str | None:
        """None when every request and history of the conversation renders, else the first error."""
        try:
            for end in range(1, len(messages) + 1):
                if messages[end - 1]["role"] == "assistant":
                    self.text(messages[:end], False)
                elif end == len(messages) or messages[end]["role"] == "assistant":
                    self.text(messages[:end], True)
        except Exception as exc:  # jinja templates raise whatever they like
            return _error_text(exc)
        return None

    def _renderable(self) -> list[tuple[str, list[dict]]]:
        """Pick the message shape the template accepts, then keep the conversations it renders."""
        text_conversation = conversation(False, False)
        for shape in (_Shape(), _Shape(no_system=True), _Shape(parts=True), _Shape(no_system=True, parts=True)):
            self.shape = shape
            if self._renders(text_conversation) is None:
                break
        tools = conversation(True, False)
        if self._renders(tools) is not None:
            self.shape = _Shape(self.shape.no_system, self.shape.parts, string_arguments=True)
            if self._renders(tools) is not None:
                self.shape = _Shape(self.shape.no_system, self.shape.parts)
        self.notes = self.shape.notes()
        kept = []
        for label, messages in CONVERSATIONS:
            error = self._renders(messages)
            if error is None:
                kept.append((label, messages))
            else:
                self.notes.append(f"{label} conversation not renderable ({error})")
        return kept

    def steps(self) -> list[tuple[str, list[dict], int, int]]:
        """(label, messages, p, q): an assistant at p, and the next request messages[:q] after it."""
        out = []
        for label, messages in self.conversations:
            positions = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
            for p, q in zip(positions, positions[1:] + [len(messages)]):
                out.append((label, messages, p, q))
        return out

    # each check: a loop over the cases, and the case itself (True/False and why; None = not applicable)
    def generation_prompt(self) -> Check:
        return self._cases("generation_prompt", self._generation_case).result()

    def _generation_case(self, label: str, messages: list[dict], p: int, q: int) -> tuple[bool, str]:
        prompt, full = self.text(messages[:p], True), self.text(messages[: p + 1], False)
        return full.startswith(prompt), f"{label}: {_divergence(prompt, full)}"

    def prefix_stability(self) -> Check:
        return self._cases("prefix_stability", self._prefix_case).result()

    def _prefix_case(self, label: str, messages: list[dict], p: int, q: int) -> tuple[bool, str]:
        history, after = self.text(messages[: p + 1], False), self.text(messages[:q], True)
        return after.startswith(history), f"{label}: {_divergence(history, after)}"

    def last_assistant(self) -> Check:
        return self._cases("last_assistant", self._last_case).result()

    def _last_case(self, label: str, messages: list[dict], p: int, q: int) -> tuple[bool, str] | None:
        following = messages[p + 1] if p + 1 < len(messages) else None
        if following is None or messages[p].get("reasoning_content") and following["role"] == "user":
            return None  # there reasoning stripping is the cause: reasoning_history reports it
        last, more = self.text(messages[: p + 1], False), self.text(messages[: p + 2], False)
        kind = "tool-call" if messages[p].get("tool_calls") else "text"
        return more.startswith(last), (
            f"{label}: a last {kind} assistant renders differently before a "
            f"{following['role']} message ({_divergence(last, more)})"
        )

    def reasoning_history(self) -> Check:
        self._reasoning_rendered = False
        cases = self._cases("reasoning_history", self._reasoning_case)
        if not self._reasoning_rendered and cases.total:
            return cases.result("the template never renders reasoning_content", status="n/a")
        result = cases.result("kept in every later render")
        if result.status == "fail":
            result.detail = f"earlier reasoning {result.detail}"
        return result

    def _reasoning_case(self, label: str, messages: list[dict], p: int, q: int) -> tuple[bool, str] | None:
        reasoning = messages[p].get("reasoning_content")
        if not reasoning:
            return None
        self._reasoning_rendered |= reasoning in self.text(messages[: p + 1], False)
        context = "a new user message" if messages[p + 1]["role"] == "user" else "a tool result"
        return reasoning in self.text(messages[:q], True), f"stripped after {context}"

    def closer(self, kind: str) -> Check:
        self._closers = []
        cases = self._cases(f"closer_{kind}", self._closer_case, kind == "tool")
        return cases.result(f"closer {self._closers[0]!r}" if self._closers else "")

    def _closer_case(self, label: str, messages: list[dict], p: int, q: int, tool: bool) -> tuple[bool, str] | None:
        if bool(messages[p].get("tool_calls")) != tool:
            return None
        a, b = (self.text(messages[:p] + [_assistant(body, None)], False) for body in PROBES)
        closer = a[len(a) - _common_suffix(a, b) :]
        history = self.text(messages[: p + 1], False)
        self._closers.append(closer)
        return bool(closer) and history.endswith(closer), (
            f"{label}: closer {closer!r} " + ("is empty" if not closer else f"does not end {_tail(history)}")
        )

    def tokenizer_merges(self) -> Check:
        if self.stand_in:
            return _Cases("tokenizer_merges").result(
                "needs the template's own tokenizer: a stand-in does not know its special tokens", status="n/a"
            )
        cases = self._cases("tokenizer_merges", self._served_merge_case)
        for step in self.steps():
            cases.run(self._history_merge_case, *step)
        return cases.result()

    def _served_merge_case(self, label: str, messages: list[dict], p: int, q: int) -> tuple[bool, str] | None:
        """The served split (prompt ids, then output ids) against the ids of the whole text."""
        prompt, full = self.text(messages[:p], True), self.text(messages[: p + 1], False)
        if not full.startswith(prompt):
            return None
        encode = self.renderer.encode
        return encode(prompt) + encode(full[len(prompt) :]) == encode(full), (
            f"{label}: prompt and output merge at {_tail(prompt)}"
        )

    def _history_merge_case(self, label: str, messages: list[dict], p: int, q: int) -> tuple[bool, str] | None:
        before, after = self.text(messages[: p + 1], False), self.text(messages[:q], True)
        if not after.startswith(before):
            return None
        ids = self.renderer.encode(before)
        return self.renderer.encode(after)[
            : len(ids)
        ] == ids, f"{label}: history and next turn merge at {_tail(before)}"

    def key_order(self) -> Check:
        cases = _Cases("key_order")
        for label, _ in self.conversations:
            if label.startswith("tools"):
                cases.run(self._key_order_case, label.endswith("reasoning"))
        return cases.result("insensitive: arguments are rendered in a canonical key order")

    def _key_order_case(self, reasoning: bool) -> tuple[bool, str]:
        reordered = dict(reversed(list(_EDIT_ARGS.items())))
        one = self.text(conversation(True, reasoning), True)
        two = self.text(conversation(True, reasoning, reordered), True)
        return one == two, f"sensitive: reordered arguments render differently ({_divergence(one, two)})"

    def whitespace(self) -> Check:
        cases = _Cases("whitespace")
        cases.run(self._content_whitespace_case, False)
        cases.run(self._content_whitespace_case, True)
        cases.run(self._string_arguments_case)
        return cases.result("kept verbatim")

    def _content_whitespace_case(self, more: bool) -> tuple[bool, str]:
        """Content with edge and line-end whitespace renders as the same content stripped, whitespace put back."""

        def render(body: str) -> str:
            tail = [{"role": "user", "content": "Go on."}] if more else []
            return self.text([{"role": "user", "content": "Summarise."}, _assistant(body, None), *tail], more, False)

        core = EDGE_WHITESPACE.strip()
        where = "in history" if more else "as the last message"
        return render(EDGE_WHITESPACE) == render(core).replace(core, EDGE_WHITESPACE, 1), (
            f"edge whitespace of assistant content is changed {where}"
        )

    def _string_arguments_case(self) -> tuple[bool, str]:
        compact = '{"command":"ls  -a"}'
        messages = [
            {"role": "user", "content": "List."},
            _assistant("", None, [_call(1, "Bash", compact)]),
            _tool(1, "Bash", "a.py"),
        ]
        return compact in self.text(messages, True), "string tool arguments are re-serialized"

    def _cases(self, name: str, case: Callable[..., tuple[bool, str] | None], *extra: Any) -> _Cases:
        cases = _Cases(name)
        for step in self.steps():
            cases.run(case, *step, *extra)
        return cases

    def all(self) -> list[Check]:
        return [
            self.generation_prompt(),
            self.prefix_stability(),
            self.last_assistant(),
            self.reasoning_history(),
            self.closer("text"),
            self.closer("tool"),
            self.tokenizer_merges(),
            self.key_order(),
            self.whitespace(),
        ]


def audit_template(
    renderer: Any,
    *,
    template: str = "",
    tokenizer: str = "",
    tokenizer_note: str = "",
    relies_on: Mapping[str, Sequence[str]] | None = None,
) -> Audit:
    """Run every check over `renderer` (anything with `render_text` and `encode`).

    A `tokenizer_note` marks the tokenizer as a stand-in for the template's own: the token-level
    check is then n/a, since the stand-in splits the template's special tokens into pieces.
    `relies_on` maps each strategy to judge to the checks it relies on (names of `CHECKS`).
    """
    table = {name: tuple(checks) for name, checks in (relies_on or {}).items()}
    unknown = sorted({check for checks in table.values() for check in checks} - set(CHECKS))
    if unknown:
        raise ValueError(f"no such audit check: {', '.join(unknown)}; the checks are {', '.join(CHECKS)}")
    auditor = _Auditor(renderer, stand_in=bool(tokenizer_note))
    return Audit(template, tokenizer, tokenizer_note, auditor.all(), table, auditor.notes)


# -- helpers -------------------------------------------------------------------------------------


def _error_text(exc: Exception) -> str:
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _tail(text: str, width: int = 24) -> str:
    return repr(text[-width:])


def _divergence(before: str, after: str, width: int = 20) -> str:
    """Where two renders part: the text each has from there (a little context first)."""
    at = next((i for i, (x, y) in enumerate(zip(before, after)) if x != y), min(len(before), len(after)))
    start = max(0, at - 6)
    return f"{before[start : at + width]!r} became {after[start : at + width]!r}"


# -- what the command line audits ----------------------------------------------------------------

STAND_IN = "qwen3"
ALL_TRL = "trl:all"
# TRL template stems whose own tokenizer is built offline (docs/model_families.md#where-each-tokenizer-comes-from;
# the family records' `audit_stems`), longest prefix first.
_OWN_TOKENIZER = sorted(
    ((stem, family.tokenizer) for family in FAMILIES.values() for stem in family.audit_stems),
    key=lambda pair: -len(pair[0]),
)


def template_tokenizer(stem: str) -> tuple[str, str]:
    """(tokenizer, note) to audit a TRL template with; the note says when it is a stand-in."""
    for prefix, name in _OWN_TOKENIZER:
        if stem.startswith(prefix):
            return name, ""
    return STAND_IN, f"{STAND_IN} stands in for {stem}'s own tokenizer (not available offline)"


def run_audit(
    chat_template: str | None = None,
    tokenizer: str | None = None,
    relies_on: Mapping[str, Sequence[str]] | None = None,
) -> list[Audit]:
    """Audit one template (`--chat-template` spec, or the tokenizer's own) or every TRL template (`trl:all`),
    judging the strategies of `relies_on` (see `audit_template`).

    Without `tokenizer`, a dump file lends the tokenizer it names, a Qwen template gets its own,
    and any other template is audited with the `qwen3` tokenizer as a stand-in (said in the note).
    """

    audits = []
    for text, identity, name, note in _targets(chat_template, tokenizer):
        loaded = load_tokenizer(name)
        # a stand-in knows no BOS token; templates that print one must still render (as nothing)
        kwargs = {"bos_token": ""} if note and loaded.hf.bos_token is None else {}
        renderer = Renderer(loaded, text, template_kwargs=kwargs, template_identity=identity)
        audits.append(
            audit_template(renderer, template=identity, tokenizer=name, tokenizer_note=note, relies_on=relies_on)
        )
    return audits


def _targets(spec: str | None, tokenizer: str | None) -> list[tuple[str, str, str, str]]:
    """(template text, identity, tokenizer, note) for each template to audit."""

    if spec == ALL_TRL:
        directory = trl_template_dir()
        if directory is None:
            raise TemplateNotFound(
                "trl:all audits the templates the trl package ships; install it with "
                "`pip install trl==1.16.0` or pass --chat-template FILE"
            )
        return [
            (*resolve_template(f"trl:{path.stem}"), *((tokenizer, "") if tokenizer else template_tokenizer(path.stem)))
            for path in sorted(directory.glob("*.jinja"))
        ]
    if not spec and not tokenizer:
        raise TraceToolsError(
            "nothing to audit; pass --chat-template (qwen3, qwen3.5, trl:<name>, trl:all, a .jinja "
            "file or a dump) or --tokenizer"
        )
    note = ""
    if tokenizer is None and spec and spec.endswith(".parquet") and Path(spec).is_file():
        tokenizer = embedded_metadata(Path(spec), "tokenizer")
    if tokenizer is None:
        assert spec, "with no --tokenizer a template is named (checked above)"
        stem = spec[4:] if spec.startswith("trl:") else NAMED_TEMPLATES.get(spec)
        stand_in = (STAND_IN, f"{STAND_IN} stands in: no --tokenizer given")
        tokenizer, note = template_tokenizer(stem) if stem else stand_in
    return [(*resolve_template(spec, tokenizer_name=tokenizer), tokenizer, note)]
