"""Closed corpora from the benchmark samples: dedupe, stable ids, gold mapping, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eval.cli import corpus_app
from eval.corpus import CorpusError, build_corpus, gold_paragraph_ids, gold_passage_ids, paragraph_id
from eval.datasets import load_dataset, shared_data_dir
from kair_runtime.retrieval.base import load_corpus

SHARED = shared_data_dir()
CORPUS_6119 = SHARED / "2wikimultihopqa" / "corpus_6119.json"
pytestmark = [pytest.mark.skipif(not (SHARED / "README.md").exists(), reason=f"benchmark samples not found at {SHARED}"),
              pytest.mark.usefixtures("shared_env")]  # KAIR_SHARED_DATA set, as a user sets it


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_musique_dev_corpus(tmp_path):
    out = tmp_path / "musique.jsonl"
    stats = build_corpus([("musique", "dev")], out=out)
    # 200 questions x 20 paragraphs, many shared between questions
    assert (stats.read, stats.unique, stats.written) == (4000, 3141, 3141)
    rows = read_jsonl(out)
    assert len(rows) == 3141 and len({r["id"] for r in rows}) == 3141
    assert all(set(r) == {"id", "title", "text"} and r["id"] == paragraph_id(r["title"], r["text"]) for r in rows)
    assert len(load_corpus(out)) == 3141  # the runtime's own reader accepts it


def test_dedupe_ignores_whitespace_differences(tmp_path):
    extra = tmp_path / "extra.jsonl"
    extra.write_text("\n".join(json.dumps(p) for p in [
        {"title": "Oasis", "text": "Oasis was an English rock band."},
        {"title": " Oasis", "text": "Oasis  was an\nEnglish rock band. "},   # same after normalization
        {"title": "Oasis", "text": "Oasis was an English rock band!"},       # different text
        {"id": "p9", "contents": "\"Blur\"\nBlur are an English rock band."},  # FlashRAG shape
    ]) + "\n", encoding="utf-8")
    stats = build_corpus([], [extra], tmp_path / "c.jsonl")
    assert (stats.read, stats.unique) == (4, 3)
    titles = [r["title"] for r in read_jsonl(tmp_path / "c.jsonl")]
    assert titles == ["Oasis", "Oasis", "Blur"]
    # the same benchmark twice doubles what is read, not what is written
    twice = build_corpus([("musique", "dev"), ("musique", "dev")], out=tmp_path / "m2.jsonl")
    assert (twice.read, twice.unique) == (8000, 3141)


def test_bad_extra_file_names_its_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "A", "text": "a"}\n{"title": "B", \n{"title": "C"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: not valid JSON"):
        build_corpus([], [bad], tmp_path / "c.jsonl")
    bad.write_text('{"title": "A", "text": "a"}\n{"title": "C"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: .*neither 'text' nor 'contents'"):
        build_corpus([], [bad], tmp_path / "c.jsonl")


def test_ids_are_stable_across_builds_and_corpora(tmp_path):
    a = build_corpus([("musique", "dev")], out=tmp_path / "a.jsonl")
    b = build_corpus([("musique", "dev")], out=tmp_path / "b.jsonl")
    assert a.unique == b.unique and (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    # in a bigger union the musique paragraphs keep their ids
    build_corpus([("hotpotqa", "dev"), ("musique", "dev")], out=tmp_path / "u.jsonl")
    union = {r["id"]: (r["title"], r["text"]) for r in read_jsonl(tmp_path / "u.jsonl")}
    assert all(union[r["id"]] == (r["title"], r["text"]) for r in read_jsonl(tmp_path / "a.jsonl"))


def test_gold_paragraphs_are_all_in_the_corpus(tmp_path):
    build_corpus([("musique", "dev")], out=tmp_path / "m.jsonl")
    gold = gold_paragraph_ids(load_dataset("musique"), tmp_path / "m.jsonl")
    assert all(g.missing == [] for g in gold.values())
    assert sum(len(g.ids) for g in gold.values()) == 145 * 2 + 32 * 3 + 23 * 4  # hops per question

    stats = build_corpus([("2wiki", "dev")], [CORPUS_6119], tmp_path / "w.jsonl")
    assert stats.sources[str(CORPUS_6119)] == 6119
    gold = gold_paragraph_ids(load_dataset("2wiki"), tmp_path / "w.jsonl")
    assert all(g.missing == [] and g.ids for g in gold.values())


def test_hotpotqa_gold_titles_absent_from_context_are_reported(tmp_path):
    build_corpus([("hotpotqa", "dev")], out=tmp_path / "h.jsonl")
    questions = load_dataset("hotpotqa").questions
    gold = gold_paragraph_ids(questions, tmp_path / "h.jsonl")
    for q in questions:
        in_context = {p["title"] for p in q.metadata["context"]}
        assert gold[q.id].missing == [t for t in q.metadata["supporting_titles"] if t not in in_context]
        assert len(gold[q.id].ids) == len(q.metadata["supporting_paragraphs"])
    # the set form keeps unreachable gold in recall's denominator
    sets = gold_passage_ids(questions, tmp_path / "h.jsonl")
    q = questions[0]  # gold: Kansas Song (absent from its context) and University of Kansas
    assert sets[q.id] == {*gold[q.id].ids, "missing:Kansas Song"} and len(sets[q.id]) == 2


def test_gold_falls_back_to_a_unique_title(tmp_path):
    (q,) = load_dataset("musique", limit=1)
    corpus = tmp_path / "titles.jsonl"  # the gold paragraphs with other text, as in another wiki dump
    corpus.write_text("\n".join(json.dumps({"id": f"w{i}", "title": p["title"], "text": "other text"})
                                for i, p in enumerate(q.metadata["supporting_paragraphs"])) + "\n", encoding="utf-8")
    assert gold_paragraph_ids([q], corpus)[q.id].ids == ["w0", "w1"]


def test_bamboogle_has_no_paragraphs(tmp_path):
    with pytest.raises(CorpusError, match="HotpotQA corpus"):
        build_corpus([("bamboogle", "test")], out=tmp_path / "b.jsonl")
    stats = build_corpus([("bamboogle", "test"), ("hotpotqa", "train")], out=tmp_path / "bh.jsonl")
    assert stats.sources["bamboogle:test"] == 0 and stats.unique == 5896
    assert any("no paragraphs" in n for n in stats.notes)


def test_cli_build(tmp_path):
    runner = CliRunner()
    out = tmp_path / "m.jsonl"
    res = runner.invoke(corpus_app, ["build", "--dataset", "musique", "--split", "dev", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "read 4000, unique 3141, written 3141" in res.output and len(read_jsonl(out)) == 3141

    res = runner.invoke(corpus_app, ["build", "--dataset", "2wiki:dev", "--extra", str(CORPUS_6119),
                                     "--dataset", "musique:train", "--out", str(tmp_path / "w.jsonl")])
    assert res.exit_code == 0, res.output
    assert "2wikimultihopqa:dev: 1640 paragraphs" in res.output and "musique:train: 8000 paragraphs" in res.output

    res = runner.invoke(corpus_app, ["build", "--dataset", "bamboogle", "--split", "test", "--out", str(out)])
    assert res.exit_code == 2 and "no paragraphs" in res.output
    res = runner.invoke(corpus_app, ["build", "--dataset", "musique:nosuch", "--out", str(out)])
    assert res.exit_code == 2 and "neither a musique split" in res.output
