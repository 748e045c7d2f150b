"""Sparse retrieval: BM25 with bm25s, English stopwords, Snowball stemming when PyStemmer is there.

The index dir holds bm25s's own files under bm25/ (memory-mapped on load), the passages and the
manifest. The manifest records whether the index was stemmed, because queries must be tokenized
the way the passages were. Passages sharing no term with a query score 0 and are not returned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from kair_runtime.config import RetrieverConfig
from kair_runtime.records import Passage, ScoredPassage
from kair_runtime.retrieval.base import CorpusError, iter_corpus, load_corpus
from kair_runtime.retrieval.store import (MANIFEST, PASSAGES, IndexDirError, Manifest, PassageStore, now_iso, passage_text,
                                          unique_passages, write_passages)

BM25_DIR = "bm25"
STEMMER_LANGUAGE = "english"


def make_stemmer(language: str | None = STEMMER_LANGUAGE) -> Any:
    """A PyStemmer stemmer, or None when PyStemmer is not installed (it is optional)."""
    if language is None:
        return None
    try:
        import Stemmer  # PyStemmer
    except ImportError:
        return None
    return Stemmer.Stemmer(language)


def tokenize(texts: list[str], stemmer: Any) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)


def build_bm25_index(corpus: str | Path, out_dir: str | Path) -> Path:
    """Index a jsonl corpus into an index dir (what `kair index build --retriever bm25` runs)."""
    corpus, out = Path(corpus), Path(out_dir)
    if not corpus.is_file():
        raise CorpusError(f"corpus not found: {corpus}")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # unfinished until the new manifest is written
    if write_passages(unique_passages(iter_corpus(corpus), str(corpus)), out) == 0:
        raise CorpusError(f"{corpus}: the corpus has no passages")
    BM25Retriever.from_passages(PassageStore(out), where=str(corpus)).save(out, corpus=str(corpus.resolve()))
    return out


class BM25Retriever:
    name = "bm25"

    def __init__(self, bm25: Any, passages: Sequence[Passage], stemmer_language: str | None):
        self.bm25 = bm25
        self.passages = passages
        self.stemmer_language = stemmer_language
        self.stemmer = make_stemmer(stemmer_language)
        if stemmer_language is not None and self.stemmer is None:
            raise IndexDirError(f"this BM25 index was stemmed ({stemmer_language}); install PyStemmer "
                                f"to query it, or rebuild it without PyStemmer installed")

    @classmethod
    def from_passages(cls, passages: Sequence[Passage], where: str = "corpus") -> "BM25Retriever":
        import bm25s

        if len(passages) == 0:
            raise CorpusError(f"{where}: the corpus has no passages")
        stemmer = make_stemmer()
        texts = [passage_text(p) for p in passages]
        tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)
        if not tokens.vocab:  # bm25s would fail on it with "max() arg is an empty sequence"
            raise CorpusError(f"{where}: no passage has a word BM25 can index (words of two or more letters or "
                              "digits that are not stopwords)")
        bm25 = bm25s.BM25()
        bm25.index(tokens, show_progress=False)
        return cls(bm25, passages, STEMMER_LANGUAGE if stemmer is not None else None)

    def save(self, index_dir: str | Path, corpus: str | None = None) -> None:
        """Write bm25s's files and the manifest; the passages must already be in index_dir
        (write_passages) unless they were loaded from it."""
        index_dir = Path(index_dir)
        if not (index_dir / PASSAGES).exists():
            write_passages(self.passages, index_dir)
        self.bm25.save(str(index_dir / BM25_DIR), show_progress=False)
        Manifest(kind="bm25", count=len(self.passages), corpus=corpus, created=now_iso(),
                 stemmer=self.stemmer_language).write(index_dir)

    @classmethod
    def load(cls, index_dir: str | Path) -> "BM25Retriever":
        import bm25s

        index_dir = Path(index_dir)
        manifest = Manifest.read(index_dir)
        manifest.expect_kind("bm25", index_dir)
        if not (index_dir / BM25_DIR).is_dir():
            raise IndexDirError(f"{index_dir / BM25_DIR} is missing; rebuild the index dir")
        bm25 = bm25s.BM25.load(str(index_dir / BM25_DIR), mmap=True, show_progress=False)
        return cls(bm25, PassageStore(index_dir), manifest.stemmer)

    @classmethod
    def from_config(cls, cfg: RetrieverConfig) -> "BM25Retriever":
        if cfg.index_dir:
            return cls.load(cfg.index_dir)
        if cfg.corpus is None:
            from kair_runtime.demo_data import demo_corpus_path

            corpus: str | Path = demo_corpus_path()
        else:
            corpus = cfg.corpus
        return cls.from_passages(load_corpus(corpus), where=str(corpus))

    def search(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        """One bm25s call for the batch; a query with no indexed term (blank, stopwords only,
        unseen words) gets []."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        results: list[list[ScoredPassage]] = [[] for _ in queries]
        vocab = self.bm25.vocab_dict
        tokens = tokenize([q if q.strip() else "" for q in queries], self.stemmer)
        live = [i for i, toks in enumerate(tokens) if any(t in vocab and t != "" for t in toks)]
        if not live:
            return results
        known = [[t for t in tokens[i] if t in vocab and t != ""] for i in live]
        docs, scores = self.bm25.retrieve(known, k=min(k, len(self.passages)), show_progress=False)
        for row, i in enumerate(live):
            results[i] = [_scored(self.passages[int(d)], float(s))
                          for d, s in zip(docs[row], scores[row]) if s > 0]
        return results


def _scored(p: Passage, score: float) -> ScoredPassage:
    return ScoredPassage(id=p.id, title=p.title, text=p.text, score=score)
