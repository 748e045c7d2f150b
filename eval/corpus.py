"""Closed retrieval corpora: the union of the benchmarks' own paragraphs, with stable ids.

The KAIR paper does not say what corpus it retrieved from (section 4 names the retriever,
bge-large-en-v1.5, and top-5 only). Closed corpora are our choice, for machines without a
Wikipedia index: the union of a benchmark's own paragraphs; `build_corpus` makes it from the
loaders in eval.datasets, plus any extra paragraph files (e.g. 2Wiki's corpus_6119.json, or a
jsonl corpus). A prebuilt index (a Wikipedia dump) is the closer setting where one exists.

Paragraphs are deduplicated by (title, text) after whitespace normalization, and a
paragraph's id is a hash of that normalized pair, so the same paragraph gets the same id in
every build and every corpus it lands in, and gold paragraphs can be mapped to corpus ids
without keeping a table (`gold_paragraphs`, for recall@k). The id is the first 16 hex digits
of sha1: at 64 bits a 5M-passage Wikipedia corpus has a ~1e-6 chance of any collision
(12 digits would give ~4%), and a collision is detected and reported, never merged.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from eval.datasets import (SPLIT_ALIASES, LoadResult, MalformedRecord, get_spec, split_files, dataset_records,
                           load_dataset)
from eval.specs import DatasetSpec
from kair_runtime.jsonl import atomic_write, atomic_write_text, read_text
from kair_runtime.records import Question
from kair_runtime.retrieval.base import CorpusError, iter_corpus, passage_from_record

ID_HEX_DIGITS = 16


def normalize_ws(s: str) -> str:
    return " ".join(s.split())


def paragraph_id(title: str, text: str) -> str:
    # Title and text are whitespace-normalized, so neither holds "\n": the separator is unambiguous.
    key = normalize_ws(title) + "\n" + normalize_ws(text)
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:ID_HEX_DIGITS]


# ---------------------------------------------------------------- paragraph sources


def iter_paragraph_file(path: str | Path) -> Iterator[tuple[str, str]]:
    """(title, text) from a JSON array or jsonl of `{title, text}` or FlashRAG `{id, contents}`;
    an id in the file is ignored (ours is the content hash)."""
    for where, rec in dataset_records(path):
        if isinstance(rec, MalformedRecord):
            raise CorpusError(f"{where}: {rec}")
        if not isinstance(rec, dict):
            raise CorpusError(f"{where}: a paragraph should be a JSON object with 'text' or 'contents'")
        p = passage_from_record({"id": "", **rec}, where)
        yield p.title, p.text


def source_files(name: str, split_or_path: str) -> list[Path]:
    """The files behind a benchmark split we know (dev, train, ...) or a path given as is."""
    spec = get_spec(name)
    split = SPLIT_ALIASES.get(split_or_path, split_or_path)
    if split in spec.files:
        return split_files(spec.name, split)
    if Path(split_or_path).is_file():
        return [Path(split_or_path)]
    raise CorpusError(f"{split_or_path!r} is neither a {spec.name} split ({', '.join(sorted(spec.files)) or 'none'}) "
                      f"nor an existing file")


def load_source(name: str, split_or_path: str) -> LoadResult:
    """A benchmark split we know (all its files) or a file in that benchmark's schema."""
    if SPLIT_ALIASES.get(split_or_path, split_or_path) in get_spec(name).files:
        return load_dataset(name, split=split_or_path)
    return load_dataset(name, path=source_files(name, split_or_path)[0])


# ---------------------------------------------------------------- building


@dataclass
class CorpusStats:
    read: int = 0  # paragraphs read, duplicates included
    unique: int = 0
    written: int = 0
    sources: dict[str, int] = field(default_factory=dict)  # source label -> paragraphs read
    notes: list[str] = field(default_factory=list)
    out: str = ""


class Corpus:
    """Deduplicating accumulator: id -> (title, text), in first-seen order."""

    def __init__(self) -> None:
        self.paragraphs: dict[str, tuple[str, str]] = {}
        self.read = 0

    def add(self, title: str, text: str, where: str) -> str:
        title, text = normalize_ws(title), normalize_ws(text)
        pid = paragraph_id(title, text)
        self.read += 1
        seen = self.paragraphs.setdefault(pid, (title, text))
        if seen != (title, text):
            raise CorpusError(f"{where}: id {pid} collides: {seen[0]!r} and {title!r} hash alike; "
                              f"raise ID_HEX_DIGITS in eval/corpus.py")
        return pid

    def write(self, out: str | Path) -> int:
        with atomic_write(out) as f:
            for pid, (title, text) in self.paragraphs.items():
                f.write(json.dumps({"id": pid, "title": title, "text": text}, ensure_ascii=False) + "\n")
        return len(self.paragraphs)


