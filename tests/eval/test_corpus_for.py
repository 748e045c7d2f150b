"""One corpus entry point (eval.corpus.corpus_for) behind eval, datagen and the demo: each keeps
its file name and the source strings its cached corpora were fingerprinted with."""

from __future__ import annotations

import json

import pytest

from pipeline.demo_config import DemoConfig
from pipeline.demo_sets import benchmark_sets
from data_gen.store import DataSpec, closed_corpus
from eval.corpus import SOURCES_SUFFIX, cached_corpus, corpus_for
from eval.datasets import shared_data_dir
from eval.run import run_corpus as eval_corpus
from eval.specs import DatasetSpec
from kair_runtime.config import ConfigError
from kair_runtime.retrieval import CorpusError

DATA = shared_data_dir()
pytestmark = pytest.mark.skipif(not (DATA / "2wikimultihopqa").exists(), reason=f"benchmark samples not found at {DATA}")


def sources(corpus) -> list[str]:
    return json.loads(corpus.with_name(corpus.name + SOURCES_SUFFIX).read_text())["sources"]


def test_each_caller_keeps_its_file_name_and_source_strings(tmp_path):
    assert eval_corpus(DatasetSpec("musique"), tmp_path / "run") == tmp_path / "run" / "musique-dev.jsonl"
    assert sources(tmp_path / "run" / "musique-dev.jsonl") == ["musique:dev"]
    bamboogle = eval_corpus(DatasetSpec("bamboogle", "test", corpus_from=["hotpotqa:dev"]), tmp_path / "run")
    assert bamboogle.name == "hotpotqa-dev.jsonl" and sources(bamboogle) == ["hotpotqa:dev"]
    train = closed_corpus([DataSpec("musique", limit=2)], [], tmp_path / "gen" / "corpus.jsonl")
    assert sources(train) == ["musique:train"]
    # The demo names its sources by file, and 2Wiki dev's extra paragraphs come from its default entry.
    cfg = DemoConfig(data_dir=str(DATA), train_sets=["musique:train"], dev_sets=["2wikimultihopqa:dev"], dev_limit=2)
    train_set, (dev,) = benchmark_sets(cfg, tmp_path / "demo")
    assert train_set.corpus == tmp_path / "demo" / "corpora" / "train.jsonl"
    assert sources(train_set.corpus) == [f"musique:{DATA / 'musique' / f}" for f in ("train_100.json", "train_300.jsonl")]
    assert dev.corpus == tmp_path / "demo" / "corpora" / "2wikimultihopqa-dev.jsonl"
    assert sources(dev.corpus) == [f"2wikimultihopqa:{DATA / '2wikimultihopqa' / 'dev_164.jsonl'}",
                                   str(DATA / "2wikimultihopqa" / "corpus_6119.json")]
    assert len(dev.questions) == 2


def test_a_corpus_cached_before_is_reused(tmp_path):
    """A demo corpus built the way the demo built it before (cached_corpus over file-named
    sources) is the one a rerun retrieves from: accepted, not rebuilt."""
    dev_file, extra = DATA / "2wikimultihopqa" / "dev_164.jsonl", DATA / "2wikimultihopqa" / "corpus_6119.json"
    out = tmp_path / "demo" / "corpora"
    old = cached_corpus([("2wikimultihopqa", str(dev_file))], [extra], out / "2wikimultihopqa-dev.jsonl")
    cached_corpus([("musique", str(DATA / "musique" / f)) for f in ("train_100.json", "train_300.jsonl")], [],
                  out / "train.jsonl")
    before = old.stat().st_mtime_ns
    cfg = DemoConfig(data_dir=str(DATA), train_sets=["musique:train"], dev_sets=["2wikimultihopqa:dev"], dev_limit=1)
    _, (dev,) = benchmark_sets(cfg, tmp_path / "demo")
    assert dev.corpus == old and old.stat().st_mtime_ns == before


def test_a_given_corpus_is_one_datasets_and_a_missing_extra_file_is_named(tmp_path):
    given = tmp_path / "c.jsonl"
    assert corpus_for([DatasetSpec("musique", corpus=str(given))], tmp_path / "x.jsonl") == given
    with pytest.raises(CorpusError, match="cannot join the closed corpus of musique, hotpotqa"):
        corpus_for([DatasetSpec("musique", corpus=str(given)), DatasetSpec("hotpotqa")], tmp_path / "x.jsonl")
    # A benchmark folder without 2Wiki's extra paragraphs: the default 2Wiki dev set says so; a
    # mapping without extra_corpus leaves them out.
    root = tmp_path / "data"
    for rel in ("musique/train_100.json", "musique/train_300.jsonl", "2wikimultihopqa/dev_164.jsonl"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).symlink_to(DATA / rel)
    cfg = DemoConfig(data_dir=str(root), train_sets=["musique:train"], dev_sets=["2wikimultihopqa:dev"], dev_limit=1)
    with pytest.raises(ConfigError, match="corpus_6119.json not found \\(the extra_corpus of 2wikimultihopqa-dev"):
        benchmark_sets(cfg, tmp_path / "demo")
    cfg.dev_sets = [DatasetSpec("2wikimultihopqa", "dev")]
    _, (dev,) = benchmark_sets(cfg, tmp_path / "demo")
    assert sources(dev.corpus) == [f"2wikimultihopqa:{root / '2wikimultihopqa' / 'dev_164.jsonl'}"]
