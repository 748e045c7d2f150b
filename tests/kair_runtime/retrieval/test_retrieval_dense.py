"""Dense retrieval with the real MiniLM encoder and faiss, on a 20-passage corpus."""

from __future__ import annotations

import json
import shutil
from datetime import datetime

import faiss
import numpy as np
import pytest

from kair_runtime.config import RetrieverConfig
from kair_runtime.retrieval import build_retriever
from kair_runtime.retrieval.base import CorpusError, load_corpus
from kair_runtime.retrieval.bm25 import BM25Retriever
from kair_runtime.retrieval.dense import DenseRetriever, build_dense_index, make_faiss_index
from kair_runtime.retrieval.encoders import EncoderError
from kair_runtime.retrieval.store import IndexDirError, PassageStore

pytestmark = pytest.mark.slow  # loads MiniLM


@pytest.fixture(scope="module")
def dense(dense_dir, encoder) -> DenseRetriever:
    return DenseRetriever.load(dense_dir, encoder=encoder)


def test_obvious_query_ranks_its_passage_first_with_sorted_scores(dense, obvious):
    results = dense.search([q for q, _ in obvious], k=5)
    assert [r[0].id for r in results] == [pid for _, pid in obvious]
    for r in results:
        scores = [p.score for p in r]
        assert len(r) == 5 and scores == sorted(scores, reverse=True)
        assert -1.0 <= scores[-1] <= scores[0] <= 1.0 + 1e-5  # cosine: embeddings are normalized


def test_batched_search_equals_one_at_a_time(dense, obvious):
    queries = [q for q, _ in obvious]
    batched = dense.search(queries, k=4)
    single = [dense.search([q], k=4)[0] for q in queries]
    assert [[p.id for p in r] for r in batched] == [[p.id for p in r] for r in single]
    np.testing.assert_allclose([[p.score for p in r] for r in batched],
                               [[p.score for p in r] for r in single], atol=1e-5)


def test_k_beyond_corpus_and_blank_queries(dense, passage_ids):
    big, blank, spaces = dense.search(["a lake with glowing algae", "", "   "], k=100)
    assert sorted(p.id for p in big) == sorted(passage_ids)  # all 20, each once
    assert big[0].id == "p01" and big[0].title == "Lake Ombrin" and "glowing" in big[0].text
    assert blank == [] and spaces == []
    with pytest.raises(ValueError, match="k must be >= 1"):
        dense.search(["x"], k=0)


def test_index_dir_has_manifest_and_loads_through_the_registry(dense_dir, corpus_file, obvious):
    manifest = json.loads((dense_dir / "manifest.json").read_text())
    assert manifest["kind"] == "dense" and manifest["encoder"] == "minilm" and manifest["dim"] == 384
    assert manifest["normalized"] is True and manifest["count"] == 20 and manifest["index_factory"] == "Flat"
    assert manifest["corpus"] == str(corpus_file.resolve())
    datetime.fromisoformat(manifest["created"])
    assert (dense_dir / "index.faiss").exists() and len(list((dense_dir / "shards").glob("*.npy"))) == 4
    # kind "dense" with an index_dir goes through DenseRetriever.from_config, loading its own encoder.
    via_config = build_retriever(RetrieverConfig(kind="dense", index_dir=str(dense_dir)))
    assert via_config.name == "dense" and via_config.index.ntotal == 20
    assert [r[0].id for r in via_config.search([q for q, _ in obvious], 1)] == [pid for _, pid in obvious]


def test_manifest_encoder_or_kind_mismatch_is_a_clear_error(dense_dir):
    with pytest.raises(EncoderError, match=r"built with encoder 'minilm' but .* 'BAAI/bge-small-en-v1.5'"):
        DenseRetriever.from_config(RetrieverConfig(index_dir=str(dense_dir), encoder="BAAI/bge-small-en-v1.5"))
    with pytest.raises(IndexDirError, match="holds a 'dense' index, not 'bm25'"):
        BM25Retriever.load(dense_dir)


