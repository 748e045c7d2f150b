"""The Retriever protocol and corpus reading."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

from kair_runtime.errors import UserError
from kair_runtime.jsonl import BadLine, iter_jsonl
from kair_runtime.records import Passage, ScoredPassage


@runtime_checkable
class Retriever(Protocol):
    """search() takes a batch of queries and returns, per query, up to k passages best first."""

    name: str

    def search(self, queries: list[str], k: int) -> list[list[ScoredPassage]]: ...


class CorpusError(UserError, ValueError):
    pass


def passage_from_record(rec: dict, where: str) -> Passage:
    """Accept `{id, title, text}` and FlashRAG's `{id, contents}` where contents is "title\\ntext"."""
    if not isinstance(rec, dict) or "id" not in rec:
        raise CorpusError(f"{where}: a passage needs an 'id' and either 'title'/'text' or 'contents'")
    if "text" in rec:
        return Passage(id=str(rec["id"]), title=str(rec.get("title", "")), text=str(rec["text"]))
    if "contents" in rec:
        title, _, text = str(rec["contents"]).partition("\n")
        if not text:  # a contents field with no title line is all text
            title, text = "", title
        return Passage(id=str(rec["id"]), title=title.strip('"'), text=text)
    raise CorpusError(f"{where}: passage {rec.get('id')!r} has neither 'text' nor 'contents'")


def iter_corpus(path: str | Path) -> Iterator[Passage]:
    """Stream passages from a jsonl corpus, naming the file and line of any bad record."""
    for lineno, rec in iter_jsonl(path, keep_bad=True):
        if isinstance(rec, BadLine):
            raise CorpusError(f"{path}:{lineno}: {rec.reason}")
        yield passage_from_record(rec, f"{path}:{lineno}")


def load_corpus(path: str | Path) -> list[Passage]:
    passages = list(iter_corpus(path))
    ids = set()
    for p in passages:
        if p.id in ids:
            raise CorpusError(f"{path}: duplicate passage id {p.id!r}")
        ids.add(p.id)
    return passages
