"""The one dataset-spec type (eval.specs) and its `NAME[:SPLIT|:FILE]` parser, as eval, datagen
and the demo read them."""

from __future__ import annotations

import pytest

from data_gen.cli import datasets_flag
from data_gen.store import DataSpec, load_questions
from eval.datasets import shared_data_dir
from eval.specs import DatasetSpec, TrainSet, dataset_entries, parse_dataset_arg
from kair_runtime.config import ConfigError, from_dict

DATA = shared_data_dir()
pytestmark = pytest.mark.skipif(not (DATA / "musique").exists(), reason=f"benchmark samples not found at {DATA}")


def test_a_name_takes_the_commands_split_and_a_colon_a_split_or_a_file():
    assert parse_dataset_arg("musique", "dev") == ("musique", "dev")
    assert parse_dataset_arg(" musique:train ", "dev") == ("musique", "train")
    assert DatasetSpec.from_arg("musique") == DatasetSpec("musique", "dev")
    assert TrainSet.from_arg("musique") == TrainSet("musique", "train") == DataSpec("musique")
    assert DatasetSpec.from_arg("musique:validation").split == "validation"  # an alias of dev, kept as written
    file = DATA / "musique" / "ans_dev_200.jsonl"
    assert DatasetSpec.from_arg(f"musique:{file}") == DatasetSpec("musique", path=str(file))
    with pytest.raises(ConfigError, match="'tran' is neither a musique split \\(dev, train\\) nor an existing file"):
        TrainSet.from_arg("musique:tran")
    with pytest.raises(ConfigError, match="must look like name:split"):
        DatasetSpec.from_arg("musique", strict=True)
    with pytest.raises(KeyError, match="unknown dataset"):
        DatasetSpec.from_arg("nosuch:dev")


def test_flag_entries_keep_a_configured_entry_by_name():
    configured = [{"name": "2wikimultihopqa", "extra_corpus": ["c.json"]}]
    assert dataset_entries("2wikimultihopqa,musique:train", DatasetSpec, configured) == [
        {"name": "2wikimultihopqa", "extra_corpus": ["c.json"]}, {"name": "musique", "split": "train", "path": None}]
    # datagen's flag names training sets: no split means train, and the config's entries are replaced.
    specs = [from_dict(TrainSet, e) for e in datasets_flag("hotpotqa,2wikimultihopqa:dev")]
    assert specs == [TrainSet("hotpotqa"), TrainSet("2wikimultihopqa", "dev")]


def test_a_limit_caps_with_the_runs_and_datagen_refuses_per_set_corpus_settings():
    assert DatasetSpec("musique", limit=3).capped(None) == 3
    assert DatasetSpec("musique", limit=3).capped(2) == 2 and DatasetSpec("musique").capped(2) == 2
    assert len(load_questions([TrainSet("musique", limit=2)])) == 2
    with pytest.raises(ConfigError, match=r"datasets\[0\] \(musique\) sets corpus.*top-level `corpus` or `extra_corpus`"):
        load_questions([TrainSet("musique", extra_corpus=["x.json"])])
