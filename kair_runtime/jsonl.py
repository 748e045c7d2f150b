"""Reading JSON/jsonl input and writing files that survive a crash or SIGKILL.

Reading: every JSON or jsonl file the project takes from a user goes through `iter_lines` /
`iter_jsonl` / `iter_json_records` / `read_json`, the one home of the decoding rules: UTF-8, a
byte-order mark at the start is dropped (editors on Windows add one), and any error names the file
and the line.

Writing: long jobs (eval runs, teacher generation) append one complete JSON line per record and
flush it to disk. On restart, `recover()` reads what is there, cuts off a torn last line (a write
interrupted mid-line), and returns the complete records, so the job continues with no lost and
no duplicated record. A derived file written whole (a corpus, a manifest) goes through
`atomic_write`, so a kill leaves the old file or none, never half of one; `replace_records()`
swaps some records for new ones (a retried failure) by rewriting the file through it.
"""

from __future__ import annotations

import codecs
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from kair_runtime.errors import UserError


class JsonlError(UserError, ValueError):
    pass


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class BadLine:
    """A jsonl line that is not JSON, handed on in place of its record (`keep_bad=True`), so a
    caller that skips malformed records can count it."""

    reason: str


def _not_utf8(path: str | Path, lineno: int, byte: int, column: int) -> JsonlError:
    return JsonlError(f"{path}:{lineno}: not UTF-8 text (byte 0x{byte:02x} at column {column}); save the file as UTF-8")


def decode_line(raw: bytes, path: str | Path, lineno: int) -> str:
    """One line's bytes as UTF-8; an error names the file, line and column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(path, lineno, raw[e.start], e.start + 1) from None


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of every non-blank line of a UTF-8 file, streamed."""
    with Path(path).open("rb") as f:
        for n, raw in enumerate(f, 1):
            if n == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            text = decode_line(raw, path, n)
            if text.strip():
                yield n, text


def read_text(path: str | Path) -> str:
    """A whole UTF-8 file (BOM dropped); a bad byte is reported with its line."""
    data = Path(path).read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        raise _not_utf8(path, data.count(b"\n", 0, e.start) + 1, data[e.start], e.start - line_start + 1) from None


def read_json(path: str | Path) -> Any:
    """A whole JSON file (read_text's rules); bad JSON is a JsonlError naming the file and line."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise JsonlError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None


def iter_jsonl(path: str | Path, keep_bad: bool = False) -> Iterator[tuple[int, Any]]:
    """(line number, record) per non-blank line. A line that is not JSON raises JsonlError naming
    it, or with keep_bad comes through as a BadLine."""
    for n, line in iter_lines(path):
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            if not keep_bad:
                raise JsonlError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            yield n, BadLine(f"not valid JSON ({e.msg})")


def is_json_array(path: str | Path) -> bool:
    """A JSON array or jsonl? Told by the first character that is neither space nor a BOM."""
    with Path(path).open("rb") as f:
        head = f.read(4096)
    return head.lstrip(codecs.BOM_UTF8).lstrip().startswith(b"[")


def iter_json_records(path: str | Path, keep_bad: bool = False) -> Iterator[tuple[str, Any]]:
    """(location, record) from a JSON array or a jsonl file; location is `file:line` for jsonl
    and `file[record i]` (0-based) for an array."""
    path = Path(path)
    if is_json_array(path):
        for i, rec in enumerate(read_json(path)):
            yield f"{path}[record {i}]", rec
        return
    for n, rec in iter_jsonl(path, keep_bad):
        yield f"{path}:{n}", rec


# ---------------------------------------------------------------- writing


@contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Write `path` whole or not at all: the block writes a temporary file beside it (named per
    process, so machines sharing a folder never write the same one), renamed over `path` when
    the block ends without error and removed when it does not."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open(mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


def json_line(record: dict[str, Any]) -> str:
    """One record as the project writes every jsonl line."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def atomic_write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """A whole jsonl file, or none (atomic_write)."""
    with atomic_write(path) as f:
        f.writelines(map(json_line, records))


def complete_records(path: str | Path) -> tuple[list[tuple[int, Any]], int, int | None]:
    """The records a writer finished in `path`: [(line number, record)], the byte length they
    span, and the line number of a torn last line (None if there is none). A record is finished
    once its newline is written (JsonlWriter writes whole lines), so a last line without one, or
    one that a kill cut inside a character, is torn, not corrupt; a bad line anywhere before the
    last is corruption and raises, naming the line."""
    path = Path(path)
    data = path.read_bytes()
    records: list[tuple[int, Any]] = []
    good_end = 0
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        last = i == len(lines) - 1
        if not raw.strip():
            if not last:
                good_end += len(raw) + 1
            continue
        try:
            records.append((i + 1, json.loads(decode_line(raw, path, i + 1))))
        except (ValueError, JsonlError) as e:  # JSONDecodeError; a kill can cut a line inside a UTF-8 character
            if last:
                return records, good_end, i + 1
            raise JsonlError(f"{path}:{i + 1}: corrupt line in the middle of the file ({e})") from None
        if last:  # parsed, but the newline that finishes a record never came
            records.pop()
            return records, good_end, i + 1
        good_end += len(raw) + 1
    return records, good_end, None


def recover(path: str | Path) -> list[dict[str, Any]]:
    """Complete records of `path` (none if absent). A torn final line is removed from the file
    (the writer resuming it appends after the last finished record); any other bad line raises."""
    path = Path(path)
    if not path.exists():
        return []
    records, good_end, torn = complete_records(path)
    if torn is not None:
        with path.open("r+b") as f:
            f.truncate(good_end)
    return [rec for _, rec in records]


class JsonlWriter:
    """Appends records as whole lines; each `write` is flushed and fsynced before returning."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, records: Iterable[dict[str, Any]]) -> None:
        text = "".join(map(json_line, records))
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
    with atomic_write(path) as f:
        f.write("".join(json.dumps(new.get(key(r), r), ensure_ascii=False) + "\n" for r in records))
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Strict reading: every line must be valid JSON (errors name file and line)."""
    return [rec for _, rec in iter_jsonl(path)]
