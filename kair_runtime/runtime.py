"""Assemble a KAIR loop from a RuntimeConfig: the one place config names become objects."""

from __future__ import annotations

from kair_runtime.config import RuntimeConfig
from kair_runtime.llm import build_llm
from kair_runtime.loop import KairLoop
from kair_runtime.retrieval import build_retriever


def build_loop(cfg: RuntimeConfig) -> KairLoop:
    return KairLoop(build_llm(cfg.llm), build_retriever(cfg.retriever), cfg.loop)
