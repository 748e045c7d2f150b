"""A tiny random-init chat model, built locally in well under a second.

    python -m train.tiny_model OUT_DIR [--family llama]

or from Python:

    path = build_tiny_chat_model("/tmp/tiny", family="qwen2")
    model = AutoModelForCausalLM.from_pretrained(path)

Tests and CPU smoke runs need a real transformers causal LM with a real tokenizer and chat
template, but nothing that takes minutes to load or comes from the network. This writes one:
a 2-layer Qwen2 or Llama with a small hidden size, and a byte-level BPE tokenizer trained on a
short built-in text, saved as an ordinary HF model directory. It is not a backend, so it lives
here beside the tiny training run (train/tiny_run.py), not in kair_runtime; the tests and the
benches import it from here.

Its outputs are random text, but they are deterministic (fixed seed), so it is good for checking
batching, padding, token counting, adapters and training loops. Both chat templates mark the
assistant turns with `{% generation %}` so `return_assistant_tokens_mask` works for training.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

# Text the tokenizer learns its merges from: ordinary prose plus the markup a KAIR step emits,
# so prompts and outputs tokenize to a sensible number of tokens.
_TRAIN_TEXT = """\
Question: Who directed the film that won the award in the year the bridge was opened?
Documents: [1] Golden Gate Bridge: The bridge was opened to traffic in 1937 after four years of work.
[2] Academy Awards: The film It Happened One Night won the top award, directed by Frank Capra.
<index>
Keywords: Golden Gate Bridge, 1937, Academy Awards, Frank Capra
Relationships:
Golden Gate Bridge -> opened in -> 1937
It Happened One Night -> directed by -> Frank Capra
</index>
<reasoning>The documents name the year and the film, so the answer is known. Judgment: sufficient</reasoning>
<query>none</query>
Answer: Frank Capra
The river flows north through the valley, past the old mill and the village church.
A scientist at the university studied the history of the city and wrote three books about it.
She was born in Paris, moved to London in 1920, and later became the director of the museum.
The company was founded by two brothers who sold bicycles before they built airplanes.
What is the capital of France? The capital of France is Paris. What is two plus two? Four.
Retrieve more documents about the person, the place, the date and the event. Judgment: insufficient
The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun all afternoon.
system user assistant. You are a helpful assistant. Answer the question with a short answer only, without explanation.
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024, punctuation . , ; : ! ? ( ) [ ] { } " ' - / and more.
"""

# Qwen2's pre-tokenizer split (the one transformers' Qwen2Tokenizer builds).
_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_LLAMA3 = (
    "{{ '<|begin_of_text|>' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|eot_id|>' }}"
    "{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|eot_id|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class _Family:
    config_class: str  # transformers class name, imported when building
    specials: tuple[str, ...]  # registered special tokens; ids 0..n-1 in this order
    eos: str  # ends an assistant turn: generation stops here
    pad: str  # distinct from eos, so padding never looks like a finished answer
    bos: str | None
    chat_template: str
    split_regex: str | None = None  # pre-tokenizer regex transformers imposes for this family


FAMILIES: dict[str, _Family] = {
    "qwen2": _Family("Qwen2Config", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                     eos="<|im_end|>", pad="<|endoftext|>", bos=None, chat_template=_CHATML,
                     split_regex=_QWEN2_SPLIT),
    "llama": _Family("LlamaConfig", ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                     "<|end_header_id|>", "<|eot_id|>", "<|finetune_right_pad_id|>"),
                     eos="<|eot_id|>", pad="<|finetune_right_pad_id|>", bos="<|begin_of_text|>",
                     chat_template=_LLAMA3),
}


def build_tiny_chat_model(out_dir: str | Path, family: str = "qwen2", *, vocab_size: int = 768,
                          hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                          max_position_embeddings: int = 2048, initializer_range: float = 0.2,
                          seed: int = 0) -> Path:
    """Write a random-init chat model and its tokenizer to `out_dir` and return the path.

    `family` picks the architecture and chat template: "qwen2" (ChatML) or "llama" (Llama 3
    headers). The weights come from `seed`, so two builds with the same arguments are identical.
    The defaults give a ~0.1M-parameter model that loads in milliseconds. `initializer_range` is
    10x a real model's: at 0.02 the tied embeddings dominate and the model mostly repeats the
    last prompt token, while 0.2 gives answers that depend on the whole prompt (what batching
    and padding tests need) with clear gaps between the top logits.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; choose one of {sorted(FAMILIES)}")
    fam = FAMILIES[family]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = PreTrainedTokenizerFast(tokenizer_object=_train_tokenizer(fam, vocab_size),
                                  eos_token=fam.eos, pad_token=fam.pad, bos_token=fam.bos,
                                  additional_special_tokens=[s for s in fam.specials
                                                             if s not in (fam.eos, fam.pad, fam.bos)])
    tok.chat_template = fam.chat_template
    ids = {s: tok.convert_tokens_to_ids(s) for s in fam.specials}

    config = getattr(transformers, fam.config_class)(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2), max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range, tie_word_embeddings=True,
        eos_token_id=ids[fam.eos], pad_token_id=ids[fam.pad],
        bos_token_id=ids[fam.bos] if fam.bos else None)
    # fork_rng: seeding the init must not disturb the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=ids[fam.eos], pad_token_id=ids[fam.pad],
                                               bos_token_id=config.bos_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _train_tokenizer(fam: _Family, vocab_size: int):
    """Byte-level BPE on the built-in text, special tokens first so their ids are stable."""
    from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                            trainers)

    tk = Tokenizer(models.BPE())
    if fam.split_regex:
        # transformers rebuilds some families' tokenizers from vocab + merges with its own
        # pre-tokenizer (Qwen2Tokenizer does); train with that exact one so the saved file and
        # the loaded tokenizer agree.
        tk.normalizer = normalizers.NFC()
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(fam.split_regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(fam.specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator([_TRAIN_TEXT], trainer=trainer)
    if fam.bos:
        # Like Llama 3: plain encode() prepends BOS; chat templates write it themselves and are
        # tokenized without special tokens, so it is never doubled.
        tk.post_processor = processors.TemplateProcessing(
            single=f"{fam.bos} $A", pair=f"{fam.bos} $A {fam.bos} $B",
            special_tokens=[(fam.bos, tk.token_to_id(fam.bos))])
    else:
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
    return tk


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Build a tiny random-init chat model directory.")
    p.add_argument("out_dir")
    p.add_argument("--family", default="qwen2", choices=sorted(FAMILIES))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(build_tiny_chat_model(args.out_dir, family=args.family, seed=args.seed))


if __name__ == "__main__":
    main()
