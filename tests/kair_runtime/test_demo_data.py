"""The embedded demo world: its questions are answerable from their gold passages, and every hop's
passage is found by a plain lexical retriever from that hop's sub-question."""

from __future__ import annotations

import json
import re

import bm25s
import pytest

from kair_runtime.demo_data import demo_corpus_path, demo_questions_path, load_demo_corpus, load_demo_questions
from kair_runtime.records import Passage, Question

YES_NO = {"yes", "no"}


@pytest.fixture(scope="module")
def corpus() -> dict[str, Passage]:
    return {p.id: p for p in load_demo_corpus()}


@pytest.fixture(scope="module")
def questions() -> list[Question]:
    return load_demo_questions()


def _support_text(q: Question, corpus: dict[str, Passage]) -> str:
    return " ".join(f"{corpus[i].title} {corpus[i].text}" for i in q.metadata["supporting_ids"]).lower()


def test_files_ship_inside_the_package():
    assert demo_corpus_path().is_file() and demo_questions_path().is_file()
    assert demo_corpus_path().parent.name == "data" and demo_corpus_path().parent.parent.name == "kair_runtime"


def test_corpus_shape(corpus):
    assert 60 <= len(corpus) <= 80
    for pid, p in corpus.items():
        assert re.fullmatch(r"demo-\d{3}", pid)
        assert p.title and p.text
        assert 1 <= len(re.findall(r"[.!?](?:\s|$)", p.text)) <= 3, pid  # 1-3 sentences


def test_question_ids_splits_and_metadata(questions):
    ids = [q.id for q in questions]
    assert len(ids) == len(set(ids)) == 24
    assert [len(load_demo_questions(s)) for s in ("train", "dev")] == [16, 8]
    assert all(q.metadata["split"] == "train" for q in load_demo_questions("train"))
    assert all(q.dataset == "demo" and q.answers for q in questions)
    hops = [q.metadata["hops"] for q in questions]
    assert hops.count(3) >= 3 and hops.count(2) >= 16
    assert sum(q.metadata["type"] == "comparison" for q in questions) >= 4
    with pytest.raises(ValueError, match="unknown demo split 'test'"):
        load_demo_questions("test")


def test_supporting_ids_exist_and_match_the_decomposition(questions, corpus):
    for q in questions:
        sup = q.metadata["supporting_ids"]
        assert sup and all(i in corpus for i in sup), q.id
        assert sup == list(dict.fromkeys(h["passage_id"] for h in q.metadata["decomposition"])), q.id


def test_gold_answers_appear_in_supporting_passages(questions, corpus):
    for q in questions:
        text = _support_text(q, corpus)
        for a in q.answers:
            if a.lower() in YES_NO:
                assert q.metadata["type"] == "comparison", q.id
            else:
                assert a.lower() in text, (q.id, a)


def test_each_hop_answer_appears_in_its_passage(questions, corpus):
    for q in questions:
        for h in q.metadata["decomposition"]:
            p = corpus[h["passage_id"]]
            assert h["answer"].lower() in f"{p.title} {p.text}".lower(), (q.id, h)
        if q.metadata["type"] == "bridge":  # the last hop's answer is the gold answer
            last = q.metadata["decomposition"][-1]["answer"].lower()
            assert last in [a.lower() for a in q.answers], q.id


def test_evidence_triples_are_grounded(questions, corpus):
    for q in questions:
        text = _support_text(q, corpus)
        assert q.metadata["evidences"], q.id
        for subj, rel, obj in q.metadata["evidences"]:
            assert rel and subj.lower() in text and obj.lower() in text, (q.id, subj, obj)


def test_each_hop_passage_is_retrieved_by_its_sub_question(questions, corpus):
    ids = list(corpus)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([f"{corpus[i].title} {corpus[i].text}" for i in ids], stopwords="en",
                                   show_progress=False), show_progress=False)
    for q in questions:
        for h in q.metadata["decomposition"]:
            tokens = bm25s.tokenize([h["question"]], stopwords="en", show_progress=False)
            docs, _ = retriever.retrieve(tokens, k=3, show_progress=False)
            assert h["passage_id"] in [ids[i] for i in docs[0]], (q.id, h["question"])


def test_bad_question_file_names_the_line(tmp_path):
    # A broken line must be reported with its file and line number, not skipped.
    bad = tmp_path / "q.jsonl"
    good = json.dumps({"id": "x", "question": "q?", "answers": ["a"], "split": "dev"})
    bad.write_text(good + "\n\n" + json.dumps({"id": "y", "question": "q?"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"q\.jsonl:3: bad demo question"):
        load_demo_questions(path=bad)
    bad.write_text(good.replace('"dev"', '"test"') + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"q\.jsonl:1: split 'test'"):
        load_demo_questions(path=bad)
    bad.write_text(good + "\n", encoding="utf-8")
    assert [q.id for q in load_demo_questions("dev", path=bad)] == ["x"]
