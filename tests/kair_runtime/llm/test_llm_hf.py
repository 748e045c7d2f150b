"""HFBackend on the tiny random-init models: batching, exact counts, stopping, seeds, adapters."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kair_runtime.config import LLMConfig
from kair_runtime.llm import LLM, BackendError, SamplingParams, build_llm
from transformers.cache_utils import DynamicCache

from kair_runtime.llm.hf import (GrowingKVLayer, HFBackend, _cache_kwarg, _CompletionNoRepeatNGram,
                                 growing_kv_cache)

QUESTIONS = ["Hi", "Who founded the company that built airplanes?", "What is the capital of France?",
             "Numbers 1 2 3 4 5 6 7 8 9 10 100 1000",
             "The river flows north through the valley, past the old mill and the village church.",
             "Paris", "A scientist at the university studied the history of the city.", "Golden Gate Bridge"]
PROMPTS = [[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": q}]
           for q in QUESTIONS]


def _load(path):
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def qwen(tiny_model_dir) -> HFBackend:
    return HFBackend(*_load(tiny_model_dir), batch_size=3)


@pytest.fixture(scope="module")
def llama_eos(tiny_llama_dir) -> HFBackend:
    """The tiny Llama with its end token's (tied) embedding scaled up, so greedy rows end at
    different lengths: some at EOS, some at max_tokens. That is what exercises padding. The
    scale is the first that gives such a mix on PROMPTS (2.0 with the current builder)."""
    for scale in (2.0, 1.5, 2.5, 3.0):
        model, tok = _load(tiny_llama_dir)
        with torch.no_grad():
            model.get_input_embeddings().weight[tok.eos_token_id] *= scale
        llm = HFBackend(model, tok, batch_size=3)
        reasons = [c.finish_reason for c in llm.generate(PROMPTS, SamplingParams(max_tokens=32))]
        if min(reasons.count("stop"), reasons.count("length")) >= 2:
            return llm
    pytest.fail("no EOS scale gives a mix of finished and truncated rows")


def _raw_greedy(llm: HFBackend, messages, max_new: int) -> list[int]:
    """Reference: one unpadded prompt straight through model.generate, which stops after EOS."""
    ids = llm.encode(messages)
    out = llm.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=max_new, do_sample=False, eos_token_id=llm.tokenizer.eos_token_id,
                             pad_token_id=llm.tokenizer.pad_token_id)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("backend", ["qwen", "llama_eos"])
def test_batched_equals_one_at_a_time_under_greedy(backend, request):
    llm: HFBackend = request.getfixturevalue(backend)
    s = SamplingParams(max_tokens=32)
    batched = llm.generate(PROMPTS, s)  # 8 prompts in chunks of 3, sorted by length inside
    single = [llm.generate([p], s)[0] for p in PROMPTS]
    assert len(batched) == len(PROMPTS)
    assert [(c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason) for c in batched] == \
        [(c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason) for c in single]
    assert len({c.text for c in batched}) == len(PROMPTS)  # really one answer per prompt, in order


def test_token_counts_are_exact(llama_eos):
    out = llama_eos.generate(PROMPTS, SamplingParams(max_tokens=32))
    reasons = [c.finish_reason for c in out]
    assert "stop" in reasons and "length" in reasons  # the fixture's premise: mixed row lengths
    tok = llama_eos.tokenizer
    for msgs, c in zip(PROMPTS, out):
        assert c.prompt_tokens == len(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                              return_dict=True)["input_ids"])
        ref = _raw_greedy(llama_eos, msgs, 32)
        assert c.completion_tokens == len(ref)  # up to and including EOS, no padding
        assert c.text == tok.decode(ref, skip_special_tokens=True)
        assert (ref[-1] == tok.eos_token_id) == (c.finish_reason == "stop")


def _batch_sizes_seen(llm: HFBackend, run) -> list[int]:
    """The batch size of every forward pass the model makes during run()."""
    seen: list[int] = []
    handle = llm.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]),
                                                 with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return seen


def test_segmented_decoding_drops_ended_rows_and_changes_no_output(llama_eos, monkeypatch):
    """Rows that have ended leave the batch between segments; every completion, its token count
    and finish reason stay what one whole generate() per batch gives, under greedy decoding, stop
    strings and the n-gram ban; seeded sampling reruns identically."""
    settings = [SamplingParams(max_tokens=32), SamplingParams(max_tokens=32, no_repeat_ngram=3),
                SamplingParams(max_tokens=32, stop=("e ",))]
    monkeypatch.setattr(llama_eos, "segment_tokens", 10**6)
    whole = [llama_eos.generate(PROMPTS, s) for s in settings]
    whole_sizes = _batch_sizes_seen(llama_eos, lambda: llama_eos.generate(PROMPTS, settings[0]))
    monkeypatch.setattr(llama_eos, "segment_tokens", 4)
    segmented = [llama_eos.generate(PROMPTS, s) for s in settings]
    sizes = _batch_sizes_seen(llama_eos, lambda: llama_eos.generate(PROMPTS, settings[0]))
    assert segmented == whole
    assert {c.finish_reason for c in whole[0]} == {"stop", "length"}  # some rows end early
    assert sum(sizes) < sum(whole_sizes)  # fewer rows decoded...
    assert len(sizes) == len(whole_sizes)  # ...over the same number of steps
    hot = SamplingParams(temperature=1.0, max_tokens=32, seed=3)
    assert llama_eos.generate(PROMPTS, hot) == llama_eos.generate(PROMPTS, hot)


def test_the_growing_kv_cache_gives_dynamic_caches_tokens(tiny_model_dir, monkeypatch):
    """The buffer regrows many times (a 2-token block) and rows are dropped mid-way, as in
    segmented decoding; the tokens are those of transformers' own DynamicCache."""
    monkeypatch.setattr(GrowingKVLayer, "block", 2)
    model, tok = _load(tiny_model_dir)
    enc = tok(["a b c d e f", "x y"], return_tensors="pt", padding=True, padding_side="left")
    out = {}
    for name, cache in [("dynamic", DynamicCache(config=model.config)), ("growing", growing_kv_cache(model))]:
        first = model.generate(**enc, **{_cache_kwarg(model): cache}, max_new_tokens=5, do_sample=False,
                               min_new_tokens=5)
        cache.batch_select_indices(torch.tensor([1]))
        mask = torch.cat([enc.attention_mask[1:], torch.ones(1, 5, dtype=torch.long)], 1)
        rest = model.generate(input_ids=first[1:], attention_mask=mask, **{_cache_kwarg(model): cache},
                              max_new_tokens=6, do_sample=False, min_new_tokens=6)
        out[name] = (first.tolist(), rest.tolist())
    assert out["growing"] == out["dynamic"]
    assert isinstance(growing_kv_cache(model).layers[0], GrowingKVLayer)


