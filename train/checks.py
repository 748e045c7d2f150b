"""Checks that make silent training failures loud.

- `check_adapter`: a saved LoRA adapter has tensors, none empty, and lora_B has moved from its
  zero init. Under DeepSpeed ZeRO-3 a save without gathering writes zero-size placeholders (the
  shards live on other ranks), and the adapter loads fine and does nothing; this catches it.
- `check_assistant_labels`: after TRL tokenizes the data, trained labels end on the end-of-turn
  token, so the model learns to stop.
- `check_zero3_gather`: a ZeRO-3 run must gather 16-bit weights on save.
- `AdapterCheckCallback`: runs `check_adapter` on every checkpoint as it is written.
- `ResumeCadenceCallback`: a resumed run logs, evaluates and saves at this run's steps, not the
  checkpoint's (the Trainer restores them from trainer_state.json: transformers PR #36303).
- `FinishedScheduleCallback`: a run resumed from a checkpoint at max_steps trains no more (the
  Trainer would train one step past it).
- `Zero3ShardReportCallback`: under ZeRO-3, logs how much of the model each rank really holds. A
  parameter under DeepSpeed's persistence threshold stays whole on every rank, so a ZeRO-3 run
  can shard nothing at all (a small model under DeepSpeed's default threshold does exactly that).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from transformers import TrainerCallback

log = logging.getLogger(__name__)

ADAPTER_FILE = "adapter_model.safetensors"


class AdapterCheckError(RuntimeError):
    pass


@dataclass
class AdapterReport:
    path: str
    tensors: int
    parameters: int
    lora_b_max_abs: float  # 0.0 means untrained (lora_B starts at zero)


def check_adapter(path: str | Path) -> AdapterReport:
    """Raise AdapterCheckError unless the adapter in `path` holds trained, non-empty LoRA weights."""
    from safetensors.torch import load_file

    path = Path(path)
    file = path / ADAPTER_FILE
    if not file.is_file():
        raise AdapterCheckError(f"{path}: no {ADAPTER_FILE}; the adapter was not saved in PEFT safetensors format")
    tensors = load_file(str(file))
    if not tensors:
        raise AdapterCheckError(f"{file}: the adapter has no tensors")
    empty = sorted(k for k, t in tensors.items() if t.numel() == 0)
    if empty:
        raise AdapterCheckError(
            f"{file}: {len(empty)} of {len(tensors)} tensors are empty (e.g. {empty[0]}). Under DeepSpeed "
            "ZeRO-3 this means the weights were saved without gathering: set stage3_gather_16bit_weights_on_model_save: "
            "true in the DeepSpeed config (zero3_save_16bit_model: true in an accelerate config without a JSON)")
    bad = sorted(k for k, t in tensors.items() if not t.float().isfinite().all())
    if bad:
        raise AdapterCheckError(f"{file}: non-finite values in {len(bad)} tensors (e.g. {bad[0]}): training diverged")
    lora_b = {k: t for k, t in tensors.items() if "lora_B" in k}
    if not lora_b:
        raise AdapterCheckError(f"{file}: no lora_B tensors; not a LoRA adapter ({sorted(tensors)[:3]} ...)")
    b_max = max(float(t.float().abs().max()) for t in lora_b.values())
    if b_max == 0.0:
        raise AdapterCheckError(
            f"{file}: every lora_B tensor is all zero, so the adapter is exactly the base model: it is "
            "untrained (no optimizer step with a non-zero learning rate before this save) or its weights "
            "were lost in saving (ZeRO-3 without gathering)")
    return AdapterReport(path=str(path), tensors=len(tensors),
                         parameters=sum(t.numel() for t in tensors.values()), lora_b_max_abs=b_max)


class AdapterCheckCallback(TrainerCallback):
    """Checks each checkpoint's adapter right after the Trainer writes it (main process only)."""

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            report = check_adapter(Path(args.output_dir) / f"checkpoint-{state.global_step}")
            log.info("adapter check passed: %s", report)
        return control


class ResumeCadenceCallback(TrainerCallback):
    """Re-applies this run's logging/eval/save steps after the Trainer restored a checkpoint's state.

    Loading trainer_state.json on resume brings back the earlier run's cadence, so `--save_steps 50`
    on a run resumed from a `save_steps 30` checkpoint would silently save every 30 steps."""

    def on_train_begin(self, args, state, control, **kwargs):
        state.compute_steps(args, state.max_steps)
        return control


class ScheduleDone(Exception):
    """A resumed run's checkpoint is at max_steps already: nothing is left to train."""


class FinishedScheduleCallback(TrainerCallback):
    """Stops a run resumed from a checkpoint that already reached max_steps before its first step.

    transformers (5.25) checks max_steps only after a step, so resuming from the final checkpoint
    (a run killed while saving the final model) would train one step past the schedule and save
    that. train.sft.main catches ScheduleDone and finishes the run as the last step would have."""

    def on_step_begin(self, args, state, control, **kwargs):  # after every on_train_begin has run
        if 0 < state.max_steps <= state.global_step:
            raise ScheduleDone(state.global_step)
        return control


