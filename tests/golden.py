"""Helpers for tests/test_golden.py: strip what varies run to run (wall times, tmp paths), read
the pins (tests/golden/pins.json and the golden files beside it), and compare a file of records
with its golden file so that a failure shows the records that changed.

The pins are exact outputs of the code at the commit that added them. A refactor must reproduce
them; a pin changes only with a deliberate, stated behaviour fix. Small values (counts, scores,
summaries, tables) are written inline in pins.json and edited there by hand. Files of records
(silver and teacher trajectories, SFT chats, eval traces with the wall times stripped) are
committed under tests/golden/ as JSONL, one record a line, and pins.json names each one as
{"golden_file": "<path under tests/golden/>"}; a test compares the observed text with that file
line by line (check_golden_files) rather than through a digest, so a failure is readable.

Commands (run from the repository root, in the project environment):
  python tests/golden.py                            prints the pins (pins.json)
  python tests/golden_diff.py [g1 g5 ...]           reruns the observations, prints every
                                                    difference from the pins and golden files
  python tests/golden_diff.py --write-files [g5 ...]
                                                    the one command that rewrites golden files:
                                                    the named observations' files, never pins.json

Nothing else writes a pin or a golden file, the tests least of all. Use --write-files only for a
stated behaviour fix, and read `git diff tests/golden/` before committing what it wrote.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any, Iterable

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
PINS_FILE = GOLDEN_DIR / "pins.json"
FILE_KEY = "golden_file"  # a pin value {"golden_file": name}: the observation is the text of that file
SHOWN_RECORDS = 3  # differing records a failed test shows; golden_diff.py shows them all
SHOWN_LINES = 60  # lines of one changed record's diff a failed test shows
SHOWN_WHOLE = 12  # lines of a record only one side has: its opening names it (question, id)


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


def file_text(path: str | Path) -> str:
    """The file's text exactly as stored: read_text would turn a "\\r\\n" into "\\n" and hide it."""
    return Path(path).read_bytes().decode("utf-8")


def jsonl_text(records: Iterable[dict[str, Any]]) -> str:
    """The records one a line, dumped as the project's writers dump them (ensure_ascii=False, key
    order kept), each line ending with a newline."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def stripped_traces(path: str | Path) -> str:
    """A traces JSONL file's text with the wall times stripped from each record."""
    return jsonl_text(strip_times(json.loads(x)) for x in file_text(path).splitlines())


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


# ---------------------------------------------------------------- golden files

def golden_path(pin: Any) -> Path | None:
    """The golden file a pin value names, or None for a value pinned inline."""
    if isinstance(pin, dict) and set(pin) == {FILE_KEY}:
        return GOLDEN_DIR / pin[FILE_KEY]
    return None


def split_files(observed: Any, pinned: Any, where: str = "") -> tuple[Any, list[tuple[str, Path, str]]]:
    """Separate the parts of `observed` that `pinned` keeps in golden files from the rest.

    Returns (rest, files): `rest` is `observed` with each such part replaced by its pin value, so
    it equals `pinned` when every inline value matches; `files` lists (key path, golden file,
    observed text) for those parts. A part whose observation is not text (the observation changed
    shape) stays in `rest`, where the inline comparison reports it."""
    path = golden_path(pinned)
    if path is not None:
        return (pinned, [(where, path, observed)]) if isinstance(observed, str) else (observed, [])
    if not (isinstance(observed, dict) and isinstance(pinned, dict)):
        return observed, []
    rest, files = {}, []
    for key, value in observed.items():
        if key in pinned:
            value, found = split_files(value, pinned[key], f"{where}.{key}" if where else key)
            files += found
        rest[key] = value
    return rest, files


def _pretty(line: str) -> list[str]:
    """One record as lines to diff: a JSON object indented, with the newlines inside its strings
    (prompts, chats) shown as line breaks; other text as it is. For reading only."""
    try:
        record = json.loads(line)
    except ValueError:
        return [line]
    return json.dumps(record, indent=1, ensure_ascii=False).replace("\\n", "\n").split("\n")


def record_diff(observed: str, golden: str, records: int | None = SHOWN_RECORDS,
                lines: int | None = SHOWN_LINES) -> list[str]:
    """[] when the texts are equal. Otherwise a readable account: how many records (lines) differ,
    then a unified diff, golden -> observed, of each of the first `records` of them (all with
    None), each record pretty-printed and its diff cut after `lines` lines (None: not cut).

    Records are matched by content (difflib), not by position, so one inserted record shows as
    one added record rather than every later record as changed."""
    old, new = golden.split("\n"), observed.split("\n")  # not splitlines: "\u2028" may sit in a record
    if old == new:
        return []
    pairs: list[tuple[int | None, int | None]] = []  # (golden index, observed index), None: absent
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            pairs += [(i1 + k if i1 + k < i2 else None, j1 + k if j1 + k < j2 else None)
                      for k in range(max(i2 - i1, j2 - j1))]
    def count(parts: list[str]) -> int:  # lines, not counting the empty one after the last newline
        return len(parts) - (parts[-1] == "")
    out = [f"{len(pairs)} record(s) differ (golden file {count(old)} lines, observed {count(new)})"]
    for i, j in pairs[:records]:
        a = _pretty(old[i]) if i is not None else []
        b = _pretty(new[j]) if j is not None else []
        head = (f"golden line {i + 1}" if i is not None else "golden: no such line",
                f"observed line {j + 1}" if j is not None else "observed: no such line")
        diff = list(difflib.unified_diff(a, b, *head, lineterm=""))
        if not diff:  # the same record written differently (escapes, spacing): show where
            at = next((k for k, (x, y) in enumerate(zip(old[i], new[j])) if x != y), min(len(old[i]), len(new[j])))
            diff = [f"--- {head[0]}", f"+++ {head[1]}", "same record, written differently from character "
                    f"{at}:", f"- {old[i][max(0, at - 40):at + 40]!r}", f"+ {new[j][max(0, at - 40):at + 40]!r}"]
        cut = lines if lines is None or (i is not None and j is not None) else min(lines, SHOWN_WHOLE)
        if cut is not None and len(diff) > cut:
            diff = diff[:cut] + [f"... {len(diff) - cut} more lines of this record's diff"]
        out += diff
    if records is not None and len(pairs) > records:
        out.append(f"... and {len(pairs) - records} more differing line(s)")
    return out


def check_golden_files(observed: Any, pinned: Any, name: str = "") -> Any:
    """Compare every part of `observed` that `pinned` keeps in a golden file with that file and
    raise AssertionError showing the first differing records of each file that differs. Returns
    the rest (see split_files), for the caller to compare inline under pytest's own diff:
        assert check_golden_files(observed, PINS[name], name) == PINS[name]"""
    __tracebackhide__ = True  # pytest: report the failure at the test's line, not here
    rest, files = split_files(observed, pinned)
    report = []
    for where, path, text in files:
        rel = path.relative_to(GOLDEN_DIR.parent.parent)
        diff = record_diff(text, file_text(path)) if path.exists() else ["the golden file is missing"]
        if diff:
            report += [f"{name}{'.' if name and where else ''}{where}: observed != {rel}", *diff, ""]
    if report:
        command = f"python tests/golden_diff.py {name.split('_')[0]}".rstrip()
        report.append(f"`{command}` shows every difference")
        raise AssertionError("\n".join(report))
    return rest


if __name__ == "__main__":
    print(json.dumps(load_pins(), indent=2))
