"""The transformers backend: a causal LM (optionally with a PEFT LoRA adapter) run in-process.

Prompts go through the tokenizer's chat template, are left-padded into chunks of `batch_size`
and decoded with `model.generate`: greedy when temperature is 0, else seeded sampling. Token
counts are exact: the prompt's template tokens, and the completion up to and including the end
token (or the token that completed a stop string), never padding.

    llm = HFBackend.from_config(LLMConfig(model="smollm2-135m"))
    llm = HFBackend(model, tokenizer)  # an already loaded model, e.g. during training
"""

from __future__ import annotations

import dataclasses
import inspect
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LogitsProcessor,
                          LogitsProcessorList, StoppingCriteria, StoppingCriteriaList)
from transformers.cache_utils import DynamicCache, DynamicLayer

from kair_runtime.config import LLMConfig
from kair_runtime.llm.base import BackendError, Completion, SamplingParams, auto_dtype
from kair_runtime.llm.smollm2 import smollm2_dir
from kair_runtime.records import Message

# Model names that are not hub ids or paths: each resolves to a local directory on demand.
EMBEDDED_MODELS: dict[str, Callable[[], Path]] = {"smollm2-135m": smollm2_dir}

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                  "float16": torch.float16}


class HFBackend:
    bans_repeated_ngrams = True  # SamplingParams.no_repeat_ngram (see _CompletionNoRepeatNGram)
    segment_tokens = 32  # tokens decoded between drops of the rows that have ended (_decode_segmented)
    constrains_grammar = True  # SamplingParams.grammar, through xgrammar's logits processor

    def __init__(self, model, tokenizer, *, batch_size: int = 8, max_context: int | None = None,
                 name: str = "hf"):
        """`model` is a causal LM (or PeftModel) already on its device; `tokenizer` has a chat
        template. `max_context` defaults to the model's max_position_embeddings."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.name = name
        self.device = next(model.parameters()).device
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", None)
        self.eos_ids = _eos_ids(model, tokenizer)
        self._cache_kwarg = _cache_kwarg(model)  # generate()'s name for the cache we pass
        # The loop alone decides how to decode. generate() fills every field our GenerationConfig
        # leaves unset (transformers 5) or at its default value (4.5x) from the model's own
        # generation_config: a student re-saved from Qwen/Llama carries do_sample, temperature, top_p,
        # repetition_penalty, maybe num_beams or no_repeat_ngram_size, and would sample or beam-search
        # while the trace says greedy. A neutral config leaves nothing to fill (eos is read above).
        _inner_model(self.model).generation_config = GenerationConfig()
        # Padding is masked out, so any id works; a distinct pad token keeps the output readable.
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)
        self._grammar_compiler = None  # built on the first grammar (xgrammar is an optional extra)
        self._compiled: dict[str, object] = {}  # grammar text -> its compiled form

    @classmethod
    def from_config(cls, cfg: LLMConfig) -> "HFBackend":
        device, dtype = resolve_device_dtype(cfg.device, cfg.dtype)
        try:
            path = resolve_model(cfg.model)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise BackendError(f"could not load model {cfg.model!r}: {e}") from e
        name = f"hf:{cfg.model}"
        if cfg.adapter:
            model, adapter_tokenizer = load_adapter(model, cfg.adapter, merge=cfg.merge_adapter)
            tokenizer = adapter_tokenizer or tokenizer
            name += f"+{cfg.adapter}"
        # llm.max_model_len (listed with the vllm settings) caps the context here too.
        return cls(model.to(device), tokenizer, batch_size=cfg.batch_size,
                   max_context=cfg.max_model_len, name=name)

    def encode(self, messages: list[Message]) -> list[int]:
        """The prompt's token ids: the chat template with the assistant turn opened."""
        if not self.tokenizer.chat_template:
            raise BackendError(f"{self.name}: the tokenizer has no chat template")
        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=True, return_dict=True)
        return list(enc["input_ids"])

    def generate(self, prompts: list[list[Message]], sampling: SamplingParams) -> list[Completion]:
        encoded = [self.encode(p) for p in prompts]
        if sampling.grammar is not None and self.max_context is not None:
            # A structured call's cap is its grammar's longest output in bytes, a bound no real
            # output nears; past the context it is the context that bounds the output (one that
            # runs there ends "length" and its step is counted as a format failure, not hidden).
            room = self.max_context - max(len(ids) for ids in encoded)
            if room >= 1 and sampling.max_tokens > room:
                sampling = dataclasses.replace(sampling, max_tokens=room)
        self._check_context(encoded, sampling.max_tokens)
        # Similar lengths share a chunk (less padding); results go back in input order.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        results: list[Completion | None] = [None] * len(encoded)
        with _seeded(sampling.seed, self.device):
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                for i, c in zip(chunk, self._generate_chunk([encoded[i] for i in chunk], sampling)):
                    results[i] = c
        return results  # type: ignore[return-value]

    def _check_context(self, encoded: list[list[int]], max_tokens: int) -> None:
        if self.max_context is None:
            return
        for i, ids in enumerate(encoded):
            if len(ids) + max_tokens > self.max_context:
                raise BackendError(
                    f"{self.name}: prompt {i} has {len(ids)} tokens, and with max_tokens={max_tokens} "
                    f"it exceeds the model's context of {self.max_context} tokens; shorten the prompt "
                    f"(e.g. loop.max_passage_words) or lower max_tokens")

    def _generate_chunk(self, batch: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):  # left padding: every prompt ends where generation starts
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention[row, width - len(ids):] = 1
        stopping = StoppingCriteriaList([_StopStrings(self.tokenizer, sampling.stop, width)]
                                        if sampling.stop else [])
        processors = LogitsProcessorList([_CompletionNoRepeatNGram(sampling.no_repeat_ngram, width)]
                                         if sampling.no_repeat_ngram else [])
        if sampling.grammar:
            processors.append(self._grammar_processor(sampling.grammar))
        # xgrammar's processor keeps each row's parse state for one generate() call, so a structured
        # call is decoded whole; any other is decoded in segments that drop the rows already done.
        segment = sampling.max_tokens if sampling.grammar else self.segment_tokens
        rows = self._decode_segmented(input_ids.to(self.device), attention.to(self.device), sampling,
                                      segment, stopping, processors)
        return [self._finish(row, len(ids), sampling) for row, ids in zip(rows, batch)]

    def _decode_segmented(self, input_ids: torch.Tensor, attention: torch.Tensor, sampling: SamplingParams,
                          segment: int, stopping, processors) -> list[list[int]]:
        """Each row's generated tokens. generate() steps every row of a batch until the last one ends,
        so one long completion makes 31 finished rows decode padding to the budget. Here generate()
        runs `segment` tokens at a time; rows that have ended leave the batch and its KV cache, and
        the rest go on from the cache. A row sees the same cache and logits processors either way."""
        width = input_ids.shape[1]
        cache = growing_kv_cache(self.model)
        live = list(range(input_ids.shape[0]))  # original row of each row still in the batch
        done: dict[int, list[int]] = {}
        while True:
            room = sampling.max_tokens - (input_ids.shape[1] - width)
            step = dataclasses.replace(sampling, max_tokens=min(segment, room))
            with torch.inference_mode():
                out = self.model.generate(input_ids=input_ids, attention_mask=attention,
                                          generation_config=self._generation_config(step),
                                          stopping_criteria=stopping, logits_processor=processors,
                                          **{self._cache_kwarg: cache})
            generated = out[:, width:].tolist()
            # The budget is spent, or every row ended before the segment did.
            ended = (out.shape[1] - width >= sampling.max_tokens
                     or out.shape[1] - input_ids.shape[1] < step.max_tokens)
            keep = [] if ended else [k for k, row in enumerate(generated)
                                     if self._finish(row, 0, sampling).finish_reason == "length"]
            kept = set(keep)
            for k, row in enumerate(generated):
                if k not in kept:
                    done[live[k]] = row
            if not keep:
                return [done[r] for r in range(len(done))]
            index = torch.tensor(keep, device=out.device)
            cache.batch_select_indices(index)
            input_ids = out[index]
            attention = torch.cat([attention[index], attention.new_ones((len(keep), out.shape[1] - attention.shape[1]))], 1)
            live = [live[k] for k in keep]

    def _grammar_processor(self, grammar: str) -> LogitsProcessor:
        """xgrammar's transformers logits processor (one per generate call: it keeps per-row
        matchers). The grammar's end allows only our end tokens, so a row stops there."""
        try:
            import xgrammar as xgr
            import xgrammar.contrib.hf
        except ImportError as e:
            raise BackendError(f"{self.name}: loop.structured needs xgrammar; pip install 'kair[structured]' "
                               f"({e})") from e
        if self._grammar_compiler is None:
            # The logits' width, which can exceed the tokenizer's vocabulary (padded embeddings).
            vocab = self.model.get_output_embeddings().weight.shape[0]
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=vocab,
                                                      stop_token_ids=sorted(self.eos_ids))
            self._grammar_compiler = xgr.GrammarCompiler(info)
        if grammar not in self._compiled:
            try:
                self._compiled[grammar] = self._grammar_compiler.compile_grammar(grammar)
            except RuntimeError as e:
                raise BackendError(f"{self.name}: the grammar does not compile: {str(e).splitlines()[-1]}") from e
        return xgrammar.contrib.hf.LogitsProcessor(self._compiled[grammar])

    def _generation_config(self, s: SamplingParams) -> GenerationConfig:
        # The knobs the loop has, set explicitly (the model's generation_config is neutralised in
        # __init__, so nothing else applies). top_k=0 turns off the top-k filter HF samples with by default.
        sample = dict(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=0) \
            if not s.greedy else dict(do_sample=False)
        return GenerationConfig(max_new_tokens=s.max_tokens, repetition_penalty=1.0,
                                eos_token_id=sorted(self.eos_ids), pad_token_id=self.pad_id, **sample)

    def _finish(self, row: list[int], prompt_tokens: int, sampling: SamplingParams) -> Completion:
        """One generated row (padding included) -> text, exact token count and finish reason."""
        n, finish = len(row), "length"
        for k, tok in enumerate(row):
            if tok in self.eos_ids:
                n, finish = k + 1, "stop"
                break
        ids = row[:n]
        text = self._decode(ids)
        cut = _first_stop(text, sampling.stop)
        if cut is not None:
            n, finish, text = _tokens_until_stop(ids, sampling.stop, self._decode), "stop", text[:cut]
        return Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=n, finish_reason=finish)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class GrowingKVLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of a buffer that grows a block at a time.
    DynamicLayer concatenates at every token, copying each layer's whole cache per token: at batch 32
    with KAIR's ~800-token prompts that copy was half of a CPU decoding step (docs/results.md). The
    tensors attention sees hold the same values, so outputs are bit-identical to DynamicLayer's."""

    block = 256  # tokens of room added whenever the buffer is full

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, new = self.get_seq_length(), key_states.shape[-2]
        buf = getattr(self, "_buffer", None)
        # Anything that set self.keys itself (crop, beam reorder, batch select) leaves a tensor that is
        # not our buffer's view: its contents seed a new buffer.
        fits = (buf is not None and self.keys.data_ptr() == buf[0].data_ptr()
                and buf[0].shape[:2] == key_states.shape[:2] and n + new <= buf[0].shape[-2])
        if not fits:
            buf = (self._grown(self.keys, key_states, n, n + new + self.block),
                   self._grown(self.values, value_states, n, n + new + self.block))
            self._buffer = buf
        buf[0][..., n:n + new, :] = key_states
        buf[1][..., n:n + new, :] = value_states
        self.keys, self.values = buf[0][..., :n + new, :], buf[1][..., :n + new, :]
        return self.keys, self.values

    @staticmethod
    def _grown(old: torch.Tensor, states: torch.Tensor, n: int, room: int) -> torch.Tensor:
        fresh = states.new_empty((*states.shape[:-2], room, states.shape[-1]))
        if n:
            fresh[..., :n, :] = old[..., :n, :]
        return fresh


