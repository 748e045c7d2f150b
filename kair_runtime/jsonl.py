"""Append-only jsonl files that survive a crash or SIGKILL.

Long jobs (eval runs, teacher generation) append one complete JSON line per record and flush
it to disk. On restart, `recover()` reads what is there, cuts off a torn last line (a write
interrupted mid-line), and returns the complete records, so the job continues with no lost and
no duplicated record. `replace_records()` swaps some records for new ones (a retried failure)
by rewriting the file atomically: a kill leaves either the old file or the new one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable


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


def replace_records(path: str | Path, new: dict[str, dict[str, Any]], key: Callable[[dict[str, Any]], str]) -> None:
    """Replace, in place, each record of `path` whose key(record) is in `new`; the others and the
    order stay. Written to a temporary file, fsynced, then renamed over `path`."""
    path = Path(path)
    records = recover(path)
    missing = set(new) - {key(r) for r in records}
    if missing:
        raise KeyError(f"{path}: no record to replace for {sorted(missing)[:3]}")
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write("".join(json.dumps(new.get(key(r), r), ensure_ascii=False) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


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
