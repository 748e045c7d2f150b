"""Output folders (kair_runtime.rundir): one writer at a time (hold), replaced whole or not at all
(replaced_folder), and the one claim policy: nested keys, neutral settings, fields added since a
folder was claimed, and an empty claim file."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import yaml

from processes import holder_process

from kair_runtime.config import ConfigError, LoopConfig, RuntimeConfig, to_dict
from kair_runtime.rundir import FolderBusy, changed_keys, claim, hold, remove_orphans, replaced_folder


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


@pytest.mark.parametrize("section, key", [("llm", "merge_adapter"), ("loop", "reuse_repeated_steps")])
def test_a_key_the_file_lacks_means_what_the_code_did_before_it_existed(tmp_path, section, key):
    """llm.merge_adapter came with merging on, loop.reuse_repeated_steps with reuse on; a folder
    claimed before either decoded unmerged and called the model for every step, so its missing
    key matches false, not the default."""
    job = Job()
    old = to_dict(job)
    del old["runtime"][section][key]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    with pytest.raises(ConfigError, match=rf"differs in: runtime.{section}.{key}\)"):
        claim_job(tmp_path, job)
    setattr(getattr(job.runtime, section), key, False)
    claim_job(tmp_path, job)


def test_an_empty_claim_file_matches_nothing(tmp_path):
    (tmp_path / "config.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"differs in: items, out_dir, runtime\)"):
        claim_job(tmp_path, Job())


def test_changed_keys_compares_lists_as_one_setting():
    assert changed_keys({"a": [1, 2], "b": {"c": 1}}, {"a": [1, 3], "b": {"c": 2}}) == ["a", "b.c"]
    assert changed_keys({"a": [{"name": "x"}]}, {"a": [{"name": "x"}, {"name": "y"}]}) == ["a"]


def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_one_leaves_no_lock(tmp_path):
    folder = tmp_path / "run"
    proc = holder_process(folder)
    try:
        with pytest.raises(FolderBusy, match=rf"{folder} is being written by another run \(pid {proc.pid}, since "
                                             r".*: -c kair eval --run-name r\); wait for it"):
            with hold(folder):
                pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with hold(folder):  # the kernel dropped the dead process's lock
        with hold(folder):  # and the same process may hold it again (a command calling another)
            pass


def test_parts_of_a_folder_are_held_apart(tmp_path):
    with hold(tmp_path, part="shard-00000-of-00002"):
        with hold(tmp_path, part="shard-00001-of-00002"):
            pass


def test_orphans_of_dead_writers_go_and_a_live_writers_stay(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / "sub" / f".kept.jsonl.{int(dead.stdout)}.tmp"
    live = tmp_path / f".kept.jsonl.{os.getpid()}.tmp"
    other = tmp_path / "notes.tmp"
    for f in (orphan, live, other):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    assert remove_orphans(tmp_path) == [orphan]
    assert live.exists() and other.exists() and not orphan.exists()


def test_a_replaced_folder_changes_whole_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    with replaced_folder(out, "stats.json") as staging:
        (staging / "stats.json").write_text("1")
        (staging / "data.jsonl").write_text("a\n")
    assert (out / "stats.json").read_text() == "1"
    with pytest.raises(RuntimeError, match="killed"):
        with replaced_folder(out, "stats.json") as staging:
            (staging / "data.jsonl").write_text("b\n")
            raise RuntimeError("killed half-way")
    assert (out / "data.jsonl").read_text() == "a\n" and (out / "stats.json").read_text() == "1"
    with replaced_folder(out, "stats.json") as staging:  # the failed staging folder is resumable state
        assert (staging / "data.jsonl").read_text() == "b\n"
        (staging / "stats.json").write_text("2")
    assert (out / "stats.json").read_text() == "2" and not any(p.name.startswith(".out.") for p in tmp_path.iterdir())


def test_a_folder_of_other_files_is_never_replaced(tmp_path):
    (tmp_path / "thesis.tex").write_text("years of work")
    with pytest.raises(Exception, match=rf"{tmp_path} holds files that are not this command's output \(no "
                                        r"manifest.json\)"):
        with replaced_folder(tmp_path, "manifest.json"):
            pass
    assert (tmp_path / "thesis.tex").read_text() == "years of work"
