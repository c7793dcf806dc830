"""Natural-language pieces of a session: system prompts, the task, reasoning, visible text.

Every function takes the session's `random.Random` and picks among phrasings, so sessions read
differently while staying deterministic. The text is ASCII on purpose: payloads round-trip
through `json.dumps` in two places (the model's tool-call JSON and the gateway's `arguments`
string) and the simulator should not add escaping differences that no behaviour asked for.
"""

from __future__ import annotations

import random

MAIN_SYSTEM = """You are a software engineering agent working inside a checked-out repository at {root}.
You solve the user's task by reading code, editing files and running commands with the tools provided.

Working rules:
- Look before you change: read the relevant code and reproduce a failure before fixing it.
- Keep edits minimal and in the style of the surrounding code.
- Run the tests after every change and report what you ran.
- Use the todo list for tasks with more than two steps, and keep exactly one item in progress.
- When you are done, reply with a short summary of the change and the test results, without a tool call.

Working directory: {root}"""

SUB_SYSTEM = """You are a read-only research subagent for a coding agent. The repository is at {root}.
Answer the question you are given by searching and reading files; never modify anything.
Finish with a concise answer that names files and line numbers, because the agent that called you
cannot see your intermediate steps.

Working directory: {root}"""

TASK = (
    "{issue}\n\nThe failing behaviour was reported against `{func}` in `{module}`. "
    "Please fix it, add a regression test, and make sure the test suite passes."
)
ISSUES = (
    "Bug report: `{func}` gives the wrong result for boundary input.",
    "Since the last release `{func}` misbehaves on some inputs; users see wrong {ns}.",
    "Regression: calling `{func}` with edge-case data returns an unexpected value.",
    "Our nightly job crashed because `{func}` returned the wrong {ns}.",
)

COMPACT_REQUEST = (
    "Your context is nearly full. Write a summary of this session so far that another instance "
    "of you could continue from: the task, what you found, what you changed, and what is left. "
    "Reply with the summary only."
)
COMPACT_CONTINUE = (
    "This conversation continues an earlier session whose history was compacted. "
    "Summary of the earlier session:\n\n{summary}\n\nContinue with the remaining work."
)
TRUNCATION_NUDGE = (
    "Your previous reply was cut off because it hit the output token limit. "
    "Continue, and keep each tool call small (split large files into several edits)."
)
CLEARED_RESULT = "[tool result cleared to save context]"


def task_text(rng: random.Random, func: str, module: str, nouns: str) -> str:
    issue = rng.choice(ISSUES).format(func=func, ns=nouns)
    return TASK.format(issue=issue, func=func, module=module)


def sentences(rng: random.Random, options: tuple[str, ...], k: int, **slots: str) -> str:
    """`k` of the options, in their written order (they read as a sequence)."""
    picked = sorted(rng.sample(range(len(options)), min(k, len(options))))
    return " ".join(options[i].format(**slots) for i in picked)


