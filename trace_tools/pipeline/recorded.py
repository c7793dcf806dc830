"""Recorded prompt ids read as int32 arrays (`io.load`, `id_arrays=True`), compared with their
renders without becoming lists first, and made lists (the data model's `list[int]`) only then.

A turn's recorded prompt usually equals its render, which the replay makes anyway (prompt
fidelity): such a prompt becomes the render's own list, and only a prompt that differs is
converted. Converting every recorded prompt to a list of shared ints as it was read took 7 % of
`replay -s tree --workers 1` on the benchmark's dump (docs/performance.md).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from trace_tools.ids import array_prefix, common_prefix_len
from trace_tools.io.id_columns import SharedLists


class Comparison:
    """Each turn's rendered prompt against its recorded one, a session's turns in order: where
    they first differ.

    Recorded ids read as int32 arrays (`io.load`, `id_arrays=True`: `reconstruct`, and every
    replay) are compared without becoming lists, which was a tenth of a reconstruct worker's
    time. A session's prompts repeat its history, so this turn's rendered and recorded prompts
    each share a prefix with the previous turn's (the rendered lists, of shared ints, are
    compared at memory speed, the arrays by numpy). Within the shorter of the two prefixes this
    turn's prompts agree where the previous turn's did: they agree up to that turn's divergence,
    and differ there if it lies inside. Only the rendered ids beyond are converted to an array
    and compared. Lists are compared as lists."""

    def __init__(self) -> None:
        self._last: tuple[Sequence[int], Any, int] | None = None  # (rendered, recorded, common prefix)

    def forget(self) -> None:
        """The next turn has no previous one to start from (this one was not compared)."""
        self._last = None

    def common_prefix(self, recorded: Sequence[int], rendered: Sequence[int]) -> int:
        """The length of the longest common prefix of the two prompts."""
        if not isinstance(recorded, np.ndarray):
            self._last = None
            return common_prefix_len(recorded, rendered)
        agreed, decided = self._from_last(recorded, rendered)
        end = min(len(recorded), len(rendered))
        if not decided and agreed < end:
            rest = np.fromiter(rendered[agreed:end], dtype=np.int64, count=end - agreed)
            agreed += array_prefix(recorded[agreed:end], rest)
        self._last = (rendered, recorded, agreed)
        return agreed

    def _from_last(self, recorded: Any, rendered: Sequence[int]) -> tuple[int, bool]:
        """(a length over which the prompts agree, whether it is where they first differ)."""
        if self._last is None:
            return 0, False
        last_rendered, last_recorded, last_agreed = self._last
        same = common_prefix_len(rendered, last_rendered)
        same = min(same, len(recorded), len(last_recorded))
        same = array_prefix(recorded[:same], last_recorded[:same])
        # On [0, same) both prompts equal the previous turn's. A previous divergence inside that
        # range lies below both previous lengths, so it is a differing token, and it is this one's.
        return (last_agreed, True) if last_agreed < same else (same, False)


class RecordedPrompts:
    """A session's recorded prompts, turn by turn in order: each compared with its render
    (`compare`), and each left an array made a list (`compare`, `materialize`), on the turn and
    on the prepared turn that feeds it."""

    def __init__(self) -> None:
        self._comparison = Comparison()
        self._lists = SharedLists()

    def compare(self, prepared: Any, rendered: list[int]) -> int:
        """How many leading ids the turn's recorded prompt shares with `rendered`, its render."""
        recorded = prepared.turn.prompt_ids
        at = self._comparison.common_prefix(recorded, rendered)
        if isinstance(recorded, np.ndarray):
            if at == len(recorded) == len(rendered):
                self._lists.follows(recorded, rendered)
                self._listed(prepared, rendered)
            else:
                self._listed(prepared, self._lists.listed(recorded))
        return at

    def materialize(self, turns: Sequence[Any]) -> None:
        """Every recorded prompt still an array made a list (turns not compared: no renderer)."""
        for prepared in turns:
            if isinstance(prepared.turn.prompt_ids, np.ndarray):
                self._listed(prepared, self._lists.listed(prepared.turn.prompt_ids))

    @staticmethod
    def _listed(prepared: Any, ids: list[int]) -> None:
        if prepared.prompt_origin == "recorded":
            prepared.prompt_ids = ids
        prepared.turn.prompt_ids = ids
