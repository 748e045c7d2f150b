"""bench/gpu_check.py --toy, executed: the prepared GPU check runs end to end on CPU at a toy shape
(vLLM's CPU backend with the LoRA adapter its own ZeRO-2 training saved) and reports every figure.
~3.5 min on 2 cores, most of it two vLLM engine starts and the accelerate/DeepSpeed launch."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FIGURES = {
    "vllm_prefix_on_questions_per_s", "vllm_prefix_on_output_tok_s",
    "vllm_prefix_off_questions_per_s", "vllm_prefix_off_output_tok_s", "vllm_prefix_on_off_ratio",
    "vllm_prefix_on_output_tok_s_vs_anchor", "vllm_prefix_off_output_tok_s_vs_anchor",
    "sft_tokens_per_s", "sft_peak_memory_gb", "sft_tokens_per_s_vs_anchor_low", "sft_tokens_per_s_vs_anchor_high",
}


def test_toy_check_reports_every_figure(tmp_path):
    if importlib.util.find_spec("deepspeed") is None:
        pytest.fail("bench/gpu_check.py trains under DeepSpeed ZeRO-2: pip install deepspeed==0.19.8 "
                    "(the nox vllm session installs it)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "bench/gpu_check.py", "--toy", "--out-dir", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["figures"]) == FIGURES
    for name, value in summary["figures"].items():
        assert math.isfinite(value) and value > 0, (name, value)
    assert set(summary["phases_s"]) == {"build model", "sft zero2", "vllm prefix caching on", "vllm prefix caching off"}
    assert summary["ratios_meaningful"] is False
    assert proc.stdout.count("ratios to the anchors are meaningless") == 3  # both vLLM lines and the SFT line

    sft = summary["sft"]
    assert sft["zero_stage"] == 2 and sft["adapter_lora_b_max_abs"] > 0  # trained under ZeRO-2, and saved
    for run in summary["vllm"].values():
        # every question went through every step (a random model never judges itself done) and its answer
        assert run["llm_calls"] == run["questions"] * (run["max_steps"] + 1)
        assert 0 < run["output_tokens"] <= run["llm_calls"] * run["step_max_tokens"]