def build_corpus(datasets: list[tuple[str, str]], extra_files: Iterable[str | Path] = (),
                 out: str | Path = "corpus.jsonl") -> CorpusStats:
    """Write the deduplicated union of the datasets' paragraphs and the extra files to `out`.

    datasets: (name, split or path) pairs, e.g. [("musique", "dev"), ("2wiki", "data/dev.json")].
    """
    extra_files = list(extra_files)
    corpus, stats = Corpus(), CorpusStats(out=str(out))
    no_paragraphs = [name for name, _ in datasets if not get_spec(name).has_paragraphs]
    if no_paragraphs and len(no_paragraphs) == len(datasets) and not extra_files:
        raise CorpusError(f"{', '.join(no_paragraphs)} has no paragraphs (open retrieval), so it cannot make a "
                          f"corpus on its own (our configs retrieve Bamboogle from the HotpotQA corpus): "
                          f"add --dataset hotpotqa and/or --extra FILE")
    for name, where in datasets:
        label = f"{get_spec(name).name}:{where}"
        if not get_spec(name).has_paragraphs:
            stats.notes.append(f"{label}: no paragraphs (open retrieval), contributes nothing")
            stats.sources[label] = 0
            continue
        before = corpus.read
        loaded = load_source(name, where)
        for q in loaded:
            for p in q.metadata.get("context", []):
                corpus.add(p["title"], p["text"], f"{loaded.source}: question {q.id}")
        stats.sources[label] = corpus.read - before
    for path in extra_files:
        before = corpus.read
        for i, (title, text) in enumerate(iter_paragraph_file(path)):
            corpus.add(title, text, f"{path}[paragraph {i}]")
        stats.sources[str(path)] = corpus.read - before
    if not corpus.paragraphs:
        raise CorpusError(f"no paragraphs found in {list(stats.sources)}; nothing to write")
    stats.read, stats.unique = corpus.read, len(corpus.paragraphs)
    stats.written = corpus.write(out)
    return stats


# ---------------------------------------------------------------- a corpus built once, for its sources

SOURCES_SUFFIX = ".sources.json"


def sources_fingerprint(datasets: list[tuple[str, str]], extra_files: Iterable[str | Path] = ()) -> dict:
    """What a corpus is built from: the sources as named, and each file's path, size and content
    hash (a hash, not a time: a copied or touched file with the same bytes is the same source)."""
    files = [f for name, where in datasets for f in source_files(name, where)] + [Path(p) for p in extra_files]
    return {"sources": [f"{get_spec(n).name}:{w}" for n, w in datasets] + [str(p) for p in extra_files],
            "files": [{"path": str(f.resolve()), "size": f.stat().st_size, "sha256": _sha256(f)} for f in files]}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cached_corpus(datasets: list[tuple[str, str]], extra_files: Iterable[str | Path], out: str | Path) -> Path:
    """`build_corpus` once into `out`, reused by every later run over the same sources.

    The sources' fingerprint is kept beside the corpus (`OUT.sources.json`). A corpus whose
    sources changed, or one with no fingerprint (an older build), is refused rather than reused
    or rebuilt: traces already made over it would be mixed with traces over another corpus."""
    out, extra_files = Path(out), list(extra_files)
    meta = out.with_name(out.name + SOURCES_SUFFIX)
    fingerprint = sources_fingerprint(datasets, extra_files)
    if out.exists():
        old = json.loads(read_text(meta)) if meta.exists() else None
        if old is None or _content(old) != _content(fingerprint):
            why = "has no record of its sources" if old is None else f"was built from other sources ({_changes(old, fingerprint)})"
            raise CorpusError(f"{out} {why}; delete it, and the runs made over it, to rebuild it")
        return out
    # The fingerprint first: a kill between the two leaves no corpus, so the next run builds it.
    atomic_write_text(meta, json.dumps(fingerprint, indent=2) + "\n")
    build_corpus(datasets, extra_files=extra_files, out=out)
    return out


