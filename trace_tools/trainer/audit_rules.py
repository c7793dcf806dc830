"""The loss-mask rules `audit-samples` checks, each a named count with examples (docs/trainer_dumps.md).

A rule counts what it `checked` and its `violations`; the first few violations are kept as
examples naming the sample (`rollout_3.pt#samples[17]`) and the tokens. `notes` are counted facts
that break no rule (a turn the trainer never trained, a turn cut off before its stop token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EXAMPLES = 3
TRAINER = "trainer"  # the strategy name an audit run's summary.json keys its numbers by

# name -> what it checks, in the order the report lists them
RULES = {
    "stop_token_trained_once": "every assistant turn whose output is trained has its stop token trained exactly once",
    "role_header_untrained": "generation-prompt (role header) tokens are never trained",
    "context_untrained": "tool, user and system tokens (everything outside assistant output) are never trained",
    "empty_reasoning_untrained": "the empty reasoning block the template inserts is never trained",
    "trained_once": "no token is trained twice across the samples of a session (after the same context)",
    "spans_parse": "every trained span that ends with a stop token decodes to output the family's parser reads",
}
NOTES = {
    "untrained_turns": "assistant turns in a session's samples that no sample trains (dropped turns, "
    "or earlier turns re-rendered as the context of a later sample)",
    "truncated_turns": "trained assistant turns with no stop token (cut off)",
    "empty_responses": "samples with an empty response (response_length 0)",
    "logprobs_mismatch": "samples whose rollout logprobs do not cover the response",
}


@dataclass
class Rule:
    checked: int = 0
    violations: int = 0
    examples: list[str] = field(default_factory=list)

    def count(self, checked: int, violations: int = 0, example: str | None = None) -> None:
        self.checked += checked
        self.violations += violations
        if violations and example is not None and len(self.examples) < EXAMPLES:
            self.examples.append(example)


class Tally:
    """Every rule and note, counted over the whole audit."""

    def __init__(self) -> None:
        self.rules = {name: Rule() for name in RULES}
        self.notes = {name: Rule() for name in NOTES}

    def rule(self, name: str, checked: int, violations: int = 0, example: str | None = None) -> None:
        self.rules[name].count(checked, violations, example)

    def note(self, name: str, count: int = 1, example: str | None = None) -> None:
        self.notes[name].count(count, count, example)

    @property
    def ok(self) -> bool:
        return not any(rule.violations for rule in self.rules.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "rules": {
                name: {"checked": r.checked, "violations": r.violations, "what": RULES[name], "examples": r.examples}
                for name, r in self.rules.items()
            },
            "notes": {
                name: {"count": n.violations, "what": NOTES[name], "examples": n.examples}
                for name, n in self.notes.items()
            },
        }