def growing_kv_cache(model) -> DynamicCache:
    """generate()'s own DynamicCache for `model`, its full-attention layers made GrowingKVLayers
    (sliding-window and other layer kinds stay as transformers builds them)."""
    cache = DynamicCache(config=_inner_model(model).config.get_text_config(decoder=True))
    cache.layers = [GrowingKVLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    if not cache.layers:  # no config-derived layers: transformers adds them lazily
        cache.layer_class_to_replicate = GrowingKVLayer
    return cache


def _cache_kwarg(model) -> str:
    """generate()'s keyword for a cache: `cache` from transformers 5.2x, `past_key_values` before."""
    forward = type(_inner_model(model)).forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


class _StopStrings(StoppingCriteria):
    """Stops a row once its generated text (not the prompt) contains a stop string. Decoding the
    same way as `_finish` keeps the stopping point and the reported token count consistent."""

    def __init__(self, tokenizer, stop: tuple[str, ...], prompt_width: int):
        self.tokenizer, self.stop, self.prompt_width = tokenizer, stop, prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width:], skip_special_tokens=True)
        return torch.tensor([_first_stop(t, self.stop) is not None for t in texts], device=input_ids.device)


class _CompletionNoRepeatNGram(LogitsProcessor):
    """Bans every token that would repeat an n-gram already in the row's completion. HF's own
    no_repeat_ngram_size counts the prompt as well, which would forbid copying an entity name
    from the retrieved documents a second time."""

    def __init__(self, n: int, prompt_width: int):
        self.n, self.prompt_width = n, prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        gen = input_ids[:, self.prompt_width:]
        if gen.shape[1] < self.n:
            return scores
        # Each earlier (n-1)-gram equal to the completion's last n-1 tokens bans the token after it.
        windows = gen.unfold(1, self.n - 1, 1)  # (batch, len - n + 2, n - 1)
        same = (windows[:, :-1] == windows[:, -1:]).all(dim=-1)
        banned = torch.zeros_like(scores, dtype=torch.long).scatter_add_(1, gen[:, self.n - 1:], same.long())
        return scores.masked_fill(banned > 0, float("-inf"))


