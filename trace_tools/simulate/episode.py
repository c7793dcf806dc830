"""Episode scripts: what the simulated model does on each turn, independent of any template.

A `Step` is one model turn in the abstract: reasoning, visible text, tool calls with arguments in
the model's own key order, and the results the harness will send back. Steps are planned against
a `Workspace`, whose files change as the agent edits them, so payloads and results agree with
each other. Turning a step into tokens is the job of `formats` (per template family).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from trace_tools.simulate import prose, results
from trace_tools.simulate.workspace import Function, Workspace, function_block, plural


@dataclass
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass
class Step:
    """One model turn: `calls` empty means a text-only turn (a final answer or a summary)."""

    intent: str
    reasoning: str
    content: str
    calls: list[Call] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    subagent: list["Step"] = field(default_factory=list)  # the Task call's conversation
    slots: dict[str, str] = field(default_factory=dict, repr=False)  # prose slots, so a retry can re-word it


# The planned main episode before the final answer, and how essential each intent is: when an
# episode is short, the least essential intents are left out (order is kept).
BASE_PLAN = (
    ("explore", 2),
    ("read", 0),
    ("todo", 5),
    ("reproduce", 3),
    ("edit", 0),
    ("verify", 1),
    ("add_test", 4),
    ("verify", 4),
)
EXTRA_CYCLE = ("grep", "read_other", "tidy", "verify", "shell")


def intent_plan(rng: random.Random, count: int) -> list[str]:
    """`count` intents for the turns before the final answer."""
    plan = list(BASE_PLAN)
    if count >= len(plan):
        extra = [EXTRA_CYCLE[i % len(EXTRA_CYCLE)] for i in range(count - len(plan))]
        return [intent for intent, _ in plan] + extra
    ranked = sorted(range(len(plan)), key=lambda i: (plan[i][1], rng.random()))
    keep = sorted(ranked[:count])
    return [plan[i][0] for i in keep]


def plan_main(rng: random.Random, ws: Workspace, turns: int, task_at: int | None = None) -> list[Step]:
    """The main agent's steps: `turns` model turns, the last one a text-only summary.

    `task_at` places a Task call (a subagent conversation) at that turn.
    """
    intents = intent_plan(rng, turns - 1 - (task_at is not None))
    if task_at is not None:
        intents.insert(min(task_at, len(intents)), "task")
    steps = [PHASES[intent](rng, ws) for intent in intents]
    steps.append(final_step(rng, ws))
    return steps


def final_step(rng: random.Random, ws: Workspace) -> Step:
    bug = ws.planted_bug
    return Step(
        "final",
        prose.reasoning(rng, "final"),
        prose.final_summary(rng, bug.name, bug.path, ws.test_path(bug.path), results.test_count(ws)),
    )


def summary_step(rng: random.Random, ws: Workspace, done: list[Step]) -> Step:
    """The text-only turn a harness asks for before compacting the history."""
    bug = ws.planted_bug
    lines = [_done_line(step) for step in done if step.calls]
    return Step("summary", prose.reasoning(rng, "summary"), prose.compaction_summary(rng, bug.name, bug.path, lines))


def resample(rng: random.Random, step: Step) -> Step:
    """Another sample of the same turn (a retry): new wording, the same calls, results and answer text."""
    intent = _prose_intent(step.intent)
    content = prose.visible(rng, intent, **step.slots) if step.calls else step.content
    return replace(step, reasoning=prose.reasoning(rng, intent, **step.slots), content=content)


def _done_line(step: Step) -> str:
    first = step.calls[0]
    target = first.arguments.get("file_path") or first.arguments.get("command") or first.arguments.get("pattern") or ""
    return f"{first.name} {target}".strip()


def _prose_intent(intent: str) -> str:
    return {"read_other": "read"}.get(intent, intent)


def _slots(ws: Workspace, function: Function) -> dict[str, str]:
    return {
        "func": function.name,
        "path": function.path,
        "ns": plural(function.noun),
        "bad": function.bad.strip(),
        "good": function.good.strip(),
    }


def _step(rng: random.Random, intent: str, slots: dict[str, str], calls: list[Call], outputs: list[str]) -> Step:
    prose_intent = _prose_intent(intent)
    return Step(
        intent,
        prose.reasoning(rng, prose_intent, **slots),
        prose.visible(rng, prose_intent, **slots),
        calls,
        outputs,
        slots=slots,
    )


# -- phases -----------------------------------------------------------------------------------
def explore(rng: random.Random, ws: Workspace) -> Step:
    bug = ws.planted_bug
    calls = [Call("Grep", {"pattern": f"def {bug.name}", "path": ws.root, "output_mode": "content"})]
    if rng.random() < 0.5:  # a parallel call
        calls.append(Call("Glob", {"pattern": "tests/**/*.py"}))
    return _step(rng, "explore", _slots(ws, bug), calls, [results.run(ws, c, rng) for c in calls])


def read(rng: random.Random, ws: Workspace) -> Step:
    bug = ws.planted_bug
    calls = [Call("Read", {"file_path": bug.path})]
    if rng.random() < 0.3:
        calls.append(Call("Read", {"file_path": ws.test_path(bug.path)}))
    return _step(rng, "read", _slots(ws, bug), calls, [results.run(ws, c, rng) for c in calls])


def read_other(rng: random.Random, ws: Workspace) -> Step:
    function = rng.choice(ws.functions)
    start, lines = function_block(ws, function)
    arguments: dict[str, Any] = {"file_path": function.path}
    if rng.random() < 0.5 and not ws.verbose:
        arguments.update(offset=max(start - 2, 1), limit=len(lines) + 6)
    call = Call("Read", arguments)
    return _step(rng, "read_other", _slots(ws, function), [call], [results.run(ws, call, rng)])


def todo(rng: random.Random, ws: Workspace) -> Step:
    fix = f"Fix {ws.planted_bug.name}"
    items = ["Reproduce the reported failure", fix, "Add a regression test", "Run the full test suite"]
    todos = [
        {"content": text, "status": "in_progress" if i == 0 else "pending", "id": str(i + 1)}
        for i, text in enumerate(items)
    ]
    call = Call("TodoWrite", {"todos": todos})
    return _step(rng, "todo", _slots(ws, ws.planted_bug), [call], [results.run(ws, call, rng)])


def reproduce(rng: random.Random, ws: Workspace) -> Step:
    # Models often `cd` into the repository first, although the shell already is there.
    tests = _rel(ws, ws.test_path(ws.planted_bug.path))
    return _bash(rng, ws, "reproduce", f"cd {ws.root} && python -m pytest {tests} -q", "Run the module's tests")


def verify(rng: random.Random, ws: Workspace) -> Step:
    if rng.random() < 0.5:
        return _bash(rng, ws, "verify", "python -m pytest -q", "Run the whole test suite")
    tests = _rel(ws, ws.test_path(ws.planted_bug.path))
    return _bash(rng, ws, "verify", f"python -m pytest {tests} -q", "Rerun the module's tests")


def shell(rng: random.Random, ws: Workspace) -> Step:
    command, description = rng.choice(
        (("git status --short", "Show changed files"), ("git diff --stat", "Summarise the diff"))
    )
    return _bash(rng, ws, "shell", command, description)


def _bash(rng: random.Random, ws: Workspace, intent: str, command: str, description: str) -> Step:
    arguments: dict[str, Any] = {"command": command, "description": description}
    if rng.random() < 0.25:
        arguments["timeout"] = rng.choice((60000, 300000, 600000))
    call = Call("Bash", arguments)
    return _step(rng, intent, _slots(ws, ws.planted_bug), [call], [results.run(ws, call, rng)])


def edit(rng: random.Random, ws: Workspace) -> Step:
    bug = ws.planted_bug
    start, lines = function_block(ws, bug)
    at = next((i for i, line in enumerate(lines) if line == bug.bad), len(lines) // 2)
    lo, hi = max(at - rng.randint(0, 2), 1), min(at + rng.randint(1, 3), len(lines))
    old = "\n".join(lines[lo:hi])
    new = old.replace(bug.bad, bug.good, 1)
    if rng.random() < 0.3:  # the model writes an indented blank line of its own
        new = new.replace(bug.good, bug.good + "\n" + " " * (len(bug.good) - len(bug.good.lstrip())), 1)
    call = Call("Edit", _edit_arguments(rng, bug.path, old, new))
    return _step(rng, "edit", _slots(ws, bug), [call], [results.run(ws, call, rng)])


def tidy(rng: random.Random, ws: Workspace) -> Step:
    function = rng.choice(ws.functions)
    _, lines = function_block(ws, function)
    docstring = next((line for line in lines if '"""' in line), lines[0])
    comment = "    # Kept deliberately simple; see the module docstring." + rng.choice(("", "  "))
    if rng.random() < 0.4:
        edits = [
            {"old_string": docstring, "new_string": docstring + "\n" + comment},
            {"old_string": lines[-1], "new_string": lines[-1].rstrip() + "  # noqa: RET504"},
        ]
        call = Call("MultiEdit", {"file_path": function.path, "edits": edits})
    else:
        call = Call("Edit", _edit_arguments(rng, function.path, docstring, docstring + "\n" + comment))
    return _step(rng, "tidy", _slots(ws, function), [call], [results.run(ws, call, rng)])


