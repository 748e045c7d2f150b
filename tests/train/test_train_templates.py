"""Training templates render like the models' own, and the loss mask is exactly the assistant
replies plus their end-of-turn token, on both families' token layouts (Qwen2.5 ChatML, Llama 3.1)."""

from __future__ import annotations

import json

import pytest
from sft_helpers import real_template, tiny_args
from transformers import AutoTokenizer

from train.templates import (PROBE_CONVERSATIONS, TemplateError, assistant_token_mask, end_of_turn_id,
                             ensure_distinct_pad, first_mismatch, has_generation_markers, load_template,
                             resolve_training_template)

FAMILIES = {"qwen2": ("qwen2.5", "<|im_end|>"), "llama": ("llama3.1", "<|eot_id|>")}

HELLO = [{"role": "user", "content": "Hello, how are you?"},
         {"role": "assistant", "content": "I'm doing great. How can I help you today?"},
         {"role": "user", "content": "I'd like to show off how chat templating works!"}]

# How the real templates render HELLO (the public reference renderings of these models).
EXPECTED = {
    "qwen2": ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\nHello, how are you?<|im_end|>\n"
              "<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>\n"
              "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n"),
    "llama": ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
              "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHello, how are you?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nI'm doing great. How can I help you today?<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nI'd like to show off how chat templating works!<|eot_id|>"),
}


@pytest.fixture(scope="module")
def tokenizers(tiny_model_dir, tiny_llama_dir):
    return {"qwen2": AutoTokenizer.from_pretrained(tiny_model_dir), "llama": AutoTokenizer.from_pretrained(tiny_llama_dir)}


def sft_conversations(sft_data_dir) -> list[list[dict]]:
    rows = []
    for split in ("train", "validation"):
        with open(sft_data_dir / f"sft_{split}.jsonl", encoding="utf-8") as f:
            rows += [json.loads(line)["messages"] for line in f]
    return rows


