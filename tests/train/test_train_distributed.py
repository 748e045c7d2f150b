"""Distributed training, executed: `accelerate launch` with two CPU processes (gloo) on the tiny model.

    nox -s distributed                                    # builds the env (deepspeed, bitsandbytes), runs these
    pytest -q -m distributed tests/train/test_train_distributed.py --durations=0   # inside that env

Each run is the command a user types, with configs/ as shipped; the flags are only paths, step
counts, the per-device batch and the QLoRA switches. Cases: 2-process DDP (configs/accelerate/
cpu_multi.yaml), DeepSpeed ZeRO-2 and ZeRO-3 with LoRA, each compared with one single-process run
of the same global batch; a ZeRO-3 run resumed from its own checkpoint; QLoRA with an evaluation
between saves. The first DeepSpeed launch on a machine compiles a small op (~2 min, cached in
~/.cache/torch_extensions afterwards).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sft_helpers import ROOT, tiny_args

from train.checks import check_adapter

pytestmark = pytest.mark.distributed

STEPS = 4  # a checkpoint and an evaluation at steps 2 and 4

# Same global batch (1 process x 4 rows vs 2 x 2), seed and sampler: every run takes the same
# optimizer steps on the same rows, and only float32 summation order differs (padding to each
# rank's longest row, the all-reduce). Measured over 4 steps: losses and gradient norms agree to
# 2.5e-7 relative, adapter weights to 1.5e-5. What the tolerances must catch is far outside them:
# a run that saw other rows (losses differ in the second decimal), took another step (one Adam
# step moves a weight by up to the learning rate, 5e-3), or trained in bf16 (losses move by
# >= 1e-4 relative and gradient norms by >= 1e-3 on this model).
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 5e-4

SHARD_LINE = re.compile(r"ZeRO-3 rank (\d) of 2: holds (\d+) of (\d+) parameter elements; "
                        r"(\d+) of (\d+) tensors sharded, LoRA (\d+) of (\d+)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """The tiny model and demo SFT data, as `python -m train.tiny_run DIR` writes them."""
    from train.tiny_run import prepare

    return prepare(tmp_path_factory.mktemp("tiny"))


def train(tiny, out: Path, launcher: list[str], *flags: str) -> str:
    """Run train/sft.py on configs/train/tiny-cpu.yaml under `launcher`; returns its output."""
    cmd = [*launcher, "train/sft.py", "--config", "configs/train/tiny-cpu.yaml",
           "--model_name_or_path", str(tiny["model"]), "--dataset_path", str(tiny["sft"]), "--output_dir", str(out),
           "--max_steps", str(STEPS), "--save_steps", "2", "--eval_steps", "2", "--logging_steps", "1",
           "--disable_tqdm", "true", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{output[-6000:]}"
    return output


def accelerate(config: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"configs/accelerate/{config}",
            *args]


def step_logs(out: Path) -> dict[int, dict]:
    """Training log entries by step, from the trainer_state.json saved beside the adapter."""
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return {e["step"]: e for e in history if "loss" in e}


def lora_weights(model_dir: Path, adapter: Path) -> dict:
    """The adapter loaded back with PEFT onto the base model: its LoRA parameters by name."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter)
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    assert len(weights) == 28  # A and B on 7 projections x 2 layers
    assert max(float(w.abs().max()) for n, w in weights.items() if "lora_B" in n) > 0, "lora_B still zero"
    return weights


def assert_same_training(tiny, out: Path, reference: Path, steps=range(1, STEPS + 1)) -> None:
    """`out` took the same steps as `reference`: losses, gradient norms and token counts per step,
    and the final adapter's weights once loaded back with PEFT."""
    got, want = step_logs(out), step_logs(reference)
    for step in steps:
        # num_tokens is summed over processes: equal counts mean the same rows made each global
        # batch. It counts from this run's start (TRL does not restore it on resume), so it is
        # compared for whole runs only.
        if steps[0] == 1:
            assert got[step]["num_tokens"] == want[step]["num_tokens"], step
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=LOSS_RTOL), step
        assert got[step]["grad_norm"] == pytest.approx(want[step]["grad_norm"], rel=LOSS_RTOL), step
    check_adapter(out)
    a, b = lora_weights(tiny["model"], out), lora_weights(tiny["model"], reference)
    assert a.keys() == b.keys()
    worst = max(float((a[n] - b[n]).abs().max()) for n in a)
    assert worst <= WEIGHT_ATOL, f"adapter weights differ by {worst:.2e}"


@pytest.fixture(scope="module")
def single_run(tiny, tmp_path_factory) -> Path:
    """The reference: one process, per-device batch 4 (the config's own command)."""
    out = tmp_path_factory.mktemp("single")
    train(tiny, out, [sys.executable], "--per_device_train_batch_size", "4")
    return out


