"""The offline vLLM backend: a `vllm.LLM` engine in-process, with the LoRA adapter if one is set.

vLLM pins its own torch and transformers, so it lives in its own environment on GPU machines
(`pip install 'kair[vllm]'` there). Importing this module never imports vllm; only building
the backend does.
"""

from __future__ import annotations

from pathlib import Path

from kair_runtime.config import LLMConfig
from kair_runtime.llm.base import BackendError, Completion, SamplingParams
from kair_runtime.records import Message

INSTALL_HINT = ("backend: vllm needs the vllm package, which pins its own torch: install the vllm "
                "extra in its own environment on a GPU machine (pip install 'kair[vllm]'), or use "
                "backend: hf, or backend: openai against a `vllm serve` server")


class VLLMBackend:
    def __init__(self, llm, lora_request=None, name: str = "vllm"):
        """`llm` is a vllm.LLM; `lora_request` a vllm LoRARequest applied to every prompt."""
        self.llm = llm
        self.lora_request = lora_request
        self.name = name

    @classmethod
    def from_config(cls, cfg: LLMConfig) -> "VLLMBackend":
        try:
            import vllm
            from vllm.lora.request import LoRARequest
        except ImportError as e:
            raise BackendError(f"{INSTALL_HINT} ({e})") from None
        from kair_runtime.llm.hf import resolve_model  # the embedded model name works here too

        kwargs = dict(model=resolve_model(cfg.model), tensor_parallel_size=cfg.tensor_parallel_size,
                      gpu_memory_utilization=cfg.gpu_memory_utilization,
                      dtype=cfg.dtype)  # vLLM takes the same names: auto, bfloat16, ...
        if cfg.max_model_len:
            kwargs["max_model_len"] = cfg.max_model_len
        lora, name = None, f"vllm:{cfg.model}"
        if cfg.adapter:
            path = Path(cfg.adapter)
            if not (path / "adapter_config.json").is_file():
                raise BackendError(f"llm.adapter: {path} has no adapter_config.json; expected a PEFT "
                                   f"LoRA adapter directory (a training checkpoint directory works)")
            kwargs.update(enable_lora=True, max_lora_rank=cfg.max_lora_rank)
            lora, name = LoRARequest("kair", 1, str(path.resolve())), f"{name}+{cfg.adapter}"
        return cls(vllm.LLM(**kwargs), lora_request=lora, name=name)

    def generate(self, prompts: list[list[Message]], sampling: SamplingParams) -> list[Completion]:
        if sampling.no_repeat_ngram:
            raise BackendError(f"{self.name}: loop.no_repeat_ngram is implemented by the hf backend only; "
                               f"set it to 0 for vllm")
        import vllm

        params = vllm.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                                     max_tokens=sampling.max_tokens, seed=sampling.seed,
                                     stop=list(sampling.stop) or None)
        try:
            outputs = self.llm.chat(prompts, sampling_params=params, lora_request=self.lora_request,
                                    add_generation_prompt=True, use_tqdm=False)
        except ValueError as e:  # e.g. a prompt longer than max_model_len
            raise BackendError(f"{self.name}: {e}") from e
        return [_completion(o) for o in outputs]


def _completion(output) -> Completion:
    best = output.outputs[0]
    return Completion(text=best.text, prompt_tokens=len(output.prompt_token_ids or ()),
                      completion_tokens=len(best.token_ids), finish_reason=best.finish_reason or "stop")
