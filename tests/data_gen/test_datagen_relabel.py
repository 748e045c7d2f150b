"""`kair datagen relabel`: a model's steps labelled by the gold chain, on the shared train questions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from data_gen.chains import CHAINS, GoldDocs
from data_gen.relabel import RelabelConfig, relabel, relabel_trace
from data_gen.sft import SFTDataConfig, SFTError, build_sft
from data_gen.silver import SilverConfig, silver
from data_gen.store import DataSpec, closed_corpus, load_questions
from kair_runtime.config import ConfigError, LoopConfig, RetrieverConfig, RuntimeConfig
from kair_runtime.index import empty_index
from kair_runtime.jsonl import atomic_write_jsonl as write_jsonl
from kair_runtime.llm.scripted import ScriptedLLM
from kair_runtime.loop import KairLoop
from kair_runtime.parser import parse_step_output
from kair_runtime.prompts import PromptSet

N = 8
SPECS = [DataSpec("hotpotqa", limit=N), DataSpec("musique", limit=N), DataSpec("2wikimultihopqa", split="dev", limit=N)]
LOOP = LoopConfig(max_steps=3, top_k=3)


@pytest.fixture(scope="module")
def world(tmp_path_factory, shared_data):
    from kair_runtime.retrieval import build_retriever

    root = tmp_path_factory.mktemp("relabel")
    corpus = closed_corpus(SPECS, [], root / "corpus.jsonl")
    retriever = build_retriever(RetrieverConfig(kind="bm25", corpus=str(corpus)))
    questions = {q.id: q for q in load_questions([dataclasses.replace(s) for s in SPECS])}
    return root, corpus, retriever, questions


def hasty(messages):
    """A model that always stops at once: sufficient at step 1, whatever it read."""
    if "short answer only" in messages[-1]["content"]:
        return "unknown"
    return ("<index>\nKeywords: something\nRelationships:\n</index>\n"
            "<reasoning>That is enough. Judgment: sufficient</reasoning>\n<query>none</query>")


def chain_complete(question, gold, retrieved_ids) -> bool:
    hops = CHAINS[question.dataset](question, gold)
    return all(any(d in retrieved_ids for d in h.doc_ids) for h in hops)


def test_a_hasty_models_steps_get_the_chains_judgment_and_next_query(world):
    root, corpus, retriever, questions = world
    from data_gen.store import without_context

    traces = KairLoop(ScriptedLLM(hasty, name="hasty"), retriever, LOOP).run(
        [without_context(q) for q in questions.values()])
    gold = GoldDocs(corpus)
    version = PromptSet.for_loop(LOOP).version
    stopped_short = 0
    for t in traces:
        q = questions[t.question.id]
        got = relabel_trace(t, q, gold, version)
        if isinstance(got, str):
            assert got == "a hop with no paragraph in the corpus"  # an unmapped gold paragraph
            continue
        (step, *rest) = got.examples
        assert len(t.steps) == 1 and step.messages[:-1] == t.steps[0].prompt  # the state the model saw
        parsed = parse_step_output(step.messages[-1]["content"], "kr", empty_index("kr"), q.question)
        complete = chain_complete(q, gold, {p.id for p in t.steps[0].retrieved})
        assert parsed.judgment == got.chain_judgments[0] == ("sufficient" if complete else "insufficient")
        assert not parsed.fallbacks
        if complete:  # the answer is in its prompt: the gold answer is the target
            assert [(a.kind, a.messages[:-1], a.messages[-1]["content"]) for a in rest] == \
                   [("answer", t.final_prompt, q.answers[0])]
        else:  # it stopped short: go on with the chain's next hop; nothing to answer from
            stopped_short += 1
            assert parsed.next_query and rest == []
    assert stopped_short >= N  # the case relabelling exists for


def test_relabelling_silver_gives_back_silvers_own_steps(world):
    """Where a model took silver's steps, the chain's targets are silver's outputs, byte for byte."""
    root, corpus, retriever, questions = world
    cfg = SilverConfig(runtime=RuntimeConfig(loop=LOOP), datasets=[dataclasses.replace(s) for s in SPECS],
                       corpus=str(corpus), out_dir=str(root / "silver"))
    _, traces = silver(cfg, retriever=retriever)
    gold = GoldDocs(corpus)
    checked = 0
    for t in traces:
        got = relabel_trace(t, questions[t.question.id], gold, PromptSet.for_loop(LOOP).version)
        if isinstance(got, str):
            continue
        steps = [e for e in got.examples if e.kind != "answer"]
        assert [e.messages[-1]["content"] for e in steps] == [s.raw_output for s in t.steps]
        assert got.chain_judgments == [s.judgment for s in t.steps]
        checked += 1
    assert checked >= 2 * N