def check_assistant_labels(dataset, eot_id: int, sample: int = 256) -> tuple[int, int]:
    """Check TRL's prepared `labels` on up to `sample` rows: every trained span must end on the
    end-of-turn token. A packed row holds several sequences (its `seq_lengths`); each is checked.

    Returns (sequences checked, sequences whose trained tokens do not end on the end-of-turn
    token; those were cut by max_length). Raises when none ends on it: then the template, not
    truncation, is at fault.
    """
    checked = cut = 0
    for row in dataset.select(range(min(sample, len(dataset)))):
        labels = row["labels"]
        bounds, start = [], 0
        for n in row.get("seq_lengths") or [len(labels)]:
            bounds.append((start, start + n))
            start += n
        for lo, hi in bounds:
            trained = [t for t in labels[lo:hi] if t != -100]
            if not trained:
                continue
            checked += 1
            cut += trained[-1] != eot_id
    if checked and cut == checked:
        raise AdapterCheckError(
            f"none of {checked} training sequences has its end-of-turn token (id {eot_id}) as the last "
            "trained label: the end-of-turn token is masked out, so the model would never learn to stop")
    if cut:
        log.warning("%d of %d checked training sequences were truncated by max_length before their "
                    "end-of-turn token", cut, checked)
    return checked, cut


@dataclass
class Zero3ShardReport:
    rank: int
    world_size: int
    held: int  # parameter elements this rank holds between steps
    total: int  # parameter elements of the whole model
    sharded: int  # tensors of which this rank holds only its partition
    tensors: int
    lora_sharded: int
    lora_tensors: int

    def __str__(self) -> str:
        return (f"ZeRO-3 rank {self.rank} of {self.world_size}: holds {self.held} of {self.total} parameter "
                f"elements; {self.sharded} of {self.tensors} tensors sharded, LoRA {self.lora_sharded} of "
                f"{self.lora_tensors}")


def zero3_shard_report(model, rank: int, world_size: int) -> Zero3ShardReport:
    """What this rank holds of a ZeRO-3 model outside a forward pass. DeepSpeed frees a sharded
    parameter's full data after use (`param.data` is empty) and keeps its partition in
    `param.ds_tensor`; a persistent one (`ds_persist`, under stage3_param_persistence_threshold)
    keeps its full data on every rank."""
    held = total = sharded = tensors = lora_sharded = lora_tensors = 0
    for name, p in model.named_parameters():
        if not hasattr(p, "ds_numel"):
            raise AdapterCheckError(f"{name} is not a ZeRO-3 parameter: the model was not partitioned")
        is_sharded = not p.ds_persist and p.data.numel() == 0 and p.ds_tensor.numel() < p.ds_numel
        held += p.ds_tensor.numel() if is_sharded else p.ds_numel
        total += p.ds_numel
        tensors += 1
        sharded += is_sharded
        if "lora_" in name:
            lora_tensors += 1
            lora_sharded += is_sharded
    return Zero3ShardReport(rank, world_size, held, total, sharded, tensors, lora_sharded, lora_tensors)


class Zero3ShardReportCallback(TrainerCallback):
    """Logs `zero3_shard_report` on every rank after this run's first optimizer step: by then
    DeepSpeed has partitioned the adapter too (it does so when the engine is built, after the
    base model was loaded already sharded under zero.Init)."""

    def __init__(self):
        self.reported = False

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if not self.reported:
            self.reported = True
            log.info("%s", zero3_shard_report(model, args.process_index, args.world_size))
        return control


def check_zero3_quantized(plugin, load_in_4bit: bool, quant_storage: str | None, dtype: str | None) -> None:
    """ZeRO-3 shards every parameter as one flat buffer per dtype group; bitsandbytes stores 4-bit
    weights as uint8 unless bnb_4bit_quant_storage names the dtype of the rest of the model (PEFT's
    DeepSpeed QLoRA recipe). Refuse the mixed model before loading it. No shipped config does
    QLoRA under ZeRO-3 (and none has run here): this keeps a user's own from failing obscurely."""
    if plugin is None or plugin.zero_stage != 3 or not load_in_4bit:
        return
    if dtype in (None, "auto") or quant_storage != dtype:
        raise ValueError(f"QLoRA under DeepSpeed ZeRO-3 needs bnb_4bit_quant_storage equal to dtype (e.g. both "
                         f"bfloat16), so the 4-bit weights shard with the rest; got bnb_4bit_quant_storage="
                         f"{quant_storage}, dtype={dtype}. Or train QLoRA with configs/accelerate/single_gpu.yaml")


def check_zero3_gather(plugin) -> None:
    """ZeRO-3 keeps each weight sharded across ranks; unless 16-bit weights are gathered on save,
    the saved adapter holds empty placeholders. Fail before training, not after. `plugin` is
    accelerate's DeepSpeedPlugin (`training_args.deepspeed_plugin`), or None without DeepSpeed."""
    if plugin is None or plugin.zero_stage != 3:
        return
    zero = (plugin.deepspeed_config or {}).get("zero_optimization", {})
    if not zero.get("stage3_gather_16bit_weights_on_model_save"):
        raise AdapterCheckError("DeepSpeed ZeRO-3 without stage3_gather_16bit_weights_on_model_save would save "
                                "an empty adapter; set it true in the DeepSpeed JSON (deepspeed_zero3.json), or "
                                "zero3_save_16bit_model: true in an accelerate config without one")
