"""The tiny chat model builder: fast, deterministic, and a faithful HF model directory."""

from __future__ import annotations

import json
import time

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from train.tiny_model import build_tiny_chat_model, main

CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Who built it?"},
        {"role": "assistant", "content": "Two brothers."}]


def test_qwen2_dir_has_chatml_and_distinct_pad(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tok.apply_chat_template(CHAT[:2], add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou are brief.<|im_end|>\n<|im_start|>user\nWho built it?"
                    "<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.pad_token_id != tok.eos_token_id
    # Special tokens are single ids, never split into bytes.
    assert tok("<|im_start|>user<|im_end|>", add_special_tokens=False).input_ids[0] == \
        tok.convert_tokens_to_ids("<|im_start|>")
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["vocab_size"]) == ("qwen2", 2, len(tok))
    assert 300 <= len(tok) <= 1100


def test_llama_dir_has_llama3_layout(tiny_llama_dir):
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    text = tok.apply_chat_template(CHAT[:2], add_generation_prompt=True, tokenize=False)
    assert text == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are brief.<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nWho built it?<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
    enc = tok.apply_chat_template(CHAT[:2], add_generation_prompt=True, tokenize=True, return_dict=True)
    ids = enc["input_ids"]
    assert ids.count(tok.bos_token_id) == 1  # the template's BOS, not doubled by the tokenizer
    assert tok.eos_token == "<|eot_id|>" and tok.pad_token_id not in (tok.eos_token_id, tok.bos_token_id)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    assert model.config.model_type == "llama" and model.generation_config.eos_token_id == tok.eos_token_id


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_llama_dir"])
def test_saved_tokenizer_file_matches_the_loaded_tokenizer(fixture, request):
    # transformers rebuilds Qwen2 tokenizers with its own pre-tokenizer: the file must agree.
    d = request.getfixturevalue(fixture)
    raw, tok = Tokenizer.from_file(str(d / "tokenizer.json")), AutoTokenizer.from_pretrained(d)
    text = "Hello   world!\n\nThe 2024 café costs 12345 dollars -> Paris.  Done"
    assert raw.encode(text, add_special_tokens=False).ids == tok(text, add_special_tokens=False).input_ids
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_llama_dir"])
def test_assistant_turns_are_marked_for_training(fixture, request):
    tok = AutoTokenizer.from_pretrained(request.getfixturevalue(fixture))
    enc = tok.apply_chat_template(CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    marked = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"]) if m]
    assert tok.decode(marked) == "Two brothers." + tok.eos_token


def test_builds_fast_and_deterministically(tmp_path, tiny_model_dir):
    build_tiny_chat_model(tmp_path / "warm")  # imports paid here, not in the timing below
    t0 = time.perf_counter()
    a = build_tiny_chat_model(tmp_path / "a", seed=0)
    assert time.perf_counter() - t0 < 10.0  # a guard against an accidental download or big init, not a benchmark
    b = build_tiny_chat_model(tmp_path / "b", family="qwen2", seed=0)
    c = build_tiny_chat_model(tmp_path / "c", seed=1)
    wa, wb, wc = (AutoModelForCausalLM.from_pretrained(p).model.embed_tokens.weight for p in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert (a / "tokenizer.json").read_text() == (tiny_model_dir / "tokenizer.json").read_text()


def test_seeding_leaves_the_callers_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_chat_model(tmp_path / "m")
    assert torch.equal(torch.rand(3), expected)


def test_unknown_family_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"unknown tiny model family 'gpt2'.*llama.*qwen2"):
        build_tiny_chat_model(tmp_path, family="gpt2")


def test_command_line_builds_a_model(tmp_path, capsys):
    main([str(tmp_path / "cli"), "--family", "llama"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "cli").config.model_type == "llama"
