"""Training at the CPU's speed: the LM head on labelled positions only, padding-free batches that
keep their examples apart, and the demo's precision setting as train/sft.py keys."""

from __future__ import annotations

import pytest
import torch
from sft_helpers import tiny_args


def _loss_and_grads(trainer, batch):
    model = trainer.model
    model.train()
    model.zero_grad()
    loss = trainer.compute_loss(model, dict(batch))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.item(), grads


def test_the_lm_head_on_labelled_positions_gives_the_same_loss_and_gradients(qwen_real_dir, sft_data_dir, tmp_path):
    import trl.trainer.utils as trl_utils

    from train.sft import build_trainer, labelled_positions_only

    trainer = build_trainer(*tiny_args(qwen_real_dir, sft_data_dir, tmp_path, "--per_device_train_batch_size", "4"))
    batch = next(iter(trainer.get_train_dataloader()))
    labelled = int((batch["labels"][:, 1:] != -100).sum())
    assert 0 < labelled < batch["labels"][:, 1:].numel() // 2  # assistant-only loss: most positions carry no label

    gate = trl_utils._use_triton
    full_loss, full_grads = _loss_and_grads(trainer, batch)
    with labelled_positions_only(torch.device("cpu")) as active:
        assert active and trl_utils._use_triton(torch.device("cpu"))
        loss, grads = _loss_and_grads(trainer, batch)
    assert trl_utils._use_triton is gate  # restored

    assert loss == pytest.approx(full_loss, rel=1e-6)
    assert grads.keys() == full_grads.keys() and grads
    for name, g in grads.items():
        torch.testing.assert_close(g, full_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    with labelled_positions_only(torch.device("cpu"), enabled=False) as active:
        assert not active and trl_utils._use_triton is gate


def test_adapter_inputs_left_uncast_under_autocast_give_the_same_loss_and_gradients(qwen_real_dir, sft_data_dir,
                                                                                      tmp_path):
    from peft.tuners.tuners_utils import BaseTunerLayer

    from train.sft import adapter_inputs_uncast, build_trainer

    trainer = build_trainer(*tiny_args(qwen_real_dir, sft_data_dir, tmp_path, "--per_device_train_batch_size", "4",
                                       "--dtype", "bfloat16", "--bf16", "true"))
    model = trainer.model
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}  # the adapter
    batch = next(iter(trainer.get_train_dataloader()))

    def under_autocast():
        with trainer.accelerator.autocast():
            return _loss_and_grads(trainer, batch)

    cast_loss, cast_grads = under_autocast()
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    with adapter_inputs_uncast(model, trainer.args) as active:
        assert active and layers and not any(m.cast_input_dtype_enabled for m in layers)
        loss, grads = under_autocast()
    assert all(m.cast_input_dtype_enabled for m in layers)  # restored

    assert loss == cast_loss
    assert grads.keys() == cast_grads.keys() and grads
    for name, g in grads.items():
        assert torch.equal(g, cast_grads[name]), name
    trainer.args.bf16 = False  # no autocast: the adapter's float32 matmul needs its input cast
    with adapter_inputs_uncast(model, trainer.args) as active:
        assert not active and all(m.cast_input_dtype_enabled for m in layers)


def test_length_grouped_batches_carry_less_padding_than_random_ones(qwen_real_dir, sft_data_dir, tmp_path):
    """train_sampling_strategy (a benchmark-recipe option) reaches the Trainer's sampler via train/sft.py."""
    from train.sft import build_trainer

    def epoch_padding(strategy):
        trainer = build_trainer(*tiny_args(qwen_real_dir, sft_data_dir, tmp_path / strategy,
                                           "--per_device_train_batch_size", "2", "--train_sampling_strategy", strategy))
        batches = list(trainer.get_train_dataloader())
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        assert real == sum(len(ids) for ids in trainer.train_dataset["input_ids"])  # one epoch, every chat once
        return 1 - real / sum(b["input_ids"].numel() for b in batches)

    assert epoch_padding("group_by_length") < epoch_padding("random")


def _tiny_causal_lm(model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()


def test_padding_free_batches_keep_examples_apart_and_match_the_padded_loss(qwen_real_dir):
    """TRL's padding-free collator concatenates a batch into one row with per-example position_ids
    and no attention mask; transformers then builds a block-diagonal causal mask from the
    position_ids (sdpa on a CPU; flash-attention's varlen path on a GPU reads cu_seq_lens)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    model = _tiny_causal_lm(qwen_real_dir)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    lengths = [23, 9, 31]
    examples = []
    for n in lengths:
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        labels = [-100] * (n // 2) + ids[n // 2:]  # a prompt without labels, then the reply
        examples.append({"input_ids": ids, "labels": labels})

    padded = DataCollatorForLanguageModeling(pad_token_id=0)(examples)
    packed = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples)
    assert "attention_mask" not in packed and packed["input_ids"].shape == (1, sum(lengths))
    assert int((padded["attention_mask"] == 0).sum()) == 31 * 3 - sum(lengths)  # the padding it saves

    with torch.no_grad():
        packed_logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"],
                              use_cache=False).logits[0]
        alone = [model(input_ids=torch.tensor([e["input_ids"]])).logits[0] for e in examples]
        # Each example's logits inside the packed row are its logits computed alone.
        starts = [0, lengths[0], lengths[0] + lengths[1]]
        for start, n, ref in zip(starts, lengths, alone):
            torch.testing.assert_close(packed_logits[start:start + n], ref, rtol=1e-4, atol=1e-5)

        # No example sees another: changing the first example leaves the later ones' logits as they were.
        changed = packed["input_ids"].clone()
        changed[0, :lengths[0]] = torch.randint(3, vocab, (lengths[0],), generator=g)
        after = model(input_ids=changed, position_ids=packed["position_ids"], use_cache=False).logits[0]
        assert not torch.allclose(after[:lengths[0]], packed_logits[:lengths[0]])
        torch.testing.assert_close(after[lengths[0]:], packed_logits[lengths[0]:], rtol=0, atol=1e-6)

        # The loss over the same labelled tokens: padded batch vs one packed row.
        padded_loss = model(**padded).loss
        packed_loss = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"],
                            labels=packed["labels"], use_cache=False).loss
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_peft, precision, dtype, bf16", [
    (True, "float32", "float32", False),
    (True, "bfloat16", "bfloat16", True),  # a frozen bf16 base under autocast; the adapter stays float32
    (False, "bfloat16", "float32", True),  # full fine-tuning keeps float32 master weights under autocast
])
def test_the_demos_precision_becomes_train_sft_keys(use_peft, precision, dtype, bf16, tmp_path):
    from pipeline.demo_config import load_demo_config
    from pipeline.demo_train import train_yaml

    cfg = load_demo_config(None, [f"train.use_peft={str(use_peft).lower()}", f"train.precision={precision}"])
    settings = train_yaml(cfg, "smollm2-135m", tmp_path)
    assert (settings["dtype"], settings["bf16"]) == (dtype, bf16)


def test_an_unknown_precision_is_refused_at_load():
    from kair_runtime.config import ConfigError
    from pipeline.demo_config import load_demo_config

    with pytest.raises(ConfigError, match="train.precision: 'float16'; choose one of float32, bfloat16"):
        load_demo_config(None, ["train.precision=float16"])
