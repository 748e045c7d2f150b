"""The embedded demo: a small invented world (towns, rivers, bands, books) shipped in the package.

It is the default corpus of `kair ask` and `kair demo`, so the CLI works with no download, and
because every name is made up, a right answer has to come from retrieval, not from a model's
memory. The files live in kair_runtime/data/: `demo_corpus.jsonl` holds `{id, title, text}`
passages and `demo_questions.jsonl` holds multi-hop questions with their gold chains
(`metadata.supporting_ids`, `metadata.decomposition`, `metadata.evidences`) split into train/dev.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from kair_runtime.jsonl import iter_lines
from kair_runtime.records import Passage, Question
from kair_runtime.retrieval.base import load_corpus

SPLITS = ("train", "dev")


def _data_file(name: str) -> Path:
    # The package is installed as a directory (setuptools, editable or not), never as a zip,
    # so the resource is a real file and callers can hand its path to any retriever.
    return Path(str(files("kair_runtime").joinpath("data", name)))


def demo_corpus_path() -> Path:
    return _data_file("demo_corpus.jsonl")


def demo_questions_path() -> Path:
    return _data_file("demo_questions.jsonl")


def load_demo_corpus() -> list[Passage]:
    return load_corpus(demo_corpus_path())


def load_demo_questions(split: str | None = None, path: str | Path | None = None) -> list[Question]:
    """All demo questions, or those of one split ("train" | "dev"); the split is also kept in
    `metadata["split"]`, since `Question` has no field for it. `path` reads another file in the
    same layout instead of the embedded one."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown demo split {split!r}; choose one of {list(SPLITS)} or None")
    path = Path(path) if path is not None else demo_questions_path()
    out = []
    for lineno, line in iter_lines(path):
        try:
            rec = json.loads(line)
            rec_split = rec["split"]
            q = Question.from_dict(rec)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}:{lineno}: bad demo question ({type(e).__name__}: {e})") from None
        if rec_split not in SPLITS:
            raise ValueError(f"{path}:{lineno}: split {rec_split!r} is not one of {list(SPLITS)}")
        q.metadata["split"] = rec_split
        if split is None or rec_split == split:
            out.append(q)
    return out
