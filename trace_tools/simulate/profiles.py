"""Session size profiles: how big the repository, the harness prompt and the episode are.

`swe` is the default: short SWE episodes (3–40 turns, contexts of a few thousand tokens), what
the bundled sample and the behaviour tests use. `swe-long` sizes sessions like a Claude-Code-class
harness in a real RL run: a harness manual and detailed tool descriptions in the system header
(about 8k tokens before the task), a repository of larger modules whose reads return a few
thousand tokens, and 25–45 turns, so contexts end between roughly 25k and 60k tokens. It is the
shape the replay benchmark measures (`benchmarks/bench_replay.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trace_tools.errors import UnknownName


@dataclass(frozen=True)
class Profile:
    name: str
    min_turns: int  # fewest model turns of a main conversation
    default_max_turns: int  # most model turns unless --max-turns says otherwise
    modules: tuple[int, int]  # modules in the repository (inclusive range)
    functions: tuple[int, int]  # functions per module (inclusive range)
    manual: bool  # harness manual, project memory and detailed tool descriptions in the prompt


PROFILES = {
    "swe": Profile("swe", 3, 40, (3, 5), (3, 6), manual=False),
    "swe-long": Profile("swe-long", 25, 45, (5, 7), (24, 36), manual=True),
}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise UnknownName("profile", name, list(PROFILES))
    return PROFILES[name]
