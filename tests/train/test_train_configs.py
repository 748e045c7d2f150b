"""configs/train/*.yaml parse into the SFT script's dataclasses (unknown keys are errors) and say
how to launch them; configs/accelerate/*.yaml load with accelerate's own loader."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sft_helpers import ROOT, TINY_CONFIG

from train.sft import parse_args, validate_config

TRAIN_CONFIGS = sorted((ROOT / "configs" / "train").glob("*.yaml"))
ACCELERATE_CONFIGS = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))
GPU_CONFIGS = [p for p in TRAIN_CONFIGS if p.name != "tiny-cpu.yaml"]
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_the_expected_configs_exist():
    assert {p.name for p in TRAIN_CONFIGS} == {"qwen2.5-7b-lora.yaml", "qwen2.5-7b-qlora.yaml", "llama3.1-8b-lora.yaml",
                                               "llama3.1-8b-qlora.yaml", "tiny-cpu.yaml"}
    assert {p.stem for p in ACCELERATE_CONFIGS} == {"single_gpu", "multi_gpu", "deepspeed_zero2", "deepspeed_zero3", "cpu"}


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: p.name)
def test_train_config_validates_and_starts_with_its_launch_command(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and f"--config configs/train/{path.name}" in first
    script_args, training_args, model_args = validate_config(path)
    assert model_args.use_peft and model_args.lora_r == 16
    assert sorted(model_args.lora_target_modules) == sorted(PROJECTIONS)
    assert training_args.assistant_only_loss and training_args.eval_strategy == "steps"
    assert training_args.save_strategy == "steps" and training_args.save_steps % training_args.eval_steps == 0
    assert script_args.dataset_test_split == "validation"


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.name)
def test_gpu_configs_state_their_memory_target_and_launcher(path):
    text = path.read_text()
    _, training_args, model_args = validate_config(path)
    assert training_args.max_length == 4096 and training_args.bf16 and training_args.gradient_checkpointing
    if "qlora" in path.name:
        assert model_args.load_in_4bit and model_args.bnb_4bit_quant_type == "nf4"
        assert "one 24 GB GPU" in text and "configs/accelerate/single_gpu.yaml" in text.splitlines()[0]
    else:
        assert not model_args.load_in_4bit and model_args.dtype == "bfloat16"
        assert "one 80 GB GPU per process" in text and "deepspeed_zero2.yaml" in text.splitlines()[0]


def test_qlora_needs_bitsandbytes_only_to_train():
    """Validating a QLoRA config never imports bitsandbytes; training asks for it by name."""
    import importlib.util

    from train.sft import require_bitsandbytes

    validate_config(ROOT / "configs" / "train" / "qwen2.5-7b-qlora.yaml")
    assert "bitsandbytes" not in sys.modules
    if importlib.util.find_spec("bitsandbytes") is None:
        with pytest.raises(ImportError, match=r"load_in_4bit needs bitsandbytes.*\[gpu\]"):
            require_bitsandbytes()


def test_unknown_yaml_key_is_an_error_naming_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY_CONFIG.read_text() + "learning_rat: 1.0e-4\n")
    with pytest.raises(ValueError, match="bad.yaml.*learning_rat"):
        validate_config(bad)


def test_flags_override_the_yaml():
    script_args, training_args, model_args = parse_args(["--config", str(TINY_CONFIG), "--learning_rate", "1e-4",
                                                         "--lora_r", "8", "--dataset_path", "elsewhere"])
    assert training_args.learning_rate == 1e-4 and model_args.lora_r == 8 and script_args.dataset_path == "elsewhere"
    assert training_args.max_steps == 40  # untouched keys keep the YAML's value


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_config_loads_with_accelerate(path):
    from accelerate.commands.config.config_args import load_config_from_file

    assert path.read_text().startswith("# accelerate launch --config_file configs/accelerate/" + path.name)
    cfg = load_config_from_file(str(path))
    assert cfg.mixed_precision == ("no" if path.stem == "cpu" else "bf16")
    if path.stem.startswith("deepspeed"):
        assert cfg.deepspeed_config["zero_stage"] == int(path.stem[-1])
    if path.stem == "deepspeed_zero3":
        assert cfg.deepspeed_config["zero3_save_16bit_model"] is True  # stage3_gather_16bit_weights_on_model_save


def test_accelerate_launch_runs_the_script_file(qwen_real_dir, sft_data_dir, tmp_path):
    """The documented launch, on the CPU accelerate config: train/sft.py run as a file."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate/cpu.yaml",
           "train/sft.py", "--config", "configs/train/tiny-cpu.yaml", "--model_name_or_path", str(qwen_real_dir),
           "--dataset_path", str(sft_data_dir), "--output_dir", str(tmp_path), "--max_steps", "2",
           "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "adapter_model.safetensors").is_file()
