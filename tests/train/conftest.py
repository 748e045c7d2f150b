"""Fixtures for the train tests: tiny models carrying the real chat templates, demo SFT data,
and one tiny training run shared by the end-to-end, checkpoint and merge tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from sft_helpers import model_with_real_template, tiny_args


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny models gain nothing from threads, and on a small shared machine oversubscribed
    torch threads make each tiny matmul ~50x slower; restored after each module."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def qwen_real_dir(tmp_path_factory) -> Path:
    return model_with_real_template(tmp_path_factory.mktemp("real_qwen2"), "qwen2")


@pytest.fixture(scope="session")
def llama_real_dir(tmp_path_factory) -> Path:
    return model_with_real_template(tmp_path_factory.mktemp("real_llama"), "llama", pad_is_eos=True)


@pytest.fixture(scope="session")
def sft_data_dir(tmp_path_factory) -> Path:
    """The demo SFT data: a DatasetDict (train, validation) plus sft_train/sft_validation.jsonl."""
    from train.tiny_run import write_demo_sft

    return write_demo_sft(tmp_path_factory.mktemp("sft"))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, qwen_real_dir, sft_data_dir):
    """One LoRA SFT run of the tiny Qwen2 with the real Qwen2.5 template: 20 steps, a checkpoint
    and a validation loss every 10 steps. Returns (trainer, output dir)."""
    from train.sft import main

    out = tmp_path_factory.mktemp("tiny_run")
    args = tiny_args(qwen_real_dir, sft_data_dir, out, "--max_steps", "20", "--save_steps", "10",
                     "--eval_steps", "10", "--logging_steps", "2", "--per_device_train_batch_size", "2")
    return main(*args), out