REASONING = {
    "explore": (
        "The report points at `{func}`, but I do not know the layout of the repository yet.",
        "A search for the definition and a look at the test files should orient me.",
        "I'll start broad and narrow down once I see where `{func}` lives.",
        "Searching first is cheaper than reading every module.",
    ),
    "read": (
        "`{func}` is defined in `{path}`; I need to read it before deciding anything.",
        "Reading the whole module also shows the helpers it relies on.",
        "I want to see how it handles {ns} at the boundary.",
        "The docstring should tell me what the intended behaviour is.",
    ),
    "todo": (
        "This needs several steps, so I'll track them in the todo list.",
        "Plan: reproduce, fix, add a regression test, run the suite.",
        "Keeping one item in progress at a time.",
    ),
    "reproduce": (
        "Before changing anything I want to see the failure myself.",
        "Running the module's tests should show whether the existing tests catch it.",
        "If they pass, the bug is not covered yet and I'll need a new test.",
    ),
    "edit": (
        "The problem is this line: `{bad}`.",
        "It should read `{good}`; the current version disagrees with the docstring.",
        "That explains the wrong {ns} in the report.",
        "I'll change just that line and keep the surrounding code as it is.",
    ),
    "verify": (
        "Now rerun the tests to confirm the change.",
        "If anything else depended on the old behaviour it will show up here.",
        "I'll run the module's tests first, then the whole suite.",
    ),
    "add_test": (
        "The existing tests did not catch this, so I'll add a regression test.",
        "The test should exercise exactly the boundary case from the report.",
        "A separate test file keeps the change easy to review.",
    ),
    "grep": (
        "Other call sites may rely on the same pattern.",
        "Let me check where `{func}` is used before going further.",
        "A quick search will tell me whether the fix has knock-on effects.",
    ),
    "tidy": (
        "While I'm here, `{func}` has a small style problem worth fixing.",
        "This is a low-risk cleanup in the same module.",
        "I'll keep it separate from the bug fix in my summary.",
    ),
    "shell": (
        "Let me check the state of the working tree.",
        "A quick look at what changed so far keeps the summary accurate.",
        "I want to make sure no stray files were created.",
    ),
    "task": (
        "Finding every caller by hand would take several searches.",
        "A subagent can survey the repository while I keep this context small.",
        "I'll ask it for call sites and any tests that cover them.",
    ),
    "final": (
        "Everything passes now.",
        "Time to summarise what changed and why.",
        "The summary should mention the regression test and the commands I ran.",
    ),
    "summary": (
        "I need to compress the session without losing the state of the work.",
        "The important parts are the bug, the fix and what remains.",
    ),
}

FOLLOW_UPS = (
    "After that I'll decide on the next step.",
    "I'll keep the change as small as possible.",
    "Nothing else in the report needs attention yet.",
    "I should keep the todo list in sync as I go.",
    "If this turns out to be a dead end I'll go back to the search results.",
)

CONTENT = {
    "explore": ("Let me find where `{func}` is defined.", "I'll search the repository first."),
    "read": ("Reading `{path}`.", "Let me look at the implementation."),
    "reproduce": ("Running the tests to reproduce the problem.",),
    "edit": ("Fixing the condition in `{func}`.", "Applying the fix."),
    "verify": ("Rerunning the tests.",),
    "add_test": ("Adding a regression test.",),
    "task": ("I'll have a subagent map the call sites.",),
}


def reasoning(rng: random.Random, intent: str, **slots: str) -> str:
    """Two or three sentences for `intent`, sometimes split into two paragraphs."""
    options = REASONING[intent]
    text = sentences(rng, options, rng.randint(2, 3), **slots)
    if intent not in ("final", "summary") and rng.random() < 0.35:
        text += "\n\n" + rng.choice(FOLLOW_UPS)
    return text


def visible(rng: random.Random, intent: str, **slots: str) -> str:
    """The short visible text before tool calls; empty about half of the time."""
    options = CONTENT.get(intent)
    if not options or rng.random() < 0.5:
        return ""
    return rng.choice(options).format(**slots)


def final_summary(rng: random.Random, func: str, path: str, test_path: str, passed: int) -> str:
    bullets = [
        f"- Fixed the boundary handling in `{func}` (`{path}`).",
        f"- Added a regression test in `{test_path}`.",
        f"- Ran `python -m pytest -q`: {passed} passed.",
    ]
    opener = rng.choice(("Done.", "The fix is in.", "Summary of the change:"))
    closer = rng.choice(
        ("", "\n\nNo other call sites needed changes.", "\n\nLet me know if you want the old behaviour behind a flag.")
    )
    return f"{opener}\n\n" + "\n".join(bullets) + closer


def subagent_answer(rng: random.Random, func: str, hits: list[str]) -> str:
    listed = "\n".join(f"- {hit}" for hit in hits) or "- no call sites outside its own module"
    return f"`{func}` is called from {len(hits)} place(s):\n{listed}\n\n" + rng.choice(
        ("None of the callers pass boundary values on purpose.", "Only the tests exercise the boundary case.")
    )


def compaction_summary(rng: random.Random, func: str, path: str, done: list[str]) -> str:
    steps = "\n".join(f"{i}. {d}" for i, d in enumerate(done, start=1)) or "1. Explored the repository."
    return f"Task: fix `{func}` in `{path}` and add a regression test.\n\nProgress so far:\n{steps}\n\n" + rng.choice(
        ("Remaining: finish the fix and run the full test suite.", "Remaining: verify the fix and write the summary.")
    )