def _first_stop(text: str, stop: tuple[str, ...]) -> int | None:
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else None


def _tokens_until_stop(ids: list[int], stop: tuple[str, ...], decode: Callable[[list[int]], str]) -> int:
    """The fewest leading tokens whose text contains a stop string (binary search: the property
    only turns on as tokens are added)."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if _first_stop(decode(ids[:mid]), stop) is None:
            lo = mid + 1
        else:
            hi = mid
    return hi


def _inner_model(model):
    """The transformers model under a PeftModel (generate() reads its generation_config)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _eos_ids(model, tokenizer) -> set[int]:
    """Every id that ends a turn: the tokenizer's eos plus the model's generation_config list
    (chat models often have two, e.g. <|im_end|> and <|endoftext|>)."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    if not ids:
        raise BackendError("the tokenizer and the model's generation_config define no eos token")
    return ids


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed sampling without touching the caller's random state."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def resolve_model(name: str) -> str:
    """An embedded model name -> its local directory; anything else is a hub id or path as is."""
    return str(EMBEDDED_MODELS[name]()) if name in EMBEDDED_MODELS else name


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """"auto" device: CUDA when a GPU is present, else CPU; "auto" dtype: see base.auto_dtype."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    dtype = auto_dtype(dtype, on_gpu, gpu_has_bf16=on_gpu and torch.cuda.is_bf16_supported(including_emulation=False))
    if dtype not in DTYPES:
        raise BackendError(f"llm.dtype: unknown dtype {dtype!r}; choose auto or one of {sorted(DTYPES)}")
    return dev, DTYPES[dtype]