def test_max_tokens_is_honoured(qwen):
    out = qwen.generate(PROMPTS[:4], SamplingParams(max_tokens=5))
    assert [(c.completion_tokens, c.finish_reason) for c in out] == [(5, "length")] * 4
    assert all(c.text == qwen._decode(_raw_greedy(qwen, p, 5)) for p, c in zip(PROMPTS, out))


def test_stop_strings_cut_the_text_and_count_tokens_to_the_stop(qwen):
    full = qwen.generate(PROMPTS[:2], SamplingParams(max_tokens=24))
    # A 3-character ASCII window from the middle of the first answer.
    start = next(i for i in range(6, len(full[0].text) - 3) if full[0].text[i:i + 3].isascii()
                 and full[0].text[i:i + 3].isprintable())
    stop = full[0].text[start:start + 3]
    cut = qwen.generate(PROMPTS[:2], SamplingParams(max_tokens=24, stop=(stop, "\x00never")))
    assert cut[0].text == full[0].text[:full[0].text.find(stop)]
    assert cut[0].finish_reason == "stop"
    ids = _raw_greedy(qwen, PROMPTS[0], 24)
    k = cut[0].completion_tokens  # the fewest tokens whose text contains the stop string
    assert stop in qwen._decode(ids[:k]) and stop not in qwen._decode(ids[:k - 1])
    if stop not in full[1].text:  # the other row of the batch is untouched
        assert (cut[1].text, cut[1].completion_tokens) == (full[1].text, full[1].completion_tokens)


