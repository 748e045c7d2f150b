"""runtime.py, the one place config becomes objects, and config.load_config, the one loader:
which corpus a retriever searches (one precedence for every command) and how YAML, --set and
flags combine. Real BM25 retrievers over three tiny corpora, one word apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kair_runtime.config import ConfigError, LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig, load_config
from kair_runtime.demo_data import demo_corpus_path
from kair_runtime.records import Question
from kair_runtime.retrieval.bm25 import build_bm25_index
from kair_runtime.retrieval.base import load_corpus
from kair_runtime.runtime import (build_llm, build_loop, loop_from_config, retriever_config_over, retriever_over,
                                  retrievers_over)


def corpus(path: Path, tag: str) -> Path:
    """Three passages, all about a stone; only the first has the word `marker`; ids name the corpus."""
    rows = [(f"{tag}-0", "Marker", "The marker stone stands on the hill."),
            (f"{tag}-1", "River", "The river runs past a stone to the sea."),
            (f"{tag}-2", "Forest", "The forest hides a stone, old and dark.")]
    path.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in rows), encoding="utf-8")
    return path


@pytest.fixture
def corpora(tmp_path):
    index_dir = build_bm25_index(corpus(tmp_path / "indexed.jsonl", "index"), tmp_path / "index")
    return index_dir, corpus(tmp_path / "given.jsonl", "given"), corpus(tmp_path / "closed.jsonl", "closed")


def top_id(retriever) -> str:
    return retriever.search(["marker stone"], 1)[0][0].id


def never_built() -> Path:
    raise AssertionError("the caller's corpus was built although a rule above it applied")


def test_index_dir_wins_over_every_corpus(corpora):
    index_dir, given, _ = corpora
    retriever, passages = retriever_over(RetrieverConfig(kind="bm25", index_dir=str(index_dir), corpus=str(given)),
                                         never_built)
    assert top_id(retriever) == "index-0"
    assert passages == index_dir / "passages.jsonl"
    assert [p.id for p in load_corpus(passages)] == ["index-0", "index-1", "index-2"]  # gold ids map here


def test_retriever_corpus_wins_over_the_callers_corpus(corpora):
    _, given, _ = corpora
    retriever, passages = retriever_over(RetrieverConfig(kind="bm25", corpus=str(given)), never_built)
    assert top_id(retriever) == "given-0" and passages == given


def test_callers_corpus_is_built_only_when_reached(corpora):
    _, _, closed = corpora
    built = []
    cfg, passages = retriever_config_over(RetrieverConfig(kind="bm25"), lambda: built.append(1) or closed)
    assert built == [1] and cfg.corpus == str(closed) and passages == closed
    retriever, passages = retriever_over(RetrieverConfig(kind="bm25"), closed)  # a plain path works too
    assert top_id(retriever) == "closed-0" and passages == closed


def test_datasets_on_one_index_share_one_retriever_and_own_corpora_get_their_own(corpora):
    index_dir, given, closed = corpora
    (a, pa), (b, pb) = retrievers_over(RetrieverConfig(kind="bm25", index_dir=str(index_dir)), [never_built, never_built])
    assert a is b and pa == pb == index_dir / "passages.jsonl"  # one copy of the index, not one per dataset
    (a, pa), (b, pb), (c, pc) = retrievers_over(RetrieverConfig(kind="bm25"), [given, closed, given])
    assert a is c and a is not b and (pa, pb, pc) == (given, closed, given)
    assert (top_id(a), top_id(b)) == ("given-0", "closed-0")


def test_dense_retrievers_over_different_corpora_share_one_encoder(corpora):
    _, given, closed = corpora
    (a, _), (b, _) = retrievers_over(RetrieverConfig(kind="dense", encoder="minilm"), [given, closed])
    assert a is not b and a.encoder is b.encoder  # one model in memory, not one per dataset
    assert (top_id(a), top_id(b)) == ("given-0", "closed-0")


def test_nothing_set_means_the_embedded_demo_corpus():
    rc = RetrieverConfig(kind="bm25")
    cfg, passages = retriever_config_over(rc)
    assert cfg is rc and passages == demo_corpus_path()


def test_loop_from_config_answers_over_the_chosen_corpus(corpora):
    _, given, _ = corpora
    cfg = RuntimeConfig()
    cfg.llm.backend, cfg.retriever.kind, cfg.retriever.corpus, cfg.loop.max_steps = "scripted", "bm25", str(given), 1
    trace = loop_from_config(cfg).run_one(Question(id="q", question="Where is the marker stone?"))
    assert trace.error is None and trace.steps[0].retrieved[0].id == "given-0"


def test_loops_over_shared_objects_keep_their_own_settings(corpora):
    # serve's scheduler and eval's methods: one llm and retriever, a loop per settings.
    _, given, _ = corpora
    llm, (retriever, _) = build_llm(LLMConfig(backend="scripted")), retriever_over(RetrieverConfig(kind="bm25",
                                                                                                   corpus=str(given)))
    q = Question(id="q", question="Where is the marker stone?")
    for top_k in (1, 2):
        trace = build_loop(llm, retriever, LoopConfig(top_k=top_k, max_steps=1)).run_one(q)
        retrieved = trace.steps[0].retrieved
        assert trace.error is None and len(retrieved) == top_k and retrieved[0].id == "given-0"


# ---------------------------------------------------------------- the loader

def test_yaml_then_set_then_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("llm:\n  model: from-yaml\n  batch_size: 2\nloop:\n  max_steps: 2\n  top_k: 3\n", encoding="utf-8")
    cfg = load_config(RuntimeConfig, path, ["llm.model=from-set", "loop.max_steps=3"],
                      {"llm.model": "from-flag", "loop.top_k": None})  # None: the flag was not given
    assert (cfg.llm.model, cfg.llm.batch_size, cfg.loop.max_steps, cfg.loop.top_k) == ("from-flag", 2, 3, 3)


def test_flag_values_are_set_as_given_not_parsed():
    # --set parses YAML (123 is an int and refused for a string key); a flag's "123" is a model name.
    with pytest.raises(ConfigError, match="llm.model"):
        load_config(RuntimeConfig, None, ["llm.model=123"])
    assert load_config(RuntimeConfig, None, [], {"llm.model": "123"}).llm.model == "123"
    assert load_config(RuntimeConfig, None, [], {"llm.adapter": ""}).llm.adapter == ""  # given, though empty


def test_flags_fill_an_empty_section_and_refuse_a_scalar(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("llm:\nloop: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="flag for loop.top_k: loop is not a section"):
        load_config(RuntimeConfig, path, [], {"llm.backend": "scripted", "loop.top_k": 2})
    path.write_text("llm:\n", encoding="utf-8")
    assert load_config(RuntimeConfig, path, [], {"llm.backend": "scripted"}).llm.backend == "scripted"