def test_rebuild_after_a_crash_encodes_only_missing_or_stale_shards(dense_dir, dense, encoder, corpus_file, tmp_path, obvious):
    work = tmp_path / "index"
    shutil.copytree(dense_dir, work)
    shards = sorted((work / "shards").glob("*.npy"))
    reference = [np.load(p) for p in shards]
    # The crash: the last shard never got written and shard 1 was cut off mid-file.
    shards[3].unlink()
    shards[1].write_bytes(shards[1].read_bytes()[:100])
    untouched = {p.name: p.stat().st_mtime_ns for p in (shards[0], shards[2])}
    build_dense_index(corpus_file, work, encoder=encoder, shard_size=6)

    assert {p.name: p.stat().st_mtime_ns for p in (shards[0], shards[2])} == untouched
    for path, ref in zip(shards, reference):
        np.testing.assert_allclose(np.load(path), ref, atol=1e-5)
    resumed = DenseRetriever.load(work, encoder=encoder)
    queries = [q for q, _ in obvious]
    assert [[p.id for p in r] for r in resumed.search(queries, 5)] == [[p.id for p in r] for r in dense.search(queries, 5)]

    # Editing one passage re-encodes only the shard holding it (p13 is in shard 2).
    lines = corpus_file.read_text().splitlines()
    lines[13] = json.dumps({"id": "p13", "title": "Cobalt Academy", "text": "A school of glassblowing."})
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join(lines) + "\n")
    before = {p.name: p.stat().st_mtime_ns for p in shards}
    build_dense_index(edited, work, encoder=encoder, shard_size=6)
    changed = sorted(p.name for p in shards if p.stat().st_mtime_ns != before[p.name])
    assert changed == ["00002.npy"]
    assert DenseRetriever.load(work, encoder=encoder).search(["glassblowing school"], 1)[0][0].id == "p13"


def test_in_memory_build_from_a_flashrag_corpus_matches_the_loaded_index_dir(flashrag_corpus, encoder, dense, obvious):
    retriever = DenseRetriever.from_passages(load_corpus(flashrag_corpus), encoder)
    queries = [q for q, _ in obvious]
    top = retriever.search(queries, 5)
    assert top[0][0].title == "Mount Keralt" and top[0][0].text.startswith("Mount Keralt is a volcano")
    # same passages, so the same ranking as the index dir built from {id, title, text} and loaded back
    assert [[p.id for p in r] for r in top] == [[p.id for p in r] for r in dense.search(queries, 5)]


def test_index_factory_ivf_with_nprobe(dense_dir, dense, encoder, obvious):
    embeddings = [np.load(p) for p in sorted((dense_dir / "shards").glob("*.npy"))]
    ivf = DenseRetriever(make_faiss_index(embeddings, "IVF2,Flat"), PassageStore(dense_dir), encoder, nprobe=2)
    assert faiss.extract_index_ivf(ivf.index).nprobe == 2
    queries = [q for q, _ in obvious]
    # Probing every list makes IVF exact.
    assert [[p.id for p in r] for r in ivf.search(queries, 5)] == [[p.id for p in r] for r in dense.search(queries, 5)]
    with pytest.raises(ValueError, match="'Bogus9' is not a valid faiss index_factory"):
        make_faiss_index(embeddings, "Bogus9")
    with pytest.raises(ValueError, match="cannot train 'IVF64,Flat' on 20 vectors"):
        make_faiss_index(embeddings, "IVF64,Flat")


def test_empty_corpus_is_an_error_at_build_time(tmp_path, encoder):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(CorpusError, match="empty.jsonl: the corpus has no passages"):
        build_dense_index(empty, tmp_path / "index", encoder=encoder)
    with pytest.raises(CorpusError, match="no passages"):
        DenseRetriever.from_passages([], encoder)