def load_adapter(model, adapter: str | Path, *, merge: bool = False):
    """Wrap `model` with the PEFT adapter in `adapter` (a training checkpoint dir works); with
    `merge`, fold it into the base weights instead (PEFT's merge_and_unload: a plain model). Returns
    the model and the tokenizer saved next to the adapter, if training saved one."""
    from peft import PeftModel

    path = Path(adapter)
    if not (path / "adapter_config.json").is_file():
        raise BackendError(f"llm.adapter: {path} has no adapter_config.json; expected a PEFT LoRA "
                           f"adapter directory (a training checkpoint directory works)")
    try:
        # The adapter in the base's dtype: PEFT would upcast it to float32 (a training concern), and a
        # bf16 base would then cast every LoRA layer's input to float32 and back at each decoding step.
        peft_model = PeftModel.from_pretrained(model, path, autocast_adapter_dtype=False)
    except (OSError, ValueError, RuntimeError) as e:
        raise BackendError(f"llm.adapter: could not load the adapter in {path}: {e}") from e
    # In a bf16 base the merged weights are rounded to bf16 once, so a few greedy traces differ
    # from the unmerged model's (whose LoRA path rounds its own sums); in float32 they agree.
    model = peft_model.merge_and_unload() if merge else peft_model
    tokenizer = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
    return model, tokenizer
