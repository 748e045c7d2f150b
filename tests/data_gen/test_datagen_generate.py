"""`generate`: sampling grid, sharding, recorded metadata, batching, resume after SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from data_gen.store import read_trajectories, shard_path, trajectory_key
from data_gen.teacher import GenerateConfig, SamplingGrid, derive_seed, generate, sample_grid
from kair_runtime.config import ConfigError, LLMConfig, LoopConfig, RuntimeConfig, from_dict
from kair_runtime.jsonl import recover

REPO = Path(__file__).resolve().parents[2]


def make_cfg(tmp_path, specs, **kw) -> GenerateConfig:
    return GenerateConfig(runtime=RuntimeConfig(llm=LLMConfig(backend="scripted", model="oracle"),
                                                loop=LoopConfig(max_steps=3, top_k=3, round_size=4)),
                          datasets=specs, sampling=SamplingGrid([0.0, 0.7], samples_per_temperature=2),
                          out_dir=str(tmp_path / "teacher"), **kw)


def test_sample_grid_gives_greedy_one_sample_and_stable_distinct_seeds():
    samples = sample_grid(SamplingGrid([0.0, 0.7, 1.0], samples_per_temperature=3, seed=5))
    assert [s.temperature for s in samples] == [0.0, 0.7, 0.7, 0.7, 1.0, 1.0, 1.0]
    assert [s.sample_id for s in samples] == list(range(7))
    assert len({s.seed for s in samples}) == 7
    assert samples[2].seed == derive_seed(5, 2)  # a function of (base seed, sample id), across processes
    assert derive_seed(0, "q", 1) == derive_seed(0, "q", 1) != derive_seed(1, "q", 1)


def test_generate_writes_one_trajectory_per_question_and_sample(tmp_path, specs, questions, bm25, oracle):
    llm = oracle()
    cfg = make_cfg(tmp_path, specs, teacher="oracle-7b")
    result = generate(cfg, llm=llm, retriever=bm25, progress=False)
    traces = read_trajectories(cfg.out_dir)
    assert result.total == result.written == len(traces) == 10 * 3
    keys = Counter(trajectory_key(t) for t in traces)
    assert set(keys) == {f"{q.id}#{s}" for q in questions for s in range(3)} and max(keys.values()) == 1
    t = next(t for t in traces if t.extra["sample_id"] == 2)
    assert t.extra["teacher"] == "oracle-7b" and t.extra["sampling"]["temperature"] == 0.7
    assert t.extra["seed"] == derive_seed(0, 2) and t.extra["prompt_version"]
    assert t.extra["sampling"]["step_max_tokens"] == cfg.runtime.loop.step_max_tokens
    assert "context" not in t.question.metadata and t.question.metadata["supporting_titles"]
    # The oracle searches twice and answers right: real retrieval, real loop.
    assert all(len(t.steps) == 2 and t.stop_reason == "sufficient" and t.answer == t.question.answers[0] for t in traces)
    assert all(t.steps[0].retrieved for t in traces)
    # Many (question, sample) pairs go to the backend at once, bounded by round_size.
    assert max(llm.calls) == cfg.runtime.loop.round_size
    # A rerun finds everything done.
    again = generate(cfg, llm=oracle(), retriever=bm25, progress=False)
    assert (again.existing, again.written) == (30, 0)


def test_shards_split_the_questions_exactly_once(tmp_path, specs, questions, bm25, oracle):
    seen = Counter()
    for shard in range(3):
        cfg = make_cfg(tmp_path, specs, shard=shard, num_shards=3)
        generate(cfg, llm=oracle(), retriever=bm25, progress=False)
        path = shard_path(Path(cfg.out_dir), shard, 3)
        assert path.name == f"shard-0000{shard}-of-00003.jsonl"
        seen.update(trajectory_key(t) for t in read_trajectories(path))
    assert len(seen) == 30 and set(seen.values()) == {1}
    assert len(read_trajectories(tmp_path / "teacher")) == 30  # the folder reads as one set


def test_resuming_with_another_config_is_refused(tmp_path, specs, bm25, oracle):
    generate(make_cfg(tmp_path, specs), llm=oracle(), retriever=bm25, progress=False)
    other = make_cfg(tmp_path, specs)
    other.sampling.samples_per_temperature = 3
    with pytest.raises(ConfigError, match="different config.*sampling"):
        generate(other, llm=oracle(), retriever=bm25, progress=False)
    with pytest.raises(ConfigError, match="shard"):
        generate(make_cfg(tmp_path, specs, shard=2, num_shards=2), llm=oracle(), retriever=bm25, progress=False)


def test_a_copied_folder_resumes_under_its_new_out_dir(tmp_path, specs, bm25, oracle):
    """out_dir names the folder, not its records: a copy (to retry its failures apart from the
    original, say) resumes instead of being refused for a different config."""
    import shutil

    generate(make_cfg(tmp_path, specs), llm=oracle(), retriever=bm25, progress=False)
    shutil.copytree(tmp_path / "teacher", tmp_path / "copy")
    copy = make_cfg(tmp_path, specs)
    copy.out_dir = str(tmp_path / "copy")
    again = generate(copy, llm=oracle(), retriever=bm25, progress=False)
    assert (again.existing, again.written) == (30, 0)


def test_a_folder_claimed_before_the_spec_had_corpus_keys_resumes(tmp_path, specs, bm25, oracle):
    """OUT/config.yaml written when a training set had only name, split, path and limit: the keys
    the one dataset-spec type added hold their defaults, so the folder is still this config's."""
    cfg = make_cfg(tmp_path, specs)
    generate(cfg, llm=oracle(), retriever=bm25, progress=False)
    path = tmp_path / "teacher" / "config.yaml"
    old = yaml.safe_load(path.read_text())
    for spec in old["datasets"]:
        del spec["corpus"], spec["corpus_from"], spec["extra_corpus"]
    path.write_text(yaml.safe_dump(old, sort_keys=False))
    again = generate(cfg, llm=oracle(), retriever=bm25, progress=False)
    assert (again.existing, again.written) == (30, 0)


