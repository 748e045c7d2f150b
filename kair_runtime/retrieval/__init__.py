"""Retrievers, registered by name, behind one protocol: `search(queries, k)`."""

from __future__ import annotations


from kair_runtime.config import RetrieverConfig
from kair_runtime.retrieval.base import CorpusError, Retriever, iter_corpus, load_corpus
from kair_runtime.registry import resolve

# name -> "module:factory"; each factory takes a RetrieverConfig and returns a Retriever.
RETRIEVERS: dict[str, str] = {
    "dense": "kair_runtime.retrieval.dense:DenseRetriever.from_config",
    "bm25": "kair_runtime.retrieval.bm25:BM25Retriever.from_config",
    "remote": "kair_runtime.retrieval.remote:RemoteRetriever.from_config",
}


def build_retriever(cfg: RetrieverConfig, encoder=None) -> Retriever:
    """`encoder`: a loaded dense encoder to use instead of loading cfg.encoder (dense only), so
    several dense retrievers hold one model."""
    make = resolve(RETRIEVERS, cfg.kind, "retriever")
    return make(cfg) if encoder is None else make(cfg, encoder=encoder)


__all__ = ["RETRIEVERS", "CorpusError", "Retriever", "build_retriever", "iter_corpus", "load_corpus"]
