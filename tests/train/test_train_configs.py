"""configs/train/*.yaml parse into the SFT script's dataclasses (unknown keys are errors) and say
how to launch them; configs/accelerate/*.yaml load with accelerate's own loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sft_helpers import ROOT, TINY_CONFIG

from train.sft import parse_args, validate_config

TRAIN_CONFIGS = sorted((ROOT / "configs" / "train").glob("*.yaml"))
ACCELERATE_CONFIGS = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))
GPU_CONFIGS = [p for p in TRAIN_CONFIGS if not p.name.endswith("-cpu.yaml")]
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_the_expected_configs_exist():
    assert {p.name for p in TRAIN_CONFIGS} == {"qwen2.5-7b-lora.yaml", "qwen2.5-7b-qlora.yaml", "llama3.1-8b-lora.yaml",
                                               "llama3.1-8b-qlora.yaml", "tiny-cpu.yaml",
                                               "smollm2-135m-benchmark-cpu.yaml"}
    assert {p.stem for p in ACCELERATE_CONFIGS} == {"single_gpu", "multi_gpu", "deepspeed_zero2", "deepspeed_zero3", "cpu",
                                                    "cpu_multi"}


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
    assert training_args.max_length == 4096 and training_args.bf16
    if "qlora" in path.name:
        assert model_args.load_in_4bit and model_args.bnb_4bit_quant_type == "nf4"
        assert training_args.gradient_checkpointing  # 24 GB needs it
        assert "one 24 GB GPU" in text and "configs/accelerate/single_gpu.yaml" in text.splitlines()[0]
    else:
        assert not model_args.load_in_4bit and model_args.dtype == "bfloat16"
        assert "one 80 GB GPU per process" in text and "deepspeed_zero2.yaml" in text.splitlines()[0]
        # The throughput knobs of an 80 GB LoRA run: padding-free packing on flash-attention's varlen
        # path, no gradient checkpointing, Liger as a named option.
        assert training_args.packing and training_args.packing_strategy == "bfd"
        assert model_args.attn_implementation == "flash_attention_2"
        assert not training_args.gradient_checkpointing and training_args.use_liger_kernel is False
        assert "use_liger_kernel:" in text and "bench/gpu_check.py" in text


def test_qlora_needs_bitsandbytes_only_to_train():
    """A QLoRA config validates without bitsandbytes; training asks for it by name. Our code imports
    it in one place, require_bitsandbytes. Where it is installed (the gpu extra) peft imports it
    whenever peft loads, so sys.modules cannot tell whether validating needed it; there the claim
    that matters is that training gets it."""
    import ast
    import importlib.util

    from train.sft import require_bitsandbytes

    validate_config(ROOT / "configs" / "train" / "qwen2.5-7b-qlora.yaml")
    if importlib.util.find_spec("bitsandbytes") is None:
        assert "bitsandbytes" not in sys.modules
        with pytest.raises(ImportError, match=r"load_in_4bit needs bitsandbytes.*\[gpu\]"):
            require_bitsandbytes()
    else:
        assert require_bitsandbytes().__name__ == "bitsandbytes"
    for source in (ROOT / "train").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "bitsandbytes" for n in names), f"{source.name}:{node.lineno}"


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
    # Precision is the training config's (bf16/fp16): an accelerate mixed_precision would override a
    # float32 config, or clash with it under DeepSpeed.
    assert cfg.mixed_precision in (None, "no")
    if path.stem.startswith("deepspeed"):
        ds = cfg.deepspeed_config
        if "deepspeed_config_file" in ds:
            ds_json = json.loads((ROOT / ds["deepspeed_config_file"]).read_text())
            stage = ds_json["zero_optimization"]["stage"]
            # the Trainer fills "auto" from the training config
            for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                        "gradient_clipping"):
                assert ds_json[key] == "auto", key
            assert ds_json["bf16"]["enabled"] == ds_json["fp16"]["enabled"] == "auto"
        else:
            stage = ds["zero_stage"]
        assert stage == int(path.stem[-1])
    if path.stem == "deepspeed_zero3":
        zero = ds_json["zero_optimization"]
        assert zero["stage3_gather_16bit_weights_on_model_save"] is True  # else the adapter saves empty
        assert zero["stage3_param_persistence_threshold"] == "auto"  # 10 x hidden: small models shard too
    if path.stem == "cpu_multi":
        # torchrun starts num_processes workers only for a non-CPU config; use_cpu: true gets one process
        assert cfg.distributed_type == "MULTI_GPU" and cfg.num_processes == 2 and cfg.use_cpu is False


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


@pytest.mark.parametrize("flags, message", [
    (["--use_peft", "false", "--init_adapter", "somewhere"], "init_adapter needs use_peft: true"),
    (["--use_peft", "false", "--load_in_4bit", "true"], "a quantized base can only be trained through an adapter"),
    (["--answer_repeats", "0"], "answer_repeats=0; it must be 1 or more"),
])
def test_the_launch_path_checks_the_rules_across_argument_groups(flags, message, tmp_path):
    from train.sft import run

    # run() refuses before loading anything: no model, no data, no output folder needed
    with pytest.raises(ValueError, match=f"tiny-cpu.yaml: {message}"):
        run(["--config", str(TINY_CONFIG), "--output_dir", str(tmp_path / "out"), *flags])
    assert not (tmp_path / "out").exists()
