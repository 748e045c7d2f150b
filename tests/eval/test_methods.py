"""Every evaluation method end to end with a deterministic LLM and a small lexical retriever."""

from __future__ import annotations

import re

import pytest

from eval.methods import METHODS, MethodSettings, answer_after_marker, build_method
from kair_runtime.config import LoopConfig
from kair_runtime.llm.scripted import ScriptedLLM, echo_kair
from kair_runtime.records import Question


def cot_respond(messages):
    """Writes a sentence per step and answers on the third reasoning sentence."""
    prompt = messages[-1]["content"]
    if "short answer only" in prompt:
        return "Coldplay"
    if "next sentence of reasoning" in prompt:
        sofar = prompt.rsplit("Reasoning so far:", 1)[1]
        return "So the answer is: 1996." if sofar.count(".") >= 2 else "Coldplay formed in London."
    if "So the answer is" in prompt:  # iter-retgen
        return "Lost! is by Coldplay. So the answer is: 1996"
    return echo_kair(messages)


QUESTIONS = [Question(id=f"q{i}", question=q, answers=["1996"]) for i, q in enumerate([
    "Lost! is a song by a British rock band formed in what year?",
    "Which city was the band behind Wonderwall formed in?",
    "Was Blur formed before Coldplay?",
])]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_yields_one_trace_per_question(name, word_overlap):
    settings = MethodSettings(loop=LoopConfig(max_steps=3, top_k=2), iter_retgen_iterations=2, ircot_max_steps=3)
    traces = build_method(name, ScriptedLLM(cot_respond), word_overlap, settings).run(QUESTIONS)
    assert [t.question.id for t in traces] == [q.id for q in QUESTIONS]
    for t in traces:
        assert t.method == name and t.error is None
        assert t.steps and t.steps[0].query == t.question.question
        assert t.answer and t.final_prompt
        assert t.usage.prompt_tokens > 0


def test_vanilla_uses_its_own_top_k(word_overlap):
    settings = MethodSettings(vanilla_top_k=4)
    (t,) = build_method("vanilla", ScriptedLLM(cot_respond), word_overlap, settings).run(QUESTIONS[:1])
    assert len(t.steps) == 1 and len(t.steps[0].retrieved) == 4


def test_iter_retgen_queries_with_the_previous_generation(word_overlap):
    settings = MethodSettings(iter_retgen_iterations=3)
    (t,) = build_method("iter-retgen", ScriptedLLM(cot_respond), word_overlap, settings).run(QUESTIONS[:1])
    assert len(t.steps) == 3
    assert t.steps[1].query == f"{t.question.question} {t.steps[0].raw_output.strip()}"
    assert t.answer == "1996"


def test_ircot_stops_at_the_answer_marker(word_overlap):
    settings = MethodSettings(ircot_max_steps=5)
    (t,) = build_method("ircot", ScriptedLLM(cot_respond), word_overlap, settings).run(QUESTIONS[:1])
    assert t.stop_reason == "sufficient" and t.answer == "1996"
    assert t.steps[1].query == "Coldplay formed in London."  # the last sentence is the next query


def test_ablations_change_what_the_answer_sees(word_overlap):
    s = MethodSettings(loop=LoopConfig(max_steps=2))
    run = lambda n: build_method(n, ScriptedLLM(cot_respond), word_overlap, s).run(QUESTIONS[:1])[0]
    qa_docs, qa_index, no_index, no_evolving = run("qa-docs"), run("qa-index"), run("no-index"), run("no-evolving")
    assert "Index:" not in qa_docs.final_prompt[-1]["content"]
    assert "Documents:" not in qa_index.final_prompt[-1]["content"]
    assert all(st.index.is_empty() and st.parsed_ok for st in no_index.steps)
    assert "<index>" not in no_index.steps[0].prompt[-1]["content"]
    build = no_evolving.extra["index_build"]
    assert build["index"]["keywords"]  # one index built at the end, over all documents
    assert "Relationships:" in no_evolving.final_prompt[-1]["content"]


def test_no_evolving_makes_one_build_and_one_answer_call_after_its_search(word_overlap):
    """Its search stops before the no-index loop's answer call: that answer was never used."""
    calls = []
    def respond(messages):
        calls.append(messages[-1]["content"])
        return cot_respond(messages)
    s = MethodSettings(loop=LoopConfig(max_steps=2))
    (t,) = build_method("no-evolving", ScriptedLLM(respond), word_overlap, s).run(QUESTIONS[:1])
    assert len(calls) == len(t.steps) + 2
    assert calls[-1] == t.final_prompt[-1]["content"] and calls[-2] == t.extra["index_build"]["prompt"][-1]["content"]


def test_final_docs_hook_reorders_the_answer_documents(word_overlap):
    s = MethodSettings(loop=LoopConfig(max_steps=1, top_k=3))
    reverse = lambda q, docs: list(reversed(docs))
    (t,) = build_method("kair", ScriptedLLM(cot_respond), word_overlap, s, final_docs=reverse).run(QUESTIONS[:1])
    final = t.final_prompt[-1]["content"]
    titles = [p.title for p in t.all_passages()]
    assert final.index(f"] {titles[-1]}:") < final.index(f"] {titles[0]}:")


def _doc_titles(prompt) -> list[str]:
    return re.findall(r"^\[\d+\] (.+?):", prompt[-1]["content"], re.MULTILINE)


def test_final_docs_orders_only_the_calls_that_can_answer_in_every_method(word_overlap):
    """The robustness order is applied to the same thing in every method: the documents of a call
    whose output can be the answer. KAIR's steps and iter-retgen's first iteration keep retrieval
    order (iter-retgen reversed every iteration's documents before)."""
    s = MethodSettings(loop=LoopConfig(max_steps=2, top_k=3), iter_retgen_iterations=2)
    reverse = lambda q, docs: list(reversed(docs))
    run = lambda name, fd: build_method(name, ScriptedLLM(cot_respond), word_overlap, s, final_docs=fd).run(QUESTIONS[:1])[0]
    for name in ("kair", "iter-retgen"):
        plain, reordered = run(name, None), run(name, reverse)
        first_step = lambda t: _doc_titles(t.steps[0].prompt)
        assert first_step(reordered) == first_step(plain) and len(first_step(plain)) == 3, name
        assert _doc_titles(reordered.final_prompt) == list(reversed(_doc_titles(plain.final_prompt))), name
    vanilla = run("vanilla", None), run("vanilla", reverse)
    assert _doc_titles(vanilla[1].final_prompt) == list(reversed(_doc_titles(vanilla[0].final_prompt)))


def test_backend_failure_is_recorded_not_dropped(word_overlap):
    def broken(messages):
        raise ConnectionError("upstream down")
    for name in METHODS:
        traces = build_method(name, ScriptedLLM(broken), word_overlap, MethodSettings()).run(QUESTIONS)
        assert len(traces) == len(QUESTIONS) and all("upstream down" in t.error for t in traces), name


def test_answer_after_marker():
    assert answer_after_marker("x. So the answer is: Paris.") == "Paris"
    assert answer_after_marker("no marker here") is None


@pytest.mark.parametrize("name", ["kair", "vanilla"])
def test_no_repeat_ngram_on_a_backend_without_it_fails_when_the_method_is_built(name, word_overlap):
    from kair_runtime.llm.base import BackendError

    with pytest.raises(BackendError, match="cannot ban repeated n-grams"):
        build_method(name, ScriptedLLM(echo_kair), word_overlap, MethodSettings(loop=LoopConfig(no_repeat_ngram=24)))
