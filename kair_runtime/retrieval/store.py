"""The on-disk index dir shared by every retriever: passages, manifest, atomic writes.

An index dir holds the retriever's own files (index.faiss, or bm25/), the passages and
`manifest.json`. The manifest is written last, so a dir without one is an unfinished build.
Passages are a jsonl file plus an int64 array of line offsets; `PassageStore` memory-maps both
and decodes a passage only when search returns it, so 21M passages cost no RAM up front.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
from array import array
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from kair_runtime.errors import UserError
from kair_runtime.jsonl import atomic_write, atomic_write_text
from kair_runtime.records import Passage
from kair_runtime.retrieval.base import CorpusError

MANIFEST = "manifest.json"
SHARD_DIR = "shards"  # a dense index's resumable embeddings
PASSAGES = "passages.jsonl"
OFFSETS = "passages.offsets.npy"
MANIFEST_VERSION = 1


class IndexDirError(UserError, ValueError):
    pass


def passage_text(p: Passage) -> str:
    """What an encoder or tokenizer sees: the title line, then the text (FlashRAG's `contents`)."""
    return f"{p.title}\n{p.text}" if p.title else p.text


def tmp_path(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def atomic_save_npy(path: Path, arr: np.ndarray) -> None:
    """np.save that never leaves a half-written file under the final name (crash safety)."""
    with atomic_write(path, "wb") as f:
        np.save(f, arr, allow_pickle=False)


# ---------------------------------------------------------------- manifest

@dataclass
class Manifest:
    kind: str  # dense | bm25
    count: int
    corpus: str | None  # where the passages came from; None when built from a list in memory
    created: str  # ISO 8601, UTC
    encoder: str | None = None  # dense only
    dim: int | None = None
    normalized: bool | None = None  # embeddings L2-normalized, so inner product is cosine
    metric: str | None = None  # "inner_product"
    index_factory: str | None = None
    query_instruction: str | None = None
    passage_instruction: str | None = None
    stemmer: str | None = None  # bm25 only: the PyStemmer language, None when not stemmed
    version: int = MANIFEST_VERSION

    def write(self, index_dir: Path) -> None:
        atomic_write_text(Path(index_dir) / MANIFEST, json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, index_dir: str | Path) -> "Manifest":
        path = Path(index_dir) / MANIFEST
        if not path.exists():
            hint = ("an unfinished build (rerun `kair index build`)" if Path(index_dir).is_dir()
                    else "no such directory")
            raise IndexDirError(f"{index_dir}: not an index dir, {path.name} is missing ({hint})")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise IndexDirError(f"{path}: not valid JSON ({e.msg})") from None
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown or "kind" not in data or "count" not in data:
            raise IndexDirError(f"{path}: unknown key(s) {unknown} or missing kind/count; "
                                f"valid keys: {', '.join(sorted(names))}")
        return cls(**data)

    def expect_kind(self, kind: str, index_dir: str | Path) -> None:
        if self.kind != kind:
            raise IndexDirError(f"{index_dir} holds a {self.kind!r} index, not {kind!r}; "
                                f"set retriever.kind: {self.kind}")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------- passages

def unique_passages(passages: Iterable[Passage], where: str) -> Iterator[Passage]:
    """Pass passages through, failing on the first duplicate id (ids must name one passage)."""
    seen: set[str] = set()
    for p in passages:
        if p.id in seen:
            raise CorpusError(f"{where}: duplicate passage id {p.id!r}")
        seen.add(p.id)
        yield p


def write_passages(passages: Iterable[Passage], index_dir: str | Path) -> int:
    """Stream passages to the index dir (jsonl + line offsets); returns how many were written."""
    index_dir = Path(index_dir)
    offsets = array("q", [0])
    tmp = tmp_path(index_dir / PASSAGES)
    with tmp.open("wb") as f:
        for p in passages:
            line = json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False)
            f.write(line.encode("utf-8") + b"\n")
            offsets.append(f.tell())
    atomic_save_npy(index_dir / OFFSETS, np.frombuffer(offsets, dtype=np.int64))
    os.replace(tmp, index_dir / PASSAGES)
    return len(offsets) - 1


class PassageStore:
    """Read-only, memory-mapped passages of an index dir; a Sequence[Passage]."""

    def __init__(self, index_dir: str | Path):
        index_dir = Path(index_dir)
        path = index_dir / PASSAGES
        if not path.exists() or not (index_dir / OFFSETS).exists():
            raise IndexDirError(f"{index_dir}: {PASSAGES} or {OFFSETS} is missing")
        self.offsets = np.load(index_dir / OFFSETS, mmap_mode="r")
        size = path.stat().st_size
        self._data: Any = b""  # mmap refuses an empty file
        if size:
            with path.open("rb") as f:  # the mmap keeps its own handle on the file
                self._data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if int(self.offsets[-1]) != size:
            raise IndexDirError(f"{path}: {size} bytes but the offsets end at {int(self.offsets[-1])}; "
                                f"the index dir is corrupt, rebuild it")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Passage:
        if not 0 <= i < len(self):
            raise IndexError(f"passage {i} out of range (0..{len(self) - 1})")
        return Passage.from_dict(json.loads(self.raw(i, i + 1)))

    def __iter__(self) -> Iterator[Passage]:
        return (self[i] for i in range(len(self)))

    def raw(self, start: int, stop: int) -> bytes:
        """The jsonl bytes of passages [start, stop): a cheap fingerprint source for shards."""
        return bytes(self._data[int(self.offsets[start]):int(self.offsets[stop])])


def describe(manifest: Manifest) -> dict[str, Any]:
    """The manifest's set fields, for printing."""
    return {k: v for k, v in dataclasses.asdict(manifest).items() if v is not None}
