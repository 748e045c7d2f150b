"""Append-only jsonl files that survive a crash or SIGKILL.

Long jobs (eval runs, teacher generation) append one complete JSON line per record and flush
it to disk. On restart, `recover()` reads what is there, cuts off a torn last line (a write
interrupted mid-line), and returns the complete records, so the job continues with no lost and
no duplicated record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable


class JsonlError(ValueError):
    pass


def recover(path: str | Path) -> list[dict[str, Any]]:
    """Complete records of `path` (none if absent). A torn final line is removed from the file;
    a bad line anywhere else is corruption and raises, naming the line."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    records = []
    good_end = 0
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        last = i == len(lines) - 1
        if not raw.strip():
            if not last:
                good_end += len(raw) + 1
            continue
        try:
            rec = json.loads(raw)
            complete = not last  # a last line without "\n" was never finished
        except json.JSONDecodeError:
            rec, complete = None, False
        if not complete:
            if last:
                break
            raise JsonlError(f"{path}:{i + 1}: corrupt line in the middle of the file")
        records.append(rec)
        good_end += len(raw) + 1
    if good_end < len(data):
        with path.open("r+b") as f:
            f.truncate(good_end)
    return records


class JsonlWriter:
    """Appends records as whole lines; each `write` is flushed and fsynced before returning."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, records: Iterable[dict[str, Any]]) -> None:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        if text:
            self._f.write(text)
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Strict reading: every line must be valid JSON (errors name file and line)."""
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise JsonlError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return out