@pytest.fixture(scope="module")
def zero3_run(tiny, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("zero3")
    output = train(tiny, out, accelerate("deepspeed_zero3.yaml", "--num_processes", "2"),
                   "--per_device_train_batch_size", "2")
    return out, output


def test_ddp_two_processes_match_one(tiny, single_run, tmp_path):
    # No --num_processes: cpu_multi.yaml itself must start two. With one, the global batch would
    # be 2 rows and the token counts and losses would not match.
    train(tiny, tmp_path, accelerate("cpu_multi.yaml"), "--per_device_train_batch_size", "2")
    assert_same_training(tiny, tmp_path, single_run)


def test_deepspeed_zero2_matches_one_process(tiny, single_run, tmp_path):
    # The DeepSpeed config leaves precision to the training config (bf16: false here): a bf16 run
    # would miss the float32 reference's losses and gradient norms by 10-100 x LOSS_RTOL.
    train(tiny, tmp_path, accelerate("deepspeed_zero2.yaml", "--num_processes", "2"),
          "--per_device_train_batch_size", "2")
    assert_same_training(tiny, tmp_path, single_run)


def test_deepspeed_takes_bf16_from_the_training_config(tiny, single_run, tmp_path):
    """The GPU configs' case (bf16: true) through the same DeepSpeed config: the Trainer fills its
    "auto" precision with bf16, so DeepSpeed runs and saves the model in bf16."""
    from safetensors.torch import load_file

    train(tiny, tmp_path, accelerate("deepspeed_zero2.yaml", "--num_processes", "2"),
          "--per_device_train_batch_size", "2", "--bf16", "true", "--max_steps", "1", "--eval_strategy", "no")
    dtypes = {str(t.dtype) for t in load_file(str(tmp_path / "adapter_model.safetensors")).values()}
    assert dtypes == {"torch.bfloat16"}
    got, want = step_logs(tmp_path)[1], step_logs(single_run)[1]
    assert got["num_tokens"] == want["num_tokens"]
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-2) and got["loss"] != pytest.approx(want["loss"], rel=LOSS_RTOL)


def test_deepspeed_zero3_shards_parameters_and_matches_one_process(tiny, single_run, zero3_run):
    out, output = zero3_run
    reports = {int(m[0]): tuple(map(int, m[1:])) for m in SHARD_LINE.findall(output)}
    assert sorted(reports) == [0, 1], output[-3000:]
    for held, total, sharded, tensors, lora_sharded, lora_tensors in reports.values():
        # Each rank holds its half of the sharded tensors plus the few small ones DeepSpeed keeps
        # whole (under stage3_param_persistence_threshold, 10 x hidden = 640 elements here).
        assert held < 0.6 * total and sharded > tensors // 2
        assert lora_sharded > 0 and lora_tensors == 28
    # Saving gathered the shards: every checkpoint is a full, trained adapter.
    for ckpt in (out / "checkpoint-2", out / "checkpoint-4"):
        assert check_adapter(ckpt).parameters == 32768
    assert_same_training(tiny, out, single_run)


def test_deepspeed_zero3_resumes_from_its_checkpoint(tiny, zero3_run, tmp_path):
    uninterrupted, _ = zero3_run
    output = train(tiny, tmp_path, accelerate("deepspeed_zero3.yaml", "--num_processes", "2"),
                   "--per_device_train_batch_size", "2",
                   "--resume_from_checkpoint", str(uninterrupted / "checkpoint-2"))
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == STEPS
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-4"]
    assert len(SHARD_LINE.findall(output)) == 2  # still sharded after loading the checkpoint
    # Steps 3 and 4 are this run's: they match the uninterrupted run only if the weights, the
    # sharded optimizer state and the data position all came back.
    assert_same_training(tiny, tmp_path, uninterrupted, steps=range(3, STEPS + 1))


def test_qlora_trains_on_after_an_evaluation_between_saves(tiny, tmp_path):
    """bitsandbytes repacks 4-bit CPU weights for inference during an evaluation and unpacks them
    only on save; train/sft.py turns that off (disable_bnb_cpu_repack). Evaluating at step 2 and
    saving at 4 puts training steps between the two."""
    from bitsandbytes.functional import has_avx512bf16

    output = train(tiny, tmp_path, [sys.executable], "--save_steps", "4", "--load_in_4bit", "true",
                   "--bnb_4bit_quant_type", "nf4", "--use_bnb_nested_quant", "true")
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    assert [e["step"] for e in history if "eval_loss" in e] == [2, 4]
    losses = step_logs(tmp_path)
    assert sorted(losses) == [1, 2, 3, 4] and losses[4]["loss"] < losses[1]["loss"]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-4"]
    check_adapter(tmp_path)
    if has_avx512bf16():  # the CPUs where the repack, and so the crash, happens
        assert "CPU inference repacking off on 14 4-bit layers" in output


def test_without_the_workaround_bitsandbytes_still_breaks_training_after_an_evaluation(tiny, tmp_path, monkeypatch):
    """Why disable_bnb_cpu_repack exists; when this fails, bitsandbytes has fixed its CPU repack
    and the workaround can go. In process: the same run as above with the workaround taken out."""
    from bitsandbytes.functional import has_avx512bf16

    import train.sft

    if not has_avx512bf16():
        pytest.skip("bitsandbytes repacks 4-bit CPU weights only on CPUs with AVX512-BF16")
    monkeypatch.setattr(train.sft, "disable_bnb_cpu_repack", lambda model, bnb: 0)
    args = tiny_args(tiny["model"], tiny["sft"], tmp_path, "--max_steps", "3", "--eval_steps", "2",
                     "--save_steps", "4", "--load_in_4bit", "true", "--bnb_4bit_quant_type", "nf4",
                     "--use_bnb_nested_quant", "true", "--disable_tqdm", "true")
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad is being used in an in-place"):
        train.sft.main(*args)
