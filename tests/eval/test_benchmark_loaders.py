"""The benchmark loaders on the real sample files in ../shared/data, and on small bad files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from eval.datasets import DATASETS, DatasetError, get_spec, load_dataset, shared_data_dir

SHARED = shared_data_dir()
needs_data = pytest.mark.skipif(not (SHARED / "README.md").exists(), reason=f"benchmark samples not found at {SHARED}")
pytestmark = pytest.mark.usefixtures("shared_env")  # KAIR_SHARED_DATA set, as a user sets it


def raw_records(rel: str) -> list[dict]:
    text = (SHARED / rel).read_text(encoding="utf-8")
    return json.loads(text) if text.lstrip().startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]


@needs_data
@pytest.mark.parametrize("name, split, count", [
    ("hotpotqa", "dev", 500), ("hotpotqa", "train", 599), ("musique", "dev", 200), ("musique", "train", 400),
    ("2wikimultihopqa", "dev", 164), ("2wiki", "validation", 164), ("2wikimultihopqa", "train", 1000),
    ("bamboogle", "test", 125),
])
def test_default_files_load_with_the_right_counts(name, split, count):
    result = load_dataset(name, split=split)
    assert len(result) == count and result.skipped == []
    assert len({q.id for q in result}) == count
    assert all(q.dataset == get_spec(name).name and q.question and q.answers for q in result)


@needs_data
def test_hotpotqa_keeps_its_annotations():
    qs = load_dataset("hotpotqa", split="dev").questions
    assert Counter(q.metadata["type"] for q in qs) == {"bridge": 371, "comparison": 129}
    assert sum(not q.metadata["context"] for q in qs) == 2  # as in the official dev file
    q = qs[0]
    assert q.id == "5a7166395542994082a3e814" and q.answers == ["Kansas Song"]
    assert q.metadata["supporting_titles"] == ["Kansas Song", "University of Kansas"]
    # sentences keep their leading space, so "".join rebuilds the paragraph with single spaces
    kansas = next(p for p in q.metadata["context"] if p["title"] == "University of Kansas")
    assert "  " not in kansas["text"] and kansas in q.metadata["supporting_paragraphs"]
    assert q.metadata["supporting_sentences"][0]["sent_idx"] == 1


@needs_data
def test_musique_answers_include_every_alias():
    raw = raw_records("musique/ans_dev_200.jsonl")
    qs = load_dataset("musique", split="dev").questions
    for rec, q in zip(raw, qs):
        assert q.answers == list(dict.fromkeys([rec["answer"], *rec["answer_aliases"]]))
    assert sum(len(q.answers) > 1 for q in qs) == sum(bool(r["answer_aliases"]) for r in raw) > 0
    assert Counter(q.metadata["type"] for q in qs) == {"2hop": 145, "3hop1": 28, "3hop2": 4, "4hop1": 18,
                                                        "4hop2": 1, "4hop3": 4}
    q = qs[0]
    assert [s["title"] for s in q.metadata["decomposition"]] == [
        "Van Hook Township, Mountrail County, North Dakota", "Mountrail County Courthouse"]
    assert len(q.metadata["context"]) == 20 and len(q.metadata["supporting_paragraphs"]) == 2


@needs_data
def test_2wiki_evidences_and_bamboogle_ids():
    q = load_dataset("2wiki").questions[0]
    assert q.metadata["evidences"][0] == ["Forbidden Ground", "director", "Pál Gábor"]
    assert q.metadata["type"] == "bridge_comparison"
    assert q.metadata["supporting_titles"] == ["Forbidden Ground", "Free Guy", "Pál Gábor", "Shawn Levy"]
    b = load_dataset("bamboogle", split="test").questions
    assert [q.id for q in b[:3]] == ["1", "2", "3"] and b[0].answers == ["james madison"]


@needs_data
def test_limit_and_reproducible_sample():
    all_ids = [q.id for q in load_dataset("hotpotqa")]
    assert [q.id for q in load_dataset("hotpotqa", limit=5)] == all_ids[:5]
    a = [q.id for q in load_dataset("hotpotqa", sample=20, seed=3)]
    b = [q.id for q in load_dataset("hotpotqa", sample=20, seed=3)]
    c = [q.id for q in load_dataset("hotpotqa", sample=20, seed=4)]
    assert a == b and a != c and len(set(a)) == 20
    assert a == [i for i in all_ids if i in set(a)]  # kept in file order
    with pytest.raises(ValueError, match="cannot sample"):
        load_dataset("hotpotqa", sample=501)
    with pytest.raises(ValueError, match="not both"):
        load_dataset("hotpotqa", limit=1, sample=1)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps({"idx": 7, "question": "Who?", "answer": "Me"})


def test_malformed_line_names_file_and_line(tmp_path):
    path = write_lines(tmp_path / "b.jsonl", [GOOD, '{"idx": 8, "question": "Who?"', GOOD])
    with pytest.raises(DatasetError, match=rf"b\.jsonl:2: malformed bamboogle record: not valid JSON"):
        load_dataset("bamboogle", path=path)
    path = write_lines(tmp_path / "m.jsonl", [GOOD, "", json.dumps({"idx": 9, "question": "Who?"})])
    with pytest.raises(DatasetError, match=r"m\.jsonl:3: .*missing key 'answer'"):
        load_dataset("bamboogle", path=path)


def test_malformed_array_record_names_its_index(tmp_path):
    good = {"_id": "x", "question": "q?", "answer": "a", "supporting_facts": [["T", 0]],
            "context": [["T", ["Sentence one.", " Two."]]]}
    bad = {**good, "_id": "y", "context": [["T", "not a list of sentences"]]}
    path = tmp_path / "h.json"
    path.write_text(json.dumps([good, bad]), encoding="utf-8")
    with pytest.raises(DatasetError, match=r"h\.json\[record 1\]: .*context\[0\]"):
        load_dataset("hotpotqa", path=path)
    ok = load_dataset("hotpotqa", path=path, skip_malformed=True)
    assert [q.id for q in ok] == ["x"] and ok[0].metadata["supporting_paragraphs"] == [
        {"title": "T", "text": "Sentence one. Two."}]


def test_skip_mode_reports_every_skipped_record(tmp_path, caplog):
    path = write_lines(tmp_path / "b.jsonl", [GOOD, "{oops", json.dumps({"question": "no answer"}),
                                              json.dumps({"idx": 3, "question": "Q", "answer": "  "}),
                                              GOOD.replace('"idx": 7', '"idx": 8')])
    result = load_dataset("bamboogle", path=path, skip_malformed=True)
    assert len(result) == 2
    assert len(result.skipped) == 3
    assert [s.split(": ")[0].rsplit(":", 1)[1] for s in result.skipped] == ["2", "3", "4"]
    assert "no non-empty gold answer" in result.skipped[2]
    assert "skipped 3 malformed" in caplog.text


def test_flashrag_records(tmp_path):
    rec = {"id": "test_0", "question": "Who?", "golden_answers": ["A", "B"], "metadata": {"type": "bridge"}}
    path = write_lines(tmp_path / "f.jsonl", [json.dumps(rec)])
    (q,) = load_dataset("flashrag", path=path)
    assert (q.id, q.answers, q.dataset, q.metadata) == ("test_0", ["A", "B"], "flashrag", {"type": "bridge"})


@needs_data
def test_a_split_of_several_files_reads_them_all_in_order(tmp_path, monkeypatch):
    """HotpotQA's train split is train_100.json then train_499.jsonl: both read, one id in both is
    an error naming where it was first seen, and a missing file is named (not a smaller split)."""
    qs = load_dataset("hotpotqa", split="train").questions
    first = [r["_id"] for r in raw_records("hotpotqa/train_100.json")]
    second = [r["_id"] for r in raw_records("hotpotqa/train_499.jsonl")]
    assert [q.id for q in qs] == first + second
    root = tmp_path / "data" / "hotpotqa"
    root.mkdir(parents=True)
    (root / "train_100.json").symlink_to(SHARED / "hotpotqa" / "train_100.json")
    monkeypatch.setenv("KAIR_SHARED_DATA", str(tmp_path / "data"))
    with pytest.raises(DatasetError, match="train_499.jsonl not found \\(part of hotpotqa:train\\)"):
        load_dataset("hotpotqa", split="train")
    again = raw_records("hotpotqa/train_100.json")[-1]
    (root / "train_499.jsonl").write_text(json.dumps(again) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=f"train_499.jsonl:1: duplicate hotpotqa id '{again['_id']}' "
                                           f"\\(first at .*train_100.json\\[record 99\\]\\)"):
        load_dataset("hotpotqa", split="train")


def test_unknown_names_and_splits(tmp_path, monkeypatch):
    with pytest.raises(KeyError, match="unknown dataset 'nq'"):
        load_dataset("nq")
    with pytest.raises(DatasetError, match="available: dev, train"):
        load_dataset("2wiki", split="test")
    monkeypatch.setenv("KAIR_SHARED_DATA", str(tmp_path))
    with pytest.raises(DatasetError, match="KAIR_SHARED_DATA"):
        load_dataset("musique")
    assert {"hotpotqa", "musique", "2wikimultihopqa", "bamboogle", "flashrag"} <= set(DATASETS)


def test_hub_offline_is_a_clear_error():
    # a fresh process, so the hub library reads HF_HUB_OFFLINE before anything imports it
    code = ("from eval.datasets import load_dataset\n"
            "try:\n    load_dataset('musique', hub=True)\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("DatasetError could not load 'dgslibisey/MuSiQue'") and "internet" in out
