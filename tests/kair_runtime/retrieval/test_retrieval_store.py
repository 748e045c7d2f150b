"""The index dir's passage store and manifest, and the errors a bad corpus or dir gives."""

from __future__ import annotations

import pytest

from kair_runtime.records import Passage
from kair_runtime.retrieval.base import CorpusError
from kair_runtime.retrieval.bm25 import build_bm25_index
from kair_runtime.retrieval.store import IndexDirError, Manifest, PassageStore, unique_passages, write_passages


def test_passage_store_roundtrip_keeps_unicode_and_newlines(tmp_path):
    passages = [Passage("a", "Zürich", "Line one\nline two — ünïcode"), Passage("b", "", ""), Passage("c", "T", "x" * 5000)]
    assert write_passages(passages, tmp_path) == 3
    store = PassageStore(tmp_path)
    assert len(store) == 3 and list(store) == passages and store[1] == Passage("b", "", "")
    with pytest.raises(IndexError, match="out of range"):
        store[3]


def test_empty_store_and_corrupt_offsets(tmp_path):
    assert write_passages([], tmp_path) == 0 and len(PassageStore(tmp_path)) == 0
    write_passages([Passage("a", "t", "text")], tmp_path)
    (tmp_path / "passages.jsonl").write_text("truncated")
    with pytest.raises(IndexDirError, match="corrupt, rebuild it"):
        PassageStore(tmp_path)


def test_duplicate_ids_and_bad_lines_name_the_file(tmp_path):
    with pytest.raises(CorpusError, match="corpus.jsonl: duplicate passage id 'a'"):
        list(unique_passages([Passage("a", "", "x"), Passage("a", "", "y")], "corpus.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "fine"}\n{"id": "b", "text": \n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: not valid JSON"):
        build_bm25_index(bad, tmp_path / "index")


def test_manifest_missing_or_unfinished(tmp_path):
    with pytest.raises(IndexDirError, match="not an index dir, manifest.json is missing .no such directory"):
        Manifest.read(tmp_path / "nope")
    with pytest.raises(IndexDirError, match="unfinished build"):
        Manifest.read(tmp_path)
    Manifest(kind="bm25", count=1, corpus=None, created="now").write(tmp_path)
    assert Manifest.read(tmp_path).kind == "bm25"
    (tmp_path / "manifest.json").write_text('{"kind": "bm25", "count": 1, "colour": "red"}')
    with pytest.raises(IndexDirError, match=r"unknown key\(s\) \['colour'\]"):
        Manifest.read(tmp_path)
