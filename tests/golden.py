"""Helpers for tests/test_golden.py: strip what varies run to run (wall times, tmp paths), hash
what is pinned, and read the pinned values in tests/golden/pins.json.

The pins are exact outputs of the code at the commit that added them. A refactor must reproduce
them; a pin changes only with a deliberate, stated behaviour fix, edited by hand in pins.json.
`python tests/golden.py` prints the pins; `python tests/golden_diff.py [g5 ...]` reruns the
observations and prints a diff against them (it never writes them).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterable

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
PINS_FILE = GOLDEN_DIR / "pins.json"


def load_pins() -> dict[str, Any]:
    return json.loads(PINS_FILE.read_text())


def strip_times(trace: dict[str, Any]) -> dict[str, Any]:
    """A trace dict (Trace.to_dict()) without its wall times, the only fields a rerun changes.
    A copy: the input is left as it is."""
    d = json.loads(json.dumps(trace))
    d.pop("wall_time_s", None)
    for s in d.get("steps", []):
        s.pop("wall_time_s", None)
    return d


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_lines(lines: Iterable[str]) -> str:
    """The hash of the lines joined with "\\n" (each line without its newline)."""
    return sha256_bytes("\n".join(lines).encode("utf-8"))


def sha256_file(path: str | Path, root: str | Path | None = None) -> str:
    """The file's bytes hashed; with `root`, every occurrence of that absolute path is first
    replaced by "<ROOT>" so a file naming the test's tmp folder hashes the same in every run."""
    data = Path(path).read_bytes()
    if root is not None:
        data = data.replace(str(root).encode("utf-8"), b"<ROOT>")
    return sha256_bytes(data)


def traces_digest(path: str | Path) -> str:
    """sha256 of a traces JSONL file with the wall times stripped from each record, re-dumped
    with the writer's json.dumps defaults (ensure_ascii=False, key order kept)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return sha256_lines(json.dumps(strip_times(json.loads(x)), ensure_ascii=False) for x in lines)


def without_lines(text: str, pattern: str) -> str:
    """The text minus every line matching the regex `pattern` (wall-time lines)."""
    rx = re.compile(pattern)
    return "\n".join(line for line in text.splitlines() if not rx.search(line))


def blank_column(md: str, header: str, mark: str = "<time>") -> str:
    """Every markdown table whose header row has the cell `header`: that column's cells replaced
    by `mark` in its body rows (a wall-time column), the rest of the text as it is."""
    out, col = [], None
    for line in md.splitlines():
        cells = line.split(" | ") if line.startswith("| ") and line.endswith(" |") else None
        if cells is None:
            col = None if not line.startswith("|---") else col
        elif col is None:
            names = [c.strip("| ") for c in cells]
            col = names.index(header) if header in names else None
        else:
            last = col == len(cells) - 1
            cells[col] = ("| " if col == 0 else "") + mark + (" |" if last else "")
            line = " | ".join(cells)
        out.append(line)
    return "\n".join(out)


if __name__ == "__main__":
    print(json.dumps(load_pins(), indent=2))