def test_sigkill_then_rerun_loses_and_duplicates_nothing(tmp_path, shared_data):
    """The real CLI in a subprocess (scripted backend, BM25), killed mid-run, then rerun."""
    out = tmp_path / "run"
    config = tmp_path / "gen.yaml"
    config.write_text(yaml.safe_dump({
        "runtime": {"llm": {"backend": "scripted", "model": "echo"}, "retriever": {"kind": "bm25"},
                    "loop": {"max_steps": 3, "top_k": 3, "round_size": 2}},
        "datasets": [{"name": "hotpotqa", "split": "train", "limit": 100},
                     {"name": "musique", "split": "train", "limit": 100}],
        "sampling": {"temperatures": [0.0, 0.7], "samples_per_temperature": 2},
        "out_dir": str(out)}))
    cmd = [sys.executable, "-m", "data_gen.cli", "generate", "--config", str(config), "--no-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "KAIR_SHARED_DATA": str(shared_data)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    path = shard_path(out, 0, 1)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= 20:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"generate ended before it could be killed: {proc.stdout.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = len(recover(path))
    assert 20 <= partial < 600
    with path.open("ab") as f:  # as if the kill had cut a write in half
        f.write(b'{"question": {"id": "torn')
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"({600 - partial} written now, {partial} already there)" in done.stdout
    keys = Counter(trajectory_key(t) for t in read_trajectories(path))
    assert len(keys) == 200 * 3 and set(keys.values()) == {1}


def test_generate_config_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="sampling.temperature"):
        from_dict(GenerateConfig, {"sampling": {"temperature": [0.7]}})


def test_the_teachers_retriever_follows_the_one_precedence(tmp_path):
    # index_dir, else the command's own `corpus` (in place of retriever.corpus), else
    # retriever.corpus, else the training sets' closed corpus; nothing is built that is not used.
    from data_gen.store import retriever_config_for
    from kair_runtime.config import RetrieverConfig

    def cfg(**rc) -> GenerateConfig:
        return GenerateConfig(runtime=RuntimeConfig(retriever=RetrieverConfig(kind="bm25", **rc)))

    c = cfg(index_dir=str(tmp_path / "index"), corpus="given.jsonl")
    c.corpus = "own.jsonl"
    assert retriever_config_for(c, tmp_path)[1] == tmp_path / "index" / "passages.jsonl"
    c = cfg(corpus="given.jsonl")
    assert retriever_config_for(c, tmp_path)[0].corpus == "given.jsonl"
    c.corpus = "own.jsonl"
    rc, passages = retriever_config_for(c, tmp_path)
    assert rc.corpus == "own.jsonl" and passages == Path("own.jsonl")
    assert not (tmp_path / "corpus.jsonl").exists()
