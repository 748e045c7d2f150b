"""AdapterSwitcher: one engine for every adapter where the backend swaps adapters, else one
backend at a time with the previous one closed (the vllm session runs it on a real engine)."""

from __future__ import annotations

import kair_runtime.llm as llm_registry
from kair_runtime.config import LLMConfig
from kair_runtime.llm import AdapterSwitcher
from kair_runtime.llm.base import auto_dtype


class Engine:
    """Records what was built, closed and swapped in."""

    def __init__(self, cfg: LLMConfig, swaps: bool, log: list):
        self.cfg, self.swaps_adapters, self.log = cfg, swaps, log
        log.append(("build", cfg.adapter, cfg.enable_lora))

    def with_adapter(self, adapter):
        self.log.append(("view", adapter))
        return (self, adapter)

    def close(self):
        self.log.append(("close", self.cfg.adapter))


def switch(monkeypatch, swaps: bool) -> list:
    log: list = []
    monkeypatch.setattr(llm_registry, "build_llm", lambda cfg: Engine(cfg, swaps, log))
    with AdapterSwitcher(LLMConfig(backend="vllm"), [None, "ckpt-1", "ckpt-2"]) as models:
        for adapter in (None, "ckpt-1", "ckpt-1", "ckpt-2"):  # asking twice in a row returns the same
            models.get(adapter)
    return log


def test_a_backend_that_swaps_adapters_is_built_once(monkeypatch):
    # LoRA is reserved at the start although the first model asked for is the base one.
    assert switch(monkeypatch, swaps=True) == [("build", None, True), ("view", "ckpt-1"), ("view", "ckpt-2"),
                                               ("close", None)]


def test_other_backends_are_rebuilt_each_closing_the_last(monkeypatch):
    assert switch(monkeypatch, swaps=False) == [
        ("build", None, True), ("close", None), ("build", "ckpt-1", True), ("close", "ckpt-1"),
        ("build", "ckpt-2", True), ("close", "ckpt-2")]


def test_auto_dtype_means_one_thing_on_every_in_process_backend():
    assert auto_dtype("auto", on_gpu=True) == "bfloat16"
    assert auto_dtype("auto", on_gpu=True, gpu_has_bf16=False) == "float16"  # a T4, a V100
    assert auto_dtype("auto", on_gpu=False) == "float32"
    assert auto_dtype("float16", on_gpu=False) == "float16"


def test_another_base_model_is_always_a_new_backend(monkeypatch):
    log: list = []
    monkeypatch.setattr(llm_registry, "build_llm", lambda cfg: Engine(cfg, True, log))
    with AdapterSwitcher(LLMConfig(backend="vllm", model="base"), [None]) as models:
        base = models.get(None)
        assert models.get(None) is base
        full = models.get(None, model="runs/full-ft")
        assert full.cfg.model == "runs/full-ft" and not full.cfg.enable_lora
    assert log == [("build", None, False), ("close", None), ("build", None, False), ("close", None)]
