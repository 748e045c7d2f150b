"""The canonical layout of one step's output: what the prompts ask for, the inverse of the parser.

data_gen writes SFT targets in this layout (silver trajectories, and teacher outputs normalized
through parse -> render), so a student learns exactly one layout and the parser reads it back
unchanged: parse_step_output(render_step_output(...)) gives the same index, judgment and query.
"""

from __future__ import annotations

from kair_runtime.index import get_format
from kair_runtime.records import Index


def render_step_output(index: Index, reasoning: str, judgment: str, next_query: str | None) -> str:
    if judgment not in ("sufficient", "insufficient"):
        raise ValueError(f"judgment must be 'sufficient' or 'insufficient', not {judgment!r}")
    fmt = get_format(index.format)
    reasoning = " ".join(reasoning.split())
    # The judgment always closes the reasoning, in the words the prompt asks for.
    text = f"{reasoning} Judgment: {judgment}".strip() if reasoning else f"Judgment: {judgment}"
    query = next_query if judgment == "insufficient" and next_query else "none"
    parts = []
    if getattr(fmt, "expects_index", True):
        parts.append(f"<index>\n{fmt.linearize(index)}\n</index>")
    parts += [f"<reasoning>{text}</reasoning>", f"<query>{query}</query>"]
    return "\n".join(parts)