def _edit_arguments(rng: random.Random, path: str, old: str, new: str) -> dict[str, Any]:
    arguments: dict[str, Any] = {"file_path": path, "old_string": old, "new_string": new}
    if rng.random() < 0.1:  # now and then the model spells out the default itself
        arguments["replace_all"] = False
    return arguments


def add_test(rng: random.Random, ws: Workspace) -> Step:
    bug = ws.planted_bug
    module = bug.path.rsplit("/", 1)[1][:-3]
    body = results.regression_test(rng, ws.package, module, bug)
    if rng.random() < 0.6:
        path = f"{ws.root}/tests/test_{bug.name}_regression.py"
        call = Call("Write", {"file_path": path, "content": body})
    else:
        path = ws.test_path(bug.path)
        first = ws.lines(path)[0]
        edits = [
            {"old_string": first, "new_string": first + "\nimport pytest"},
            {
                "old_string": ws.lines(path)[-2],
                "new_string": ws.lines(path)[-2] + "\n\n\n" + body.split("\n\n\n", 1)[-1].rstrip("\n"),
            },
        ]
        call = Call("MultiEdit", {"file_path": path, "edits": edits})
    return _step(rng, "add_test", _slots(ws, bug), [call], [results.run(ws, call, rng)])


def grep(rng: random.Random, ws: Workspace) -> Step:
    bug = ws.planted_bug
    arguments: dict[str, Any] = {"pattern": bug.name}
    if rng.random() < 0.5:
        arguments.update(glob="*.py", output_mode="content")
    call = Call("Grep", arguments)
    return _step(rng, "grep", _slots(ws, bug), [call], [results.run(ws, call, rng)])


