"""bench/gpu_check.py --toy, executed: the prepared GPU check runs end to end on CPU at a toy shape and
reports every figure. With vLLM's CPU backend (the LoRA adapter its own ZeRO-2 training saved, prefix
caching on and off; ~3.5 min on 2 cores, most of it two engine starts and the DeepSpeed launch), and
with --loop-backend hf (hf + peft, for a GPU machine where vLLM cannot be installed)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SFT_FIGURES = {"sft_tokens_per_s", "sft_peak_memory_gb", "sft_mfu", "sft_tokens_per_s_vs_anchor_low",
               "sft_tokens_per_s_vs_anchor_high"}
LOOP_FIGURES = {
    "vllm": {"vllm_prefix_on_questions_per_s", "vllm_prefix_on_output_tok_s",
             "vllm_prefix_off_questions_per_s", "vllm_prefix_off_output_tok_s", "vllm_prefix_on_off_ratio",
             "vllm_prefix_on_output_tok_s_vs_anchor", "vllm_prefix_off_output_tok_s_vs_anchor"},
    "hf": {"hf_questions_per_s", "hf_output_tok_s", "hf_output_tok_s_vs_anchor"},
}
LOOP_PHASES = {"vllm": {"vllm prefix caching on", "vllm prefix caching off"}, "hf": {"hf loop"}}


@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param("vllm", marks=pytest.mark.vllm),
                                     pytest.param("hf", marks=pytest.mark.distributed)])
def test_toy_check_reports_every_figure(tmp_path, backend):
    if importlib.util.find_spec("deepspeed") is None:
        pytest.fail("bench/gpu_check.py trains under DeepSpeed ZeRO-2: pip install deepspeed==0.19.8 "
                    "(the nox vllm and distributed sessions install it)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "bench/gpu_check.py", "--toy", "--loop-backend", backend,
                           "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["figures"]) == SFT_FIGURES | LOOP_FIGURES[backend]
    for name, value in summary["figures"].items():
        assert math.isfinite(value) and value > 0, (name, value)
    assert set(summary["phases_s"]) == {"build model", "sft zero2"} | LOOP_PHASES[backend]
    assert summary["ratios_meaningful"] is False
    # every loop line and the SFT line say so
    assert proc.stdout.count("ratios to the anchors are meaningless") == len(LOOP_PHASES[backend]) + 1

    sft = summary["sft"]
    assert sft["zero_stage"] == 2 and sft["adapter_lora_b_max_abs"] > 0  # trained under ZeRO-2, and saved
    assert [run["backend"] for run in summary["loop"]] == [backend] * len(LOOP_PHASES[backend])
    for run in summary["loop"]:
        # every question went through every step (a random model never judges itself done) and its answer
        assert run["llm_calls"] == run["questions"] * (run["max_steps"] + 1)
        assert 0 < run["output_tokens"] <= run["llm_calls"] * run["step_max_tokens"]
