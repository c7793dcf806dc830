"""Terminal tables that fit: no number is ever cut, at 80 columns, in a pipe, in a CI log.

A table is described as key columns (what a row is: a strategy, a tool, a session) and value
columns. `fit` measures every column at its full width and, when they do not all fit the
console, stacks them: several tables, each repeating the key columns and holding as many value
columns as fit. Numbers never wrap; only columns marked `wrap` (free text such as a detail or a
note) may break between words. Long identifiers are shortened from the middle (`middle`), so ids
that share a prefix stay distinct. Strategy names become their declared short labels, with a legend.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich import box
from rich.cells import cell_len
from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from trace_tools.strategies.declarations import label

GAP = 2  # columns are separated by two spaces
ABSENT = "n/a"  # a cell with no value (never "-", which reads as a minus sign)
WRAP_WIDTH = 12  # what a wrapping text column asks for; it takes whatever width is left over


def legend(strategies: Iterable[str]) -> str:
    """`restore = echo-restore, …` for the labels shown that differ from their strategy's name."""
    pairs = [f"{label(name)} = {name}" for name in strategies if label(name) != name]
    return ("labels: " + ", ".join(pairs)) if pairs else ""


def count(n: int, noun: str) -> str:
    """`1 session`, `2 sessions`, `1,234 turns`."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def signed_pct(fraction: float, digits: int = 1) -> str:
    """`+3.2%`, `-2.9%`, `0.0%` for exactly zero; a change too small for `digits` keeps its sign
    with up to two more digits (`-0.04%`), then `-<0.001%`: a tiny loss never reads as no change."""
    if fraction == 0:
        return f"{0:.{digits}f}%"
    for shown in range(digits, digits + 3):
        text = f"{100 * fraction:+.{shown}f}%"
        if float(text[:-1]) != 0:
            return text
    return f"{'+' if fraction > 0 else '-'}<{10 ** -(digits + 2):.{digits + 2}f}%"


def middle(text: str, limit: int = 24) -> str:
    """`text` shortened from the middle to at most `limit` cells: `sim-qwe…s7-0003`."""
    if cell_len(text) <= limit:
        return text
    keep = limit - 1
    return text[: (keep + 1) // 2] + "…" + text[len(text) - keep // 2 :]


@dataclass
class Column:
    header: str  # "\n" stacks a header over two lines
    cells: list[str] = field(default_factory=list)
    justify: JustifyMethod = "right"
    wrap: bool = False  # free text that may break between words; never a number

    @property
    def width(self) -> int:
        """The cells a column needs to show every cell whole (a wrapping column: its longest word, at least)."""
        texts = [self.header, *self.cells]
        if self.wrap:
            words = [cell_len(word) for text in texts for word in text.split()]
            return max([min(WRAP_WIDTH, max(cell_len(t) for t in texts)), *words])
        return max(cell_len(line) for text in texts for line in text.split("\n"))


def fit(key: Sequence[Column], values: Sequence[Column], width: int) -> list[Table | Text]:
    """Tables showing every column whole within `width` cells, key columns repeated in each,
    a blank line between stacked tables."""
    key_width = sum(column.width for column in key) + GAP * max(len(key) - 1, 0)
    groups: list[list[Column]] = [[]]
    used = key_width
    for column in values:
        if groups[-1] and used + GAP + column.width > width:
            groups.append([])
            used = key_width
        groups[-1].append(column)
        used += GAP + column.width
    tables: list[Table | Text] = []
    for group in groups:
        tables += [Text("")] if tables else []
        tables.append(_table([*key, *group]))
    return tables


def _table(columns: Sequence[Column]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True)
    for column in columns:
        if column.wrap:
            table.add_column(column.header, justify=column.justify, overflow="fold")
        else:
            table.add_column(column.header, justify=column.justify, no_wrap=True, min_width=column.width)
    for row in zip(*(column.cells for column in columns)):
        table.add_row(*row)
    return table