def task(rng: random.Random, ws: Workspace) -> Step:
    """A Task call; its result is the final answer of the subagent conversation planned here."""
    bug = ws.planted_bug
    prompt = (
        f"In the repository at {ws.root}, find every call site of `{bug.name}` outside its own definition "
        "and say which tests exercise it. Report file paths with line numbers. Do not modify files."
    )
    call = Call(
        "Task",
        {
            "description": f"Map callers of {bug.name}",
            "prompt": prompt,
            "subagent_type": rng.choice(("explore", "general-purpose")),
        },
    )
    sub = plan_subagent(rng, ws, bug)
    step = _step(rng, "task", _slots(ws, bug), [call], [sub[-1].content])
    step.subagent = sub
    return step


def plan_subagent(rng: random.Random, ws: Workspace, function: Function) -> list[Step]:
    """2-4 read-only turns: search, maybe read, then a text answer naming the call sites."""
    slots = _slots(ws, function)
    search = Call("Grep", {"pattern": function.name, "path": ws.root, "output_mode": "content"})
    steps = [_step(rng, "grep", slots, [search], [results.run(ws, search, rng)])]
    if rng.random() < 0.6:
        look = Call("Read", {"file_path": ws.test_path(function.path)})
        steps.append(_step(rng, "read", slots, [look], [results.run(ws, look, rng)]))
    if rng.random() < 0.3:
        listing = Call("Glob", {"pattern": "**/*.py", "path": ws.root})
        steps.append(_step(rng, "explore", slots, [listing], [results.run(ws, listing, rng)]))
    hits = results.grep_hits(ws, function.name)
    answer = prose.subagent_answer(rng, function.name, [h for h in hits if "def " not in h][:6])
    steps.append(Step("final", prose.reasoning(rng, "final"), answer))
    return steps


def _rel(ws: Workspace, path: str) -> str:
    return path[len(ws.root) + 1 :] if path.startswith(ws.root + "/") else path


PHASES: dict[str, Callable[[random.Random, Workspace], Step]] = {
    "explore": explore,
    "read": read,
    "read_other": read_other,
    "todo": todo,
    "reproduce": reproduce,
    "edit": edit,
    "verify": verify,
    "add_test": add_test,
    "grep": grep,
    "tidy": tidy,
    "shell": shell,
    "task": task,
}
