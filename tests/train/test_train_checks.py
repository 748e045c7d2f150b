"""The empty-adapter check fails loudly on untrained, ZeRO-3-style empty and missing adapters,
passes a trained one, and stops a training run whose checkpoint holds an untrained adapter."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from sft_helpers import ROOT, tiny_args

from train.checks import ADAPTER_FILE, AdapterCheckError, check_adapter, check_zero3_gather, check_zero3_quantized

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture()
def peft_model(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS))


def test_untrained_adapter_is_refused(peft_model, tmp_path):
    peft_model.save_pretrained(tmp_path)  # lora_B is all zero at init
    with pytest.raises(AdapterCheckError, match="every lora_B tensor is all zero"):
        check_adapter(tmp_path)


def test_trained_adapter_passes(peft_model, tmp_path):
    ids = torch.arange(2, 40).unsqueeze(0)
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    peft_model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    peft_model.save_pretrained(tmp_path)
    report = check_adapter(tmp_path)
    assert report.tensors == 2 * len(TARGETS) * 2  # A and B per target module, two layers
    assert report.lora_b_max_abs > 0 and report.parameters > 0


def test_zero3_style_empty_tensors_are_refused(peft_model, tmp_path):
    """What a ZeRO-3 save without gathering writes: the right names, zero-size placeholders."""
    peft_model.save_pretrained(tmp_path)
    names = load_file(str(tmp_path / ADAPTER_FILE))
    save_file({k: torch.empty(0) for k in names}, str(tmp_path / ADAPTER_FILE))
    with pytest.raises(AdapterCheckError, match="empty.*stage3_gather_16bit_weights_on_model_save"):
        check_adapter(tmp_path)


def test_missing_or_tensorless_adapter_is_refused(tmp_path):
    with pytest.raises(AdapterCheckError, match="no adapter_model.safetensors"):
        check_adapter(tmp_path)
    save_file({}, str(tmp_path / ADAPTER_FILE))
    with pytest.raises(AdapterCheckError, match="no tensors"):
        check_adapter(tmp_path)


def _plugin(path, **override):
    """accelerate's DeepSpeedPlugin as an `accelerate launch` of this config builds it: from the
    DeepSpeed JSON it names, or from its deepspeed_config keys."""
    from accelerate.utils import DeepSpeedPlugin

    ds = yaml.safe_load(path.read_text())["deepspeed_config"]
    if "deepspeed_config_file" in ds:
        config = json.loads((ROOT / ds["deepspeed_config_file"]).read_text())
        config["zero_optimization"].update(override)
        return DeepSpeedPlugin(hf_ds_config=config)
    ds = ds | override
    ds.pop("deepspeed_multinode_launcher")  # a launcher setting, not the plugin's
    return DeepSpeedPlugin(**ds)


def test_zero3_config_gathers_weights_and_a_config_that_does_not_is_refused():
    zero3 = ROOT / "configs" / "accelerate" / "deepspeed_zero3.yaml"
    check_zero3_gather(_plugin(zero3))
    check_zero3_gather(_plugin(ROOT / "configs" / "accelerate" / "deepspeed_zero2.yaml"))
    check_zero3_gather(None)
    with pytest.raises(AdapterCheckError, match="stage3_gather_16bit_weights_on_model_save"):
        check_zero3_gather(_plugin(zero3, stage3_gather_16bit_weights_on_model_save=False))


def test_qlora_under_zero3_needs_the_quant_storage_of_its_dtype():
    zero3, zero2 = (_plugin(ROOT / "configs" / "accelerate" / f"deepspeed_zero{n}.yaml") for n in (3, 2))
    check_zero3_quantized(zero3, True, "bfloat16", "bfloat16")
    check_zero3_quantized(zero2, True, None, "bfloat16")  # ZeRO-2 does not shard the weights
    check_zero3_quantized(zero3, False, None, "bfloat16")  # plain LoRA
    check_zero3_quantized(None, True, None, "bfloat16")
    with pytest.raises(ValueError, match="bnb_4bit_quant_storage=None, dtype=bfloat16"):
        check_zero3_quantized(zero3, True, None, "bfloat16")


def test_a_run_that_saves_an_untrained_adapter_fails_at_the_checkpoint(qwen_real_dir, sft_data_dir, tmp_path):
    from train.sft import main

    args = tiny_args(qwen_real_dir, sft_data_dir, tmp_path, "--max_steps", "1", "--save_steps", "1",
                     "--learning_rate", "0.0", "--eval_strategy", "no")
    with pytest.raises(AdapterCheckError, match="checkpoint-1.*all zero"):
        main(*args)