def corpus_for(specs: list[DatasetSpec], out: Path | Callable[[list[tuple[str, str]]], Path],
               extra_files: Iterable[str | Path] = ()) -> Path:
    """The retrieval corpus of datasets, as every command gets it (eval per dataset, datagen for
    its training sets, the demo per set): the `corpus` file a spec names, else the closed corpus
    of the specs' sources (each one's `corpus_from`, else the file it reads) plus their
    `extra_corpus` files and `extra_files`, built into `out` once and reused while its sources are
    unchanged (`cached_corpus`). `out` is the corpus file, or names it from the sources.

    A source is fingerprinted by the string it is named by ("name:split", or "name:FILE" for a
    spec that reads a file), so a caller keeps naming its sources the same way or its cached
    corpora are refused."""
    given = [s for s in specs if s.corpus]
    if given:
        if len(specs) > 1:
            raise CorpusError(f"{given[0].name} names a corpus file ({given[0].corpus}), which cannot join the "
                              f"closed corpus of {', '.join(s.name for s in specs)}")
        return Path(given[0].corpus)
    pairs = [pair for s in specs for pair in s.corpus_sources()]
    extra_files = [e for s in specs for e in s.extra_corpus] + list(extra_files)
    return cached_corpus(pairs, extra_files, out(pairs) if callable(out) else out)


def _content(fingerprint: dict) -> tuple:
    """What must match for reuse: not the absolute paths, so machines that mount a shared
    output folder and the data at different places still share one corpus."""
    return fingerprint.get("sources"), [(f["size"], f["sha256"]) for f in fingerprint.get("files", [])]


def _changes(old: dict, new: dict) -> str:
    if old.get("sources") != new["sources"]:
        return f"{old.get('sources')} then, {new['sources']} now"
    changed = [f["path"] for f, g in zip(new["files"], old.get("files", []))
               if (f["size"], f["sha256"]) != (g["size"], g["sha256"])]
    return "changed since: " + ", ".join(changed)


# ---------------------------------------------------------------- gold paragraphs -> corpus ids


@dataclass
class CorpusLookup:
    """What gold mapping needs from a corpus: its ids, and its ids by title."""

    ids: set[str]
    by_title: dict[str, list[str]]

    @classmethod
    def from_file(cls, path: str | Path) -> "CorpusLookup":
        ids: set[str] = set()
        by_title: dict[str, list[str]] = {}
        for p in iter_corpus(path):
            ids.add(p.id)
            by_title.setdefault(normalize_ws(p.title), []).append(p.id)
        return cls(ids, by_title)

    def unique_title(self, title: str) -> str | None:
        found = self.by_title.get(normalize_ws(title), [])
        return found[0] if len(found) == 1 else None


@dataclass
class GoldParagraphs:
    ids: list[str]  # corpus ids of the gold paragraphs, in annotation order
    missing: list[str]  # titles of gold paragraphs that could not be mapped


def gold_paragraphs(question: Question, corpus: CorpusLookup | None = None) -> GoldParagraphs:
    """Map a question's gold paragraphs to corpus ids.

    Without a corpus, the ids are the content hashes (what build_corpus assigns). With one, a
    hash not in it falls back to the title when exactly one corpus paragraph has that title
    (e.g. a one-abstract-per-title Wikipedia dump with slightly different text). A gold title
    whose text the record lacks (some HotpotQA dev questions) is mapped by title or reported
    missing."""
    ids: list[str] = []
    missing: list[str] = []
    covered: set[str] = set()
    for p in question.metadata.get("supporting_paragraphs", []):
        covered.add(p["title"])
        pid: str | None = paragraph_id(p["title"], p["text"])
        if corpus is not None and pid not in corpus.ids:
            pid = corpus.unique_title(p["title"])
        if pid:
            ids.append(pid)
        else:
            missing.append(p["title"])
    for title in question.metadata.get("supporting_titles", []):
        if title in covered:
            continue
        pid = corpus.unique_title(title) if corpus is not None else None
        if pid:
            ids.append(pid)
        else:
            missing.append(title)
    return GoldParagraphs(list(dict.fromkeys(ids)), missing)


def gold_paragraph_ids(questions: Iterable[Question], corpus_path: str | Path | None = None) -> dict[str, GoldParagraphs]:
    """question id -> its gold paragraphs' corpus ids (and any it could not map)."""
    corpus = CorpusLookup.from_file(corpus_path) if corpus_path is not None else None
    return {q.id: gold_paragraphs(q, corpus) for q in questions}


MISSING_PREFIX = "missing:"


def gold_passage_ids(questions: Iterable[Question], corpus_path: str | Path) -> dict[str, set[str]]:
    """question id -> set of gold corpus ids, for set-based recall@k.

    A gold paragraph the corpus lacks stays in the set as `missing:<title>`, an id no corpus
    passage has: it keeps recall's denominator honest (it can never be retrieved) instead of
    making the question look easier by dropping it."""
    return {qid: set(g.ids) | {MISSING_PREFIX + t for t in g.missing}
            for qid, g in gold_paragraph_ids(questions, corpus_path).items()}
