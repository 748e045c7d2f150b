"""LLM backends, registered by name. `build_llm(cfg)` imports a backend's module only when chosen,
so vLLM (a GPU-only dependency) is never imported unless `backend: vllm` is asked for."""

from __future__ import annotations

import importlib

from kair_runtime.config import LLMConfig
from kair_runtime.llm.base import LLM, BackendError, Completion, SamplingParams

# name -> "module:factory"; each factory takes an LLMConfig and returns an LLM.
LLM_BACKENDS: dict[str, str] = {
    "hf": "kair_runtime.llm.hf:HFBackend.from_config",
    "openai": "kair_runtime.llm.openai:OpenAIBackend.from_config",
    "vllm": "kair_runtime.llm.vllm:VLLMBackend.from_config",
    "scripted": "kair_runtime.llm.scripted:from_config",  # no model: checks plumbing only
}


def build_llm(cfg: LLMConfig) -> LLM:
    if cfg.backend not in LLM_BACKENDS:
        raise KeyError(f"unknown LLM backend {cfg.backend!r}; choose one of {sorted(LLM_BACKENDS)}")
    module, _, attr = LLM_BACKENDS[cfg.backend].partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj(cfg)


__all__ = ["LLM", "LLM_BACKENDS", "BackendError", "Completion", "SamplingParams", "build_llm"]
