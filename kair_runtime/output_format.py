"""The canonical layout of one step's output: what the prompts ask for, the inverse of the parser.

data_gen writes SFT targets in this layout (silver trajectories, and teacher outputs normalized
through parse -> render), so a student learns exactly one layout and the parser reads it back
unchanged: parse_step_output(render_step_output(...)) gives the same index, judgment and query.
The layout itself is defined in kair_runtime/layout.py.
"""

from __future__ import annotations

from kair_runtime.layout import check_judgment, step_layout
from kair_runtime.records import Index


def render_step_output(index: Index, reasoning: str, judgment: str, next_query: str | None) -> str:
    check_judgment(judgment)
    return step_layout(index.format).render(index, reasoning, judgment, next_query)
