"""The one place config names become objects: the LLM, the retriever (and the passages file its
ids come from) and the loop. `kair ask`, eval, data_gen (teacher, silver), the demo and serve all
build through here.

    loop = loop_from_config(load_config(RuntimeConfig, "configs/runtime/default.yaml"))
    retriever, passages = retriever_over(cfg.runtime.retriever, lambda: corpus_for(spec, run_dir / "corpora"))

Which corpus a retriever searches, one rule for every command:
    1. `retriever.index_dir` set: the prebuilt index; gold ids map into its passages.jsonl.
    2. else `retriever.corpus` set: built in memory over that file.
    3. else the caller's own corpus (a dataset's closed corpus), built only when reached.
    4. else the embedded demo corpus (`kair ask`, serve with no corpus set).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Union

from kair_runtime.config import LoopConfig, RetrieverConfig, RuntimeConfig
from kair_runtime.llm import LLM, build_llm
from kair_runtime.loop import KairLoop
from kair_runtime.retrieval import Retriever, build_retriever

# The caller's corpus: a path, a function that builds it (called only when rule 3 is reached), or None.
CorpusSource = Union[str, Path, Callable[[], Union[str, Path]], None]


def retriever_config_over(rc: RetrieverConfig, corpus: CorpusSource = None) -> tuple[RetrieverConfig, Path]:
    """The retriever config the rule above picks, and the passages file its ids come from;
    nothing is built (callers that share one retriever per passages file key on the path)."""
    from kair_runtime.retrieval.store import PASSAGES

    if rc.index_dir:
        return rc, Path(rc.index_dir) / PASSAGES
    chosen = rc.corpus or (corpus() if callable(corpus) else corpus)
    if chosen is None:  # the retrievers' own default (rc stays as given)
        from kair_runtime.demo_data import demo_corpus_path

        return rc, demo_corpus_path()
    return dataclasses.replace(rc, corpus=str(chosen)), Path(chosen)


def retriever_over(rc: RetrieverConfig, corpus: CorpusSource = None) -> tuple[Retriever, Path]:
    """The retriever the rule above picks, built, and the passages file its ids come from."""
    cfg, passages = retriever_config_over(rc, corpus)
    return build_retriever(cfg), passages


def build_loop(llm: LLM, retriever: Retriever, loop: LoopConfig, **kwargs) -> KairLoop:
    """A loop over an LLM and a retriever already built, so several loops (eval's methods, serve's
    per-request settings, the teacher's samples) share them; kwargs go to KairLoop (prompts, final_docs)."""
    return KairLoop(llm, retriever, loop, **kwargs)


def retrievers_over(rc: RetrieverConfig, corpora: list[CorpusSource]) -> list[tuple[Retriever, Path]]:
    """retriever_over for several callers' corpora (one per dataset), with one retriever per
    passages file: a prebuilt index (`index_dir`) serving every dataset is loaded once, not once
    per dataset (each copy holds the whole index and its encoder in memory). Dense retrievers over
    different corpora share one encoder: one model on the GPU that vLLM's engine shares next."""
    built: dict[Path, Retriever] = {}
    out = []
    for corpus in corpora:
        cfg, passages = retriever_config_over(rc, corpus)
        key = passages.resolve()
        if key not in built:
            first = next(iter(built.values()), None)  # same settings: its encoder is theirs too
            built[key] = build_retriever(cfg, encoder=getattr(first, "encoder", None))
        out.append((built[key], passages))
    return out


def loop_from_config(cfg: RuntimeConfig) -> KairLoop:
    """Everything from one runtime config (`kair ask`)."""
    llm = build_llm(cfg.llm)  # first, as before: a bad model is reported before a bad corpus
    retriever, _ = retriever_over(cfg.retriever)
    return build_loop(llm, retriever, cfg.loop)


__all__ = ["CorpusSource", "build_llm", "build_loop", "build_retriever", "loop_from_config", "retriever_config_over",
           "retriever_over", "retrievers_over"]
