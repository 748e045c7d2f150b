"""The one table type: markdown for the report files, rich for the terminal, from the same columns."""

import io

from rich import box
from rich.console import Console

from eval.table import Column, Table, counts_table

COLUMNS = [Column("name", lambda r: r["name"]), Column("score", lambda r: f"{r['score']:.2f}", "right"),
           Column("n", lambda r: str(r["n"]), "right")]
ROWS = [{"name": "alpha", "score": 1.0, "n": 3}, {"name": "b", "score": 12.345, "n": 10}]


def text(table, width: int = 60) -> list[str]:
    console = Console(width=width, file=io.StringIO(), color_system=None, record=True)
    console.print(table)
    return console.export_text().splitlines()


def test_markdown_formats_every_cell_and_keeps_the_plain_separator():
    assert Table(COLUMNS, ROWS).markdown() == ("| name | score | n |\n|---|---|---|\n"
                                               "| alpha | 1.00 | 3 |\n| b | 12.35 | 10 |")
    assert Table(COLUMNS).markdown() == "| name | score | n |\n|---|---|---|"


def test_rich_aligns_columns_and_takes_table_options():
    t = Table(COLUMNS, ROWS).rich(title="scores", box=box.ASCII)
    assert [c.header for c in t.columns] == ["name", "score", "n"]
    assert [c.justify for c in t.columns] == ["left", "right", "right"]
    lines = text(t)
    assert lines[0].strip() == "scores"
    # left-aligned names start at the column's edge, right-aligned figures end at it
    assert "| alpha |  1.00 |  3 |" in lines
    assert "| b     | 12.35 | 10 |" in lines


def test_rich_fit_keeps_figures_whole_and_draws_the_rule():
    rows = [{"name": "pooled", "score": 1.0, "n": 1}] + ROWS
    t = Table(COLUMNS, rows).rich(fit=True, rule_after=1, box=box.ASCII)
    assert [(c.no_wrap, c.min_width) for c in t.columns] == [(True, 6), (True, 5), (True, 2)]
    # Narrower than the table: the console crops the lines but never squeezes a figure into two lines.
    assert text(t, width=20) == ["+-------------------", "| name   | score |  ", "|--------+-------+--",
                                 "| pooled |  1.00 |  ", "|--------+-------+--",  # the rule under the first row
                                 "| alpha  |  1.00 |  ", "| b      | 12.35 | 1", "+-------------------"]
    plain = Table(COLUMNS, rows).rich(box=box.ASCII)
    assert [(c.no_wrap, c.min_width) for c in plain.columns] == [(False, None)] * 3
    assert "12.35" not in "\n".join(text(plain, width=20))  # without fit rich wraps the figure


def test_counts_table_keeps_the_given_order_and_right_aligns_counts():
    t = counts_table("reason", {"wrong": 3, "format": 12}.items())
    assert t.markdown() == "| reason | trajectories |\n|---|---|\n| wrong | 3 |\n| format | 12 |"
    assert [c.justify for c in t.rich().columns] == ["left", "right"]