def _repeats(ids: list[int], n: int) -> bool:
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(grams) != len(set(grams))


def _greedy_without_repeats(llm: HFBackend, messages, max_new: int, n: int) -> list[int]:
    """Reference: unbatched greedy decoding, one forward pass per token, banning by hand each
    token that would complete an n-gram the completion already holds."""
    prompt, gen = llm.encode(messages), []
    for _ in range(max_new):
        with torch.no_grad():
            logits = llm.model(torch.tensor([prompt + gen])).logits[0, -1]
        for i in range(len(gen) - n + 1):
            if gen[i:i + n - 1] == gen[len(gen) - n + 1:]:
                logits[gen[i + n - 1]] = float("-inf")
        gen.append(int(logits.argmax()))
        if gen[-1] in llm.eos_ids:
            break
    return gen


def test_no_repeat_ngram_matches_a_by_hand_greedy_decoder(qwen):
    plain = [_raw_greedy(qwen, p, 64) for p in PROMPTS]
    assert any(_repeats(ids, 2) for ids in plain)  # the premise: some rows repeat themselves
    out = qwen.generate(PROMPTS, SamplingParams(max_tokens=64, no_repeat_ngram=2))  # chunks of 3, padded
    ref = [_greedy_without_repeats(qwen, p, 64, 2) for p in PROMPTS]
    assert [c.text for c in out] == [qwen._decode(r) for r in ref]
    assert [c.completion_tokens for c in out] == [len(r) for r in ref]
    assert not any(_repeats(r, 2) for r in ref)
    assert [c.text for c in out] != [qwen._decode(ids) for ids in plain]


def test_the_ngram_ban_counts_the_completion_only():
    # Two left-padded rows after a prompt of width 4; n = 3: a row's last 2 tokens, seen earlier
    # in its completion, ban what followed them there.
    ids = torch.tensor([[7, 8, 9, 1, 1, 2, 3, 1, 2],    # completion 1 2 3 1 2: bans 3
                        [0, 1, 2, 5, 6, 1, 2, 4, 4]])   # completion 6 1 2 4 4: prompt's "1 2 5" is free
    scores = _CompletionNoRepeatNGram(3, prompt_width=4)(ids, torch.zeros(2, 10))
    assert torch.isinf(scores[0]).nonzero().flatten().tolist() == [3]
    assert not torch.isinf(scores[1]).any()
    # Too short a completion to hold a repeat: nothing is banned.
    assert not torch.isinf(_CompletionNoRepeatNGram(3, prompt_width=7)(ids, torch.zeros(2, 10))).any()


def test_no_repeat_ngram_of_one_is_refused():
    with pytest.raises(ValueError, match="no_repeat_ngram must be 0"):
        SamplingParams(no_repeat_ngram=1)


def test_seeded_sampling_is_reproducible_and_private(qwen):
    hot = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=16, seed=7)
    torch.manual_seed(0)
    expected_global = torch.rand(2)
    torch.manual_seed(0)
    a = [c.text for c in qwen.generate(PROMPTS, hot)]
    assert torch.equal(torch.rand(2), expected_global)  # the caller's RNG is untouched
    assert [c.text for c in qwen.generate(PROMPTS, hot)] == a
    other = [c.text for c in qwen.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=16, seed=8))]
    greedy = [c.text for c in qwen.generate(PROMPTS, SamplingParams(max_tokens=16))]
    assert other != a and greedy != a


