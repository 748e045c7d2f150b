"""The one table type behind every report: eval's results.md, the demo's table, the filter,
quality and SFT data reports.

A `Table` is a list of columns (a header, an alignment, and a formatter that turns a row into
its cell text) over a list of rows of any type. `.markdown()` writes the table for the report
files; `.rich()` builds a rich Table for the terminal from the same columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Any], str]  # row -> the text in this column
    # Where the terminal justifies the text. The markdown separator is "---" whatever the
    # alignment, the layout the report files have always had (pinned by tests/test_golden.py).
    align: Literal["left", "right"] = "left"


@dataclass
class Table:
    columns: list[Column]
    rows: list[Any] = field(default_factory=list)

    def cells(self) -> list[list[str]]:
        return [[c.cell(r) for c in self.columns] for r in self.rows]

    def markdown(self) -> str:
        """Header, "|---|" separator and one line per row; no trailing newline."""
        lines = ["| " + " | ".join(c.header for c in self.columns) + " |", "|" + "---|" * len(self.columns)]
        return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in self.cells()])

    def rich(self, *, fit: bool = False, rule_after: int | None = None, **table_kwargs: Any):
        """A rich Table; `table_kwargs` (title, caption, box, ...) go to its constructor.
        fit: every column at least as wide as its widest cell and never wrapped, so figures are
        never cut. rule_after: draw a section rule under the first that many rows."""
        from rich.table import Table as RichTable

        body = self.cells()
        t = RichTable(**table_kwargs)
        for i, c in enumerate(self.columns):
            if fit:
                t.add_column(c.header, justify=c.align, no_wrap=True,
                             min_width=max([len(c.header), *(len(cells[i]) for cells in body)]))
            else:
                t.add_column(c.header, justify=c.align)
        for i, cells in enumerate(body):
            t.add_row(*cells, end_section=i + 1 == rule_after)
        return t


def counts_table(key_header: str, counts: Iterable[tuple[Any, Any]], count_header: str = "trajectories") -> Table:
    """Two columns: each key and its count (e.g. rejection reasons), in the given order."""
    return Table([Column(key_header, lambda kv: str(kv[0])), Column(count_header, lambda kv: str(kv[1]), "right")],
                 list(counts))
