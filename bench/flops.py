"""Model FLOPs and hardware peaks for the benches' utilisation figures (MFU), counted one way.

    shape = Shape.of(model)
    mfu = training_flops(shape, batches) / seconds / peak_flops

Counted the usual way and only for useful tokens: training 4 N per real token for a frozen base
with LoRA (forward + input gradients; 6 N when all weights train) plus the LM head's 4 V d on
labelled positions (TRL scores only those), plus causal attention; N = the non-embedding
parameters, V d = the LM head. A padded batch's sequences are its attention-mask rows; a packed
(padding-free) one's are the runs of its position_ids, each starting at 0.
"""

from __future__ import annotations

import dataclasses
import time

import torch

# Dense bf16 tensor-core peaks by device name (without sparsity), from the vendors' data sheets.
GPU_BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}


@dataclasses.dataclass
class Shape:
    body_params: int  # non-embedding, non-head parameters
    head: int  # vocab x hidden
    layers: int
    hidden: int

    @classmethod
    def of(cls, model) -> "Shape":
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        base = getattr(base, "module", base)  # a DeepSpeed / DDP wrapper
        emb = base.get_input_embeddings().weight
        body = sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n) - emb.numel()
        head = base.get_output_embeddings().weight
        if head.data_ptr() != emb.data_ptr():
            body -= head.numel()
        return cls(body, head.numel(), base.config.num_hidden_layers, base.config.hidden_size)

    def attention(self, context: float) -> float:
        """Forward FLOPs per token of attention over `context` earlier tokens (QK and PV)."""
        return 4 * self.layers * self.hidden * context


def sequence_lengths(batch: dict) -> list[int]:
    """The real (non-padding) length of every sequence in a collated batch, padded or packed."""
    if "attention_mask" in batch:
        return [int(n) for n in batch["attention_mask"].sum(dim=1).tolist()]
    lengths = []
    for row in batch["position_ids"]:
        starts = (row == 0).nonzero().flatten().tolist() + [len(row)]
        lengths += [b - a for a, b in zip(starts, starts[1:])]
    return lengths


def training_flops(shape: Shape, batches: list[dict], full: bool = False) -> float:
    total = 0.0
    for b in batches:
        labelled = int((b["labels"][:, 1:] != -100).sum())
        for n in sequence_lengths(b):
            total += (6 if full else 4) * shape.body_params * n + 3 * shape.attention(n / 2) * n
        total += (6 if full else 4) * shape.head * labelled
    return total


def matmul_gflops(dtype: torch.dtype, n: int = 2048, reps: int = 12, device: str = "cpu") -> float:
    """A square matmul's GFLOP/s: the ceiling the model FLOPs are measured against on a CPU."""
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    if device != "cpu":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device != "cpu":
        torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9


def gpu_peak_tflops(name: str) -> float | None:
    """The bf16 dense peak of a GPU by its torch device name, None when it is not in the table."""
    for key, tflops in GPU_BF16_PEAK_TFLOPS.items():
        if key in name:
            return tflops
    return None
