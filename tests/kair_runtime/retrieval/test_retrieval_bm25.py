"""BM25 retrieval with bm25s on the 20-passage corpus."""

from __future__ import annotations

import json

import pytest

from kair_runtime.config import RetrieverConfig
from kair_runtime.retrieval import build_retriever
from kair_runtime.retrieval.base import CorpusError, load_corpus
from kair_runtime.retrieval.bm25 import BM25Retriever, build_bm25_index, make_stemmer
from kair_runtime.retrieval.dense import DenseRetriever
from kair_runtime.retrieval.store import IndexDirError


@pytest.fixture(scope="module")
def bm25_dir(tmp_path_factory, corpus_file):
    return build_bm25_index(corpus_file, tmp_path_factory.mktemp("bm25") / "index")


@pytest.fixture(scope="module")
def bm25(bm25_dir) -> BM25Retriever:
    return BM25Retriever.load(bm25_dir)


def test_obvious_query_ranks_its_passage_first_with_sorted_scores(bm25, obvious):
    results = bm25.search([q for q, _ in obvious], k=5)
    assert [r[0].id for r in results] == [pid for _, pid in obvious]
    for r in results:
        scores = [p.score for p in r]
        assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)


def test_batched_search_equals_one_at_a_time(bm25, obvious):
    queries = [q for q, _ in obvious] + ["", "lake"]
    batched = bm25.search(queries, k=3)
    single = [bm25.search([q], k=3)[0] for q in queries]
    assert [[(p.id, round(p.score, 6)) for p in r] for r in batched] == \
           [[(p.id, round(p.score, 6)) for p in r] for r in single]


def test_queries_without_indexed_terms_return_nothing(bm25):
    # blank, stopwords only, words no passage has
    assert bm25.search(["", "  ", "the of and is", "zyzzyva quux"], k=5) == [[], [], [], []]


def test_k_beyond_corpus_returns_every_matching_passage_once(bm25):
    (hits,) = bm25.search(["the river bridge and the lake"], k=100)
    assert {p.id for p in hits} == {"p01", "p02"} and len(hits) == 2  # only passages sharing a term


def test_index_dir_roundtrip_and_manifest(bm25_dir, bm25, corpus_file, obvious):
    manifest = json.loads((bm25_dir / "manifest.json").read_text())
    assert manifest["kind"] == "bm25" and manifest["count"] == 20 and manifest["corpus"] == str(corpus_file.resolve())
    assert manifest["stemmer"] == ("english" if make_stemmer() is not None else None)
    queries = [q for q, _ in obvious]
    in_memory = BM25Retriever.from_passages(load_corpus(corpus_file))
    assert [[(p.id, round(p.score, 5)) for p in r] for r in bm25.search(queries, 5)] == \
           [[(p.id, round(p.score, 5)) for p in r] for r in in_memory.search(queries, 5)]
    # through the registry, from an index dir and from a corpus
    for cfg in (RetrieverConfig(kind="bm25", index_dir=str(bm25_dir)), RetrieverConfig(kind="bm25", corpus=str(corpus_file))):
        r = build_retriever(cfg)
        assert r.name == "bm25" and r.search(queries[:1], 1)[0][0].id == obvious[0][1]


def test_wrong_kind_is_a_clear_error(bm25_dir):
    with pytest.raises(IndexDirError, match="holds a 'bm25' index, not 'dense'; set retriever.kind: bm25"):
        DenseRetriever.load(bm25_dir)


def test_flashrag_contents_corpus(flashrag_corpus, tmp_path, obvious):
    retriever = BM25Retriever.load(build_bm25_index(flashrag_corpus, tmp_path / "index"))
    top = retriever.search([q for q, _ in obvious], 1)
    assert [r[0].id for r in top] == [pid for _, pid in obvious]
    assert top[0][0].title == "Mount Keralt"


def test_empty_or_missing_corpus_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(CorpusError, match="empty.jsonl: the corpus has no passages"):
        build_bm25_index(empty, tmp_path / "index")
    with pytest.raises(CorpusError, match="corpus not found"):
        build_bm25_index(tmp_path / "nope.jsonl", tmp_path / "index")
    with pytest.raises(CorpusError, match="no passages"):
        BM25Retriever.from_passages([])