def test_too_long_prompt_is_a_backend_error(tiny_model_dir):
    llm = build_llm(LLMConfig(backend="hf", model=str(tiny_model_dir), max_model_len=64))
    long = [{"role": "user", "content": "the river flows north " * 20}]
    with pytest.raises(BackendError, match=r"prompt 1 has \d+ tokens.*max_tokens=8.*context of 64 tokens"):
        llm.generate([PROMPTS[0], long], SamplingParams(max_tokens=8))
    assert llm.generate([PROMPTS[0]], SamplingParams(max_tokens=8))[0].completion_tokens == 8


def test_from_config_builds_a_protocol_backend(tiny_model_dir):
    cfg = LLMConfig(backend="hf", model=str(tiny_model_dir), device="cpu", dtype="bfloat16", batch_size=2)
    llm = build_llm(cfg)
    assert isinstance(llm, HFBackend) and isinstance(llm, LLM)
    assert llm.name == f"hf:{tiny_model_dir}" and llm.batch_size == 2
    assert next(llm.model.parameters()).dtype == torch.bfloat16
    (c,) = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4))
    assert c.completion_tokens == 4 and c.text
    auto = build_llm(LLMConfig(backend="hf", model=str(tiny_model_dir)))  # no GPU here: cpu + float32
    want = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    assert next(auto.model.parameters()).dtype == want


def test_bad_model_settings_are_clear_errors(tiny_model_dir, tmp_path):
    with pytest.raises(BackendError, match=r"llm.dtype: unknown dtype 'fp8'"):
        build_llm(LLMConfig(backend="hf", model=str(tiny_model_dir), dtype="fp8"))
    with pytest.raises(BackendError, match=r"could not load model .*nowhere"):
        build_llm(LLMConfig(backend="hf", model=str(tmp_path / "nowhere")))
    with pytest.raises(BackendError, match=r"no adapter_config.json"):
        build_llm(LLMConfig(backend="hf", model=str(tiny_model_dir), adapter=str(tmp_path)))


# ---------------------------------------------------------------- LoRA adapters

def _save_lora(base_dir, out_dir, random_b: bool, with_tokenizer: bool = False):
    from peft import LoraConfig, get_peft_model

    model, tok = _load(base_dir)
    # init_lora_weights=False draws lora_B at random too (the default zeroes it: a no-op adapter).
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                     init_lora_weights=not random_b)
    peft_model = get_peft_model(model, cfg)
    peft_model.save_pretrained(out_dir)
    if with_tokenizer:  # as a training checkpoint dir would have it, with its own template
        tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                             "[assistant] ")
        tok.save_pretrained(out_dir)
    return out_dir


def _last_logits(llm: HFBackend, messages) -> torch.Tensor:
    with torch.no_grad():
        return llm.model(torch.tensor([llm.encode(messages)])).logits[0, -1]


def test_adapter_changes_the_model_only_when_lora_b_is_nonzero(tiny_model_dir, tmp_path):
    base = build_llm(LLMConfig(backend="hf", model=str(tiny_model_dir)))
    live = build_llm(LLMConfig(backend="hf", model=str(tiny_model_dir),
                               adapter=str(_save_lora(tiny_model_dir, tmp_path / "live", random_b=True))))
    noop = build_llm(LLMConfig(backend="hf", model=str(tiny_model_dir),
                               adapter=str(_save_lora(tiny_model_dir, tmp_path / "noop", random_b=False))))
    unmerged = build_llm(LLMConfig(backend="hf", model=str(tiny_model_dir), adapter=str(tmp_path / "live"),
                                   merge_adapter=False))
    from peft import PeftModel

    # Merged by default: a plain model, whose float32 logits are the unmerged PeftModel's.
    assert not isinstance(live.model, PeftModel) and isinstance(unmerged.model, PeftModel)
    assert live.name.endswith(str(tmp_path / "live"))
    b, l, n, u = (_last_logits(x, PROMPTS[1]) for x in (base, live, noop, unmerged))
    assert (l - b).abs().max() > 1e-2
    assert torch.allclose(l, u, atol=1e-5)
    assert torch.allclose(n, b, atol=1e-6)
    s = SamplingParams(max_tokens=16)
    base_out, live_out = base.generate(PROMPTS, s), live.generate(PROMPTS, s)
    assert [c.text for c in base_out] != [c.text for c in live_out]
    assert [c.text for c in unmerged.generate(PROMPTS, s)] == [c.text for c in live_out]
    assert [c.text for c in noop.generate(PROMPTS, s)] == [c.text for c in base_out]


