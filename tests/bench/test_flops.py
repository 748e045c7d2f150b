"""bench/flops.py: the model FLOPs of a batch count its real tokens, padded or packed alike."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.flops import Shape, gpu_peak_tflops, sequence_lengths, training_flops  # noqa: E402


def test_padded_and_packed_batches_of_the_same_examples_count_the_same_flops():
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    examples = [{"input_ids": list(range(3, 3 + n)), "labels": [-100] * (n // 2) + list(range(3 + n // 2, 3 + n))}
                for n in (23, 9, 31)]
    padded = DataCollatorForLanguageModeling(pad_token_id=0)(examples)
    packed = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples)
    assert sequence_lengths(padded) == sequence_lengths(packed) == [23, 9, 31]
    shape = Shape(body_params=1000, head=500, layers=2, hidden=8)
    assert training_flops(shape, [padded]) == training_flops(shape, [packed]) > 4 * 1000 * 63
    assert training_flops(shape, [padded], full=True) > training_flops(shape, [padded])


def test_gpu_peaks_by_device_name():
    assert gpu_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and gpu_peak_tflops("NVIDIA H200") == 989.0
    assert gpu_peak_tflops("Some Future Accelerator") is None
