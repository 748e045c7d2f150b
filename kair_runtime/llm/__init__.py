"""LLM backends, registered by name. `build_llm(cfg)` imports a backend's module only when chosen,
so vLLM (a GPU-only dependency) is never imported unless `backend: vllm` is asked for."""

from __future__ import annotations

import dataclasses

from kair_runtime.config import LLMConfig
from kair_runtime.llm.base import LLM, BackendDeadError, BackendError, Completion, SamplingParams
from kair_runtime.registry import resolve

# name -> "module:factory"; each factory takes an LLMConfig and returns an LLM.
LLM_BACKENDS: dict[str, str] = {
    "hf": "kair_runtime.llm.hf:HFBackend.from_config",
    "openai": "kair_runtime.llm.openai:OpenAIBackend.from_config",
    "vllm": "kair_runtime.llm.vllm:VLLMBackend.from_config",
    "scripted": "kair_runtime.llm.scripted:from_config",  # no model: checks plumbing only
}


def build_llm(cfg: LLMConfig) -> LLM:
    return resolve(LLM_BACKENDS, cfg.backend, "LLM backend")(cfg)


def close_llm(llm: LLM) -> None:
    """Release what a backend holds (vLLM's engine processes, an HTTP pool); a no-op for the rest."""
    close = getattr(llm, "close", None)
    if close is not None:
        close()


class AdapterSwitcher:
    """Backends for a sequence of adapters (None: the base model), e.g. every checkpoint of a
    training run. Where the backend can swap adapters on one engine (vllm: one LoRARequest per
    adapter) there is one engine for all of them: vLLM does not reliably give device memory back
    when an engine is dropped. Elsewhere a new adapter closes the previous backend and builds anew.
    Asking again for the current one returns it as it is.

        with AdapterSwitcher(cfg, [None, "ckpt-100", "ckpt-200"]) as models:
            llm = models.get("ckpt-100")
            full = models.get(None, model="runs/full-ft")  # another base model: always a new backend
    """

    def __init__(self, cfg: LLMConfig, adapters: list[str | None]):
        self.cfg = dataclasses.replace(cfg, enable_lora=cfg.enable_lora or any(adapters))
        self.built: LLM | None = None  # the engine (its base view where adapters swap)
        self.current: tuple[tuple[str, str | None], LLM] | None = None  # ((model, adapter), backend)

    def get(self, adapter: str | None, model: str | None = None) -> LLM:
        key = (model or self.cfg.model, adapter)
        if self.current is not None and self.current[0] == key:
            return self.current[1]
        same_model = self.current is not None and self.current[0][0] == key[0]
        if same_model and getattr(self.built, "swaps_adapters", False):
            llm = self.built.with_adapter(adapter)
        else:
            self.close()
            llm = self.built = build_llm(dataclasses.replace(self.cfg, model=key[0], adapter=adapter))
        self.current = (key, llm)
        return llm

    def close(self) -> None:
        if self.built is not None:
            close_llm(self.built)
        self.built = self.current = None

    def __enter__(self) -> "AdapterSwitcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["LLM", "LLM_BACKENDS", "AdapterSwitcher", "BackendDeadError", "BackendError", "Completion", "SamplingParams",
           "build_llm", "close_llm"]