@pytest.mark.parametrize("family", FAMILIES)
def test_real_templates_are_the_published_ones(tokenizers, family):
    tok = tokenizers[family]
    assert not has_generation_markers(real_template(family))
    assert tok.apply_chat_template(HELLO, tokenize=False, chat_template=real_template(family)) == EXPECTED[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_training_template_renders_like_the_model(tokenizers, sft_data_dir, family):
    tok, (name, _) = tokenizers[family], FAMILIES[family]
    ours = load_template(name)
    assert has_generation_markers(ours)
    convs = PROBE_CONVERSATIONS + [HELLO] + sft_conversations(sft_data_dir)
    assert first_mismatch(tok, real_template(family), ours, convs) is None
    # "auto" recognizes the model's template by what it renders, and keeps one that has markers
    assert resolve_training_template_with(tok, real_template(family), "auto", convs) == ours
    assert resolve_training_template(tok, "auto", convs) is None


def test_a_template_that_renders_differently_is_refused(tokenizers):
    tok = tokenizers["qwen2"]
    with pytest.raises(TemplateError, match="does not render like the model's own template"):
        resolve_training_template_with(tok, real_template("qwen2"), "llama3.1")
    with pytest.raises(TemplateError, match="no registered training template renders like it"):
        resolve_training_template_with(tok, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
                                       "auto")
    with pytest.raises(TemplateError, match="has no {% generation %} markers"):
        resolve_training_template_with(tok, real_template("qwen2"), "model")


def resolve_training_template_with(tok, own: str, choice: str, convs=None):
    """resolve_training_template for a tokenizer whose own template is `own`."""
    saved, tok.chat_template = tok.chat_template, own
    try:
        return resolve_training_template(tok, choice, convs or [HELLO + [{"role": "assistant", "content": "ok"}]])
    finally:
        tok.chat_template = saved


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_turn_mask_is_replies_and_end_of_turn(tokenizers, family):
    tok, (name, eot) = tokenizers[family], FAMILIES[family]
    ids, mask = assistant_token_mask(tok, PROBE_CONVERSATIONS[1], load_template(name))
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    # Llama 3.1 trims every message; ChatML keeps the content as is
    want = {"qwen2": f" first answer {eot}second answer{eot}", "llama": f"first answer{eot}second answer{eot}"}
    assert trained == want[family]
    assert end_of_turn_id(tok, load_template(name)) == tok.convert_tokens_to_ids(eot)


@pytest.mark.parametrize("family", FAMILIES)
def test_trl_labels_cover_exactly_the_reply_and_its_end_of_turn(family, request, sft_data_dir, tmp_path):
    """Through train.sft's own path (template swap, TRL tokenization, label building): every
    training row's labels are the reply tokens plus the end-of-turn token, nothing of the
    system/user turns or the assistant header; and the tokens are those of the real template."""
    from train.sft import build_trainer

    model_dir = request.getfixturevalue({"qwen2": "qwen_real_dir", "llama": "llama_real_dir"}[family])
    trainer = build_trainer(*tiny_args(model_dir, sft_data_dir, tmp_path))
    tok, eot = trainer.processing_class, FAMILIES[family][1]
    eot_id = tok.convert_tokens_to_ids(eot)
    assert tok.chat_template == real_template(family)  # restored for the saved checkpoints
    convs = sft_conversations(sft_data_dir)[:len(trainer.train_dataset)]
    for row, conv in zip(trainer.train_dataset, convs):
        prompt = tok.apply_chat_template(conv[:-1], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        full = tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]
        assert row["input_ids"] == full and full[:len(prompt)] == prompt
        end = len(full) - full[::-1].index(eot_id)  # through the last end-of-turn token
        trained = [i for i, label in enumerate(row["labels"]) if label != -100]
        assert trained == list(range(len(prompt), end)), conv[-1]["content"][:60]
        assert [row["labels"][i] for i in trained] == full[len(prompt):end]
        assert row["labels"][end - 1] == eot_id
        content = conv[-1]["content"].strip() if family == "llama" else conv[-1]["content"]
        assert tok.decode(full[len(prompt):end]) == content + eot


def test_pad_equal_to_eos_is_replaced_and_end_of_turn_labels_survive_padding(llama_real_dir, sft_data_dir, tmp_path):
    """The Llama fixture's tokenizer has pad == eos == <|eot_id|>: training must pick another pad,
    and in a padded batch the end-of-turn labels are kept while every pad position is masked."""
    from train.sft import build_trainer

    assert AutoTokenizer.from_pretrained(llama_real_dir).pad_token == "<|eot_id|>"
    trainer = build_trainer(*tiny_args(llama_real_dir, sft_data_dir, tmp_path))
    tok = trainer.processing_class
    eot_id = tok.convert_tokens_to_ids("<|eot_id|>")
    assert tok.pad_token == "<|finetune_right_pad_id|>" and tok.pad_token_id != eot_id
    rows = [trainer.train_dataset[i] for i in range(4)]
    batch = trainer.data_collator(rows)
    for r, row in enumerate(rows):
        n = len(row["input_ids"])
        assert batch["labels"][r, n - 1] == eot_id  # the reply's end-of-turn token is trained
        assert (batch["labels"][r, n:] == -100).all() and (batch["input_ids"][r, n:] == tok.pad_token_id).all()
    assert len({len(r["input_ids"]) for r in rows}) > 1  # the batch really was padded


def test_ensure_distinct_pad_keeps_a_good_pad_and_fails_when_none_exists(tokenizers):
    tok = tokenizers["qwen2"]
    assert ensure_distinct_pad(tok, {tok.eos_token_id}) == "<|endoftext|>"
    with pytest.raises(TemplateError, match="add a pad token"):
        ensure_distinct_pad(tok, {tok.eos_token_id, tok.pad_token_id})


def test_packed_rows_end_every_sequence_on_end_of_turn(qwen_real_dir, sft_data_dir, tmp_path):
    from train.checks import check_assistant_labels
    from train.sft import build_trainer

    trainer = build_trainer(*tiny_args(qwen_real_dir, sft_data_dir, tmp_path, "--packing", "true",
                                       "--max_length", "4096"))
    rows = trainer.train_dataset
    assert len(rows) < 50 and "seq_lengths" in rows.column_names  # 50 conversations in fewer rows
    checked, cut = check_assistant_labels(rows, trainer.processing_class.convert_tokens_to_ids("<|im_end|>"))
    assert checked == 50 and cut == 0


def test_smollm2_is_matched_by_auto_and_masks_its_replies(smollm2_model_dir):
    # The CPU demo's student: its own template has no generation markers, so "auto" must find
    # the registered one, which renders identically and trains reply + <|im_end|> only.
    tok = AutoTokenizer.from_pretrained(smollm2_model_dir)
    assert not has_generation_markers(tok.chat_template)
    conv = HELLO + [{"role": "assistant", "content": "<index>\nKeywords: A\n</index>"}]
    template = resolve_training_template(tok, "auto", [conv])
    assert template == load_template("smollm2")
    ids, mask = assistant_token_mask(tok, conv, template)
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "I'm doing great. How can I help you today?<|im_end|><index>\nKeywords: A\n</index><|im_end|>"