def test_relabel_writes_examples_that_to_sft_trains_on(world, tmp_path):
    root, corpus, retriever, questions = world
    from data_gen.store import without_context

    traces = KairLoop(ScriptedLLM(hasty, name="hasty"), retriever, LOOP).run(
        [without_context(q) for q in questions.values()])
    for t in traces:
        t.extra.update(teacher="hasty", prompt_version=PromptSet.for_loop(LOOP).version)
    write_jsonl(tmp_path / "hasty.jsonl", (t.to_dict() for t in traces))
    cfg = RelabelConfig(runtime=RuntimeConfig(loop=LOOP), trajectories=str(tmp_path / "hasty.jsonl"),
                        datasets=[dataclasses.replace(s) for s in SPECS], corpus=str(corpus),
                        out_dir=str(tmp_path / "relabelled"))
    stats = relabel(cfg)
    assert json.loads((tmp_path / "relabelled" / "stats.json").read_text()) == stats
    per = stats["datasets"]
    assert sum(d["trajectories"] for d in per.values()) == 3 * N  # every trajectory counted, kept or skipped
    assert all(d["trajectories"] == d.get("relabelled", 0) + sum(v for k, v in d.items() if k.startswith("skipped"))
               for d in per.values())
    assert sum(d["judgments"].get("model sufficient, chain insufficient", 0) for d in per.values()) >= N
    rows = [json.loads(x) for x in (tmp_path / "relabelled" / "examples.jsonl").read_text().splitlines()]
    assert len(rows) == stats["examples"] and {r["source"] for r in rows} == {"relabelled: hasty"}

    silver_cfg = SilverConfig(runtime=RuntimeConfig(loop=LOOP), datasets=[dataclasses.replace(s) for s in SPECS],
                              corpus=str(corpus), out_dir=str(tmp_path / "silver"))
    silver(silver_cfg, retriever=retriever)
    sft = SFTDataConfig(runtime=RuntimeConfig(loop=LOOP), trajectories=str(tmp_path / "silver"),
                        out_dir=str(tmp_path / "sft"), extra_examples=[str(tmp_path / "relabelled" / "examples.jsonl")],
                        validation_fraction=0.2)
    s = build_sft(sft)
    assert s["extra_examples"]["by_source"] == {"relabelled: hasty": len(rows)}
    train = [json.loads(x) for x in (tmp_path / "sft" / "train.jsonl").read_text().splitlines()]
    val = [json.loads(x) for x in (tmp_path / "sft" / "validation.jsonl").read_text().splitlines()]
    assert sum(r["source"] == "relabelled: hasty" for r in train + val) == len(rows)
    assert not {r["question_id"] for r in train} & {r["question_id"] for r in val}  # split by question, all sources

    # Examples made with other prompt settings are refused, naming the file and line.
    rows[3]["prompt_version"] = "0123456789ab"
    write_jsonl(tmp_path / "other.jsonl", rows)
    with pytest.raises(SFTError, match=r"other\.jsonl:4: prompt version 0123456789ab"):
        build_sft(dataclasses.replace(sft, extra_examples=[str(tmp_path / "other.jsonl")]))


def test_a_trajectory_whose_question_has_no_gold_is_an_error(world, tmp_path):
    root, corpus, retriever, questions = world
    from data_gen.store import without_context

    traces = KairLoop(ScriptedLLM(hasty, name="hasty"), retriever, LOOP).run(
        [without_context(q) for q in list(questions.values())[:2]])
    write_jsonl(tmp_path / "t.jsonl", (t.to_dict() for t in traces))
    cfg = RelabelConfig(runtime=RuntimeConfig(loop=LOOP), trajectories=str(tmp_path / "t.jsonl"),
                        datasets=[DataSpec("musique", limit=N)], corpus=str(corpus), out_dir=str(tmp_path / "o"))
    with pytest.raises(ConfigError, match=r"question .* is in none of `datasets`"):
        relabel(cfg)
