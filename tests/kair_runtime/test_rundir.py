"""The one claim policy of output folders (kair_runtime.rundir): nested keys, neutral settings,
fields added since a folder was claimed, and an empty claim file."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
import yaml

from kair_runtime.config import ConfigError, LoopConfig, RuntimeConfig, to_dict
from kair_runtime.rundir import changed_keys, claim


@dataclass
class Item:
    name: str
    split: str = "dev"


@dataclass
class Job:
    # A section whose default differs from its type's (as the demo's compact runtime does).
    runtime: RuntimeConfig = field(default_factory=lambda: RuntimeConfig(loop=LoopConfig(max_steps=2)))
    items: list[Item] = field(default_factory=list)
    out_dir: str = "out"


HINT = "use another folder"


def claim_job(folder, job: Job, **kw) -> None:
    claim(folder, to_dict(job), Job, hint=HINT, **kw)


def test_the_first_claim_writes_the_config_and_the_same_config_resumes(tmp_path):
    job = Job(items=[Item("musique")])
    claim_job(tmp_path / "run", job)
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text()) == to_dict(job)
    claim_job(tmp_path / "run", job)


def test_a_difference_names_its_dotted_keys_unless_neutral(tmp_path):
    claim_job(tmp_path, Job(items=[Item("musique")]))
    other = Job(items=[Item("musique", "train")])
    other.runtime.loop.top_k, other.out_dir = 9, "elsewhere"
    with pytest.raises(ConfigError, match=r"holds a run with a different config \(differs in: items, out_dir, "
                                          r"runtime.loop.top_k\); use another folder"):
        claim_job(tmp_path, other)
    claim_job(tmp_path, dataclasses.replace(other, items=[Item("musique")]), neutral=("out_dir", "runtime.loop"))


def test_a_key_the_file_lacks_is_no_difference_while_it_holds_its_default(tmp_path):
    """A folder claimed before a field existed resumes while the field keeps its default, the
    section's own default included (Job's runtime has max_steps 2, RuntimeConfig's has 4)."""
    job = Job(items=[Item("musique", "dev")])
    old = to_dict(job)
    del old["out_dir"], old["runtime"]["loop"]["max_steps"], old["items"][0]["split"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    claim_job(tmp_path, job)
    # Not its default now: the key is named.
    job.runtime.loop.max_steps = 4
    with pytest.raises(ConfigError, match=r"differs in: runtime.loop.max_steps\)"):
        claim_job(tmp_path, job)
    with pytest.raises(ConfigError, match=r"differs in: items\)"):
        claim_job(tmp_path, Job(items=[Item("musique", "train")]))
    # A key the file has and the config no longer has is a difference.
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**to_dict(Job()), "retired": 1}))
    with pytest.raises(ConfigError, match=r"differs in: retired\)"):
        claim_job(tmp_path, Job())


def test_an_empty_claim_file_matches_nothing(tmp_path):
    (tmp_path / "config.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"differs in: items, out_dir, runtime\)"):
        claim_job(tmp_path, Job())


def test_changed_keys_compares_lists_as_one_setting():
    assert changed_keys({"a": [1, 2], "b": {"c": 1}}, {"a": [1, 3], "b": {"c": 2}}) == ["a", "b.c"]
    assert changed_keys({"a": [{"name": "x"}]}, {"a": [{"name": "x"}, {"name": "y"}]}) == ["a"]
