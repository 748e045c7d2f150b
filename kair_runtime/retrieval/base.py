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
    """Accept `{id, title, text}` and FlashRAG's `{id, contents}` where contents is "title\\ntext".
    The id is a string or an integer, the other fields strings, and the text not blank: str() of
    a list or a number would be indexed as if it were the passage."""
    if not isinstance(rec, dict) or "id" not in rec:
        raise CorpusError(f"{where}: a passage needs an 'id' and either 'title'/'text' or 'contents'")
    if isinstance(rec["id"], bool) or not isinstance(rec["id"], (str, int)):
        raise CorpusError(f"{where}: 'id' should be a string or an integer, got {_kind(rec['id'])}")
    for key in ("title", "text", "contents"):
        if key in rec and not isinstance(rec[key], str):
            raise CorpusError(f"{where}: passage {rec['id']!r}: {key!r} should be a string, got {_kind(rec[key])}")
    body = "text" if "text" in rec else "contents"
    if body in rec and not rec[body].strip():
        raise CorpusError(f"{where}: passage {rec['id']!r}: {body!r} is blank")
    if "text" in rec:
        return Passage(id=str(rec["id"]), title=rec.get("title", ""), text=rec["text"])
    if "contents" in rec:
        title, _, text = rec["contents"].partition("\n")
        if not text:  # a contents field with no title line is all text
            title, text = "", title
        return Passage(id=str(rec["id"]), title=title.strip('"'), text=text)
    raise CorpusError(f"{where}: passage {rec.get('id')!r} has neither 'text' nor 'contents'")


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


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