def test_a_bfloat16_model_keeps_its_adapter_in_bfloat16_and_reruns_identically(tiny_model_dir, tmp_path):
    """bf16 on the CPU (AMX): the adapter in the base's dtype, so no LoRA layer casts its input to
    float32 and back at every token; and greedy decoding of the same batches is the same on every
    run. (Across batch sizes bf16 rows can differ: see docs/results.md, "bfloat16 on the CPU".)"""
    adapter = _save_lora(tiny_model_dir, tmp_path / "live", random_b=True)
    llm = build_llm(LLMConfig(backend="hf", model=str(tiny_model_dir), dtype="bfloat16", adapter=str(adapter)))
    assert {p.dtype for p in llm.model.parameters()} == {torch.bfloat16}
    s = SamplingParams(max_tokens=16)
    first = [(c.text, c.completion_tokens) for c in llm.generate(PROMPTS, s)]
    assert [(c.text, c.completion_tokens) for c in llm.generate(PROMPTS, s)] == first
    assert len({text for text, _ in first}) > 1


def test_adapter_dir_tokenizer_is_used(tiny_model_dir, tmp_path):
    adapter = _save_lora(tiny_model_dir, tmp_path / "ckpt", random_b=True, with_tokenizer=True)
    llm = build_llm(LLMConfig(backend="hf", model=str(tiny_model_dir), adapter=str(adapter)))
    prompt = llm.tokenizer.decode(llm.encode([{"role": "user", "content": "Hi"}]))
    assert prompt == "[user] Hi\n[assistant] "


def test_the_models_own_generation_config_never_changes_decoding(tiny_model_dir, tmp_path):
    """A student re-saved from a Qwen/Llama base carries the base's sampling defaults (and a model
    may carry a beam or n-gram setting). The loop's greedy must stay greedy, its sampling must be
    exactly the loop's: the outputs equal those of the same weights with a neutral config."""
    model, tok = _load(tiny_model_dir)
    # The sampling fields are a Qwen2.5 base's. Under transformers 5 the loop's explicit do_sample
    # survives them, but the fields it never sets (num_beams, no_repeat_ngram_size) were taken: each
    # alone changed 8 of the 8 greedy outputs before the backend neutralised the model's config.
    model.generation_config.update(do_sample=True, temperature=0.7, top_p=0.8, top_k=20,
                                   repetition_penalty=1.05, num_beams=3, no_repeat_ngram_size=1,
                                   min_new_tokens=4)
    sampling_on = tmp_path / "sampling-on"
    model.save_pretrained(sampling_on)
    tok.save_pretrained(sampling_on)

    def outputs(path):
        llm = build_llm(LLMConfig(backend="hf", model=str(path), device="cpu", dtype="float32", batch_size=3))
        greedy = [c.text for c in llm.generate(PROMPTS, SamplingParams(max_tokens=24))]
        sampled = [c.text for c in llm.generate(PROMPTS, SamplingParams(temperature=1.0, top_p=0.95,
                                                                         max_tokens=24, seed=7))]
        return greedy, sampled

    assert outputs(sampling_on) == outputs(tiny_model_dir)
