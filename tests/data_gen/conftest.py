"""Fixtures for the data_gen tests: the shared train questions, their closed corpus, BM25 over
it, and scripted teachers (real ScriptedLLM backends with known behaviour)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import pytest

from data_gen.store import DataSpec, closed_corpus, load_questions
from eval.datasets import shared_data_dir
from kair_runtime.config import RetrieverConfig
from kair_runtime.llm.scripted import ScriptedLLM
from kair_runtime.records import Message, Question

TRAIN_FILES = ("hotpotqa/train_100.json", "musique/train_100.json", "2wikimultihopqa/dev_164.jsonl")
SPECS = [DataSpec("hotpotqa", limit=5), DataSpec("musique", limit=5)]  # 10 shared train questions
_QUESTION = re.compile(r"^Question: (.*)$", re.MULTILINE)
_DOC = re.compile(r"^\[(\d+)\] ([^:\n]+):", re.MULTILINE)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = shared_data_dir()
    missing = [f for f in TRAIN_FILES if not (root / f).exists()]
    if missing:
        pytest.skip(f"benchmark data not found under {root} ({', '.join(missing)}); set KAIR_SHARED_DATA")
    return root


@pytest.fixture(scope="session")
def specs(shared_data) -> list[DataSpec]:
    return [DataSpec(s.name, s.split, s.path, s.limit) for s in SPECS]


@pytest.fixture(scope="session")
def questions(specs) -> list[Question]:
    return load_questions(specs)


@pytest.fixture(scope="session")
def corpus(specs, tmp_path_factory) -> Path:
    """The closed corpus generate builds for these specs (every question of both splits)."""
    return closed_corpus(specs, [], tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="session")
def bm25(corpus):
    from kair_runtime.retrieval import build_retriever

    return build_retriever(RetrieverConfig(kind="bm25", corpus=str(corpus)))


def question_of(messages: list[Message]) -> str:
    m = _QUESTION.search(messages[-1]["content"])
    assert m, "every KAIR prompt names the question"
    return m.group(1)


def oracle_respond(questions: list[Question], wrong: set[str] = frozenset(), broken: set[str] = frozenset(),
                   verbose: set[str] = frozenset(), messy: set[str] = frozenset()) -> Callable[[list[Message]], str]:
    """A teacher that knows the gold answers: K&R output from the retrieved titles,
    insufficient at step 1 and sufficient after, the gold answer at the end. Questions in
    `wrong` get a wrong answer, in `broken` a step output with no judgment, in `verbose` 100
    words of chatter after a well-formed output (over a small completion budget), in `messy`
    a well-formed output in a non-canonical layout (multi-line reasoning, bold label, numbering)."""
    by_text = {q.question: q for q in questions}

    def respond(messages: list[Message]) -> str:
        prompt = messages[-1]["content"]
        q = by_text[question_of(messages)]
        if "short answer only" in prompt:
            return "unknown" if q.id in wrong else f"Answer: {q.answers[0]}"
        titles = [t.strip() for _, t in _DOC.findall(prompt)]
        first = "Your previous index" not in prompt
        rels = "\n".join(f"{a} -> appears with -> {b}" for a, b in zip(titles, titles[1:]))
        index = f"<index>\nKeywords: {', '.join(titles)}\nRelationships:\n{rels}\n</index>"
        if q.id in broken:
            return f"{index}\n<reasoning>Looking at the documents.</reasoning>"
        judgment = "insufficient" if first else "sufficient"
        query = f"more about {titles[-1]}" if first and titles else "none"
        if q.id in messy:
            return (f"```\n{index}\n<reasoning>I read   {len(titles)} documents.\nThey name {titles[0] if titles else 'nothing'}."
                    f"\n\n**Judgment**: {judgment}</reasoning>\n<query>1. {query}</query>\n```")
        out = f"{index}\n<reasoning>Read {len(titles)} documents. Judgment: {judgment}</reasoning>\n<query>{query}</query>"
        if q.id in verbose:
            out += "\n" + " ".join(["and that is all"] * 25)
        return out

    return respond


@pytest.fixture(scope="session")
def oracle(questions):
    """Build a ScriptedLLM teacher: oracle(wrong=..., broken=..., verbose=...)."""
    def make(**kwargs) -> ScriptedLLM:
        return ScriptedLLM(oracle_respond(questions, **kwargs), name="oracle")
    return make
