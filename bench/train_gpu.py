"""python bench/train_gpu.py [--gpus N] [--steps 200] [--out-dir runs/bench_train_gpu]

LoRA SFT throughput on GPUs, the way train/sft.py trains: a real-architecture Qwen2 model at the
Qwen2.5-0.5B shape (24 layers, hidden 896, GQA 14/2 heads, vocab 151936, ~0.5B parameters;
random init, nothing downloaded), rank-16 LoRA on every projection, assistant-only loss, bf16,
gradient checkpointing, DeepSpeed ZeRO-2 under `accelerate launch`
(configs/accelerate/deepspeed_zero2.yaml), on synthetic KAIR-shaped SFT data (init / update /
answer prompts over 5 demo passages, rendered with the runtime's prompts and output layout).

It runs two trainings of --steps steps each, one `accelerate launch` per variant (so each gets a
fresh DeepSpeed engine): without packing (per-device batch 8, padded) and with packing (bfd,
padding-free, per-device batch sized for about the same tokens per step). Per variant it
reports steady-state tokens/s (real tokens, all GPUs, after 10 warm-up steps), tokens per step,
the padding fraction of the batches, peak GPU memory (allocated and reserved, max over
processes) and the first/last training loss; then the packed/unpacked speed ratio. It also
saves the adapter through ZeRO-2 and runs the empty-adapter check on it.

Needs a CUDA machine with this repo installed with the gpu extra (torch with CUDA, deepspeed,
transformers, trl, peft, accelerate). Token counts come from the tiny test tokenizer (ChatML,
~700 tokens), which spends about twice as many tokens per word as Qwen's, so examples are
~2x longer in tokens than with the real tokenizer; the model's full 151936-token LM head is kept.
Prepared for a GPU run; not run in the session that wrote it (no GPU there).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE_CONFIG = ROOT / "configs" / "accelerate" / "deepspeed_zero2.yaml"
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, vocab_size=151936)
UNPACKED_BATCH = 8
MAX_LENGTH = 4096
WARMUP_STEPS = 10


# ---------------------------------------------------------------- setup (outer process)

def build_model(out: Path) -> Path:
    """Random-init Qwen2 at the 0.5B shape, saved with the tiny ChatML tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from train.tiny_model import build_tiny_chat_model

    if (out / "config.json").is_file():
        return out
    tok = AutoTokenizer.from_pretrained(build_tiny_chat_model(out.parent / "tiny_tokenizer", family="qwen2"))
    config = Qwen2Config(**QWEN25_05B, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters -> {out}", flush=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def synthetic_messages(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """KAIR-shaped chats: a step prompt (init or update) over 5 passages with a rendered
    index/reasoning/query target, or an answer prompt with a short answer."""
    from kair_runtime.demo_data import load_demo_corpus, load_demo_questions
    from kair_runtime.output_format import render_step_output
    from kair_runtime.prompts import PromptSet
    from kair_runtime.records import Index, ScoredPassage

    rng = random.Random(seed)
    prompts = PromptSet.load("kr")
    corpus = [ScoredPassage(id=p.id, title=p.title, text=p.text, score=1.0) for p in load_demo_corpus()]
    questions = load_demo_questions()
    relations = [list(map(str, e)) for q in questions for e in q.metadata.get("evidences", [])]
    out = []
    for _ in range(n):
        q = rng.choice(questions)
        docs = rng.sample(corpus, 5)
        index = Index(format="kr", relations=rng.sample(relations, rng.randint(1, 8)))
        index.keywords = sorted({x for r in index.relations for x in (r[0], r[2])})
        kind = rng.choices(["init", "update", "answer"], weights=[2, 3, 2])[0]
        if kind == "answer":
            chat = prompts.answer(q.question, docs, index) + [{"role": "assistant", "content": q.answers[0]}]
        else:
            done = rng.random() < 0.4
            target = render_step_output(index, "The documents link the entities step by step.",
                                        "sufficient" if done else "insufficient", None if done else q.question)
            prompt = (prompts.init(q.question, docs) if kind == "init" else
                      prompts.update(q.question, docs, index, "Earlier reasoning.", q.question))
            chat = prompt + [{"role": "assistant", "content": target}]
        out.append(chat)
    return out


def write_data(out: Path, n: int) -> Path:
    from datasets import Dataset, DatasetDict

    if (out / "dataset_dict.json").is_file():
        return out
    DatasetDict({"train": Dataset.from_list([{"messages": m} for m in synthetic_messages(n)]),
                 "validation": Dataset.from_list([{"messages": m} for m in synthetic_messages(64, seed=1)])}
                ).save_to_disk(str(out))
    return out


def mean_length(model_dir: Path, data_dir: Path) -> float:
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = load_from_disk(str(data_dir))["train"].select(range(200))
    return sum(len(tok.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"])
               for r in rows) / len(rows)


# ---------------------------------------------------------------- one training (under accelerate)

class CountingCollator:
    """Wraps the trainer's collator to count real, padded and trained positions per batch, and
    keep what bench/flops.py counts a batch's model FLOPs from (`shapes`)."""

    def __init__(self, inner):
        self.inner, self.batches, self.shapes = inner, [], []

    def __call__(self, examples):
        batch = self.inner(examples)
        ids = batch["input_ids"]
        real = int(batch["attention_mask"].sum()) if "attention_mask" in batch else int(ids.numel())
        self.batches.append((real, int(ids.numel()), int((batch["labels"] != -100).sum())))
        self.shapes.append({k: batch[k].cpu() for k in ("labels", "attention_mask", "position_ids") if k in batch})
        return batch


def worker(args) -> None:
    import torch
    from transformers import TrainerCallback
    from trl import ModelConfig, SFTConfig

    from train.checks import check_adapter
    from train.sft import KairSFTArguments, build_trainer

    class StepClock(TrainerCallback):
        def __init__(self):
            self.times = []

        def on_step_end(self, a, state, control, **kw):
            torch.cuda.synchronize()
            self.times.append(time.perf_counter())

    batch = args.packed_batch if args.packing else UNPACKED_BATCH
    out = Path(args.out_dir) / ("packed" if args.packing else "unpacked")
    training_args = SFTConfig(
        output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=batch, gradient_accumulation_steps=1,
        learning_rate=2e-4, lr_scheduler_type="constant", warmup_steps=0, bf16=True, gradient_checkpointing=True,
        max_length=MAX_LENGTH, assistant_only_loss=True, packing=args.packing, packing_strategy="bfd",
        logging_steps=10, eval_strategy="no", save_strategy="no", report_to="none", seed=0,
        dataloader_num_workers=0, disable_tqdm=True)
    model_args = ModelConfig(model_name_or_path=args.model_dir, dtype="bfloat16", attn_implementation=args.attn,
                             use_peft=True, lora_r=16, lora_alpha=32, lora_dropout=0.0, lora_target_modules=PROJECTIONS)
    trainer = build_trainer(KairSFTArguments(dataset_path=args.data_dir), training_args, model_args)
    if not trainer.is_deepspeed_enabled:
        raise SystemExit("DeepSpeed is not active: launch through accelerate with configs/accelerate/deepspeed_zero2.yaml")
    counter, clock = CountingCollator(trainer.data_collator), StepClock()
    trainer.data_collator = counter
    trainer.add_callback(clock)

    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = torch.tensor([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()],
                        dtype=torch.float64, device="cuda")
    batches = counter.batches[:args.steps]  # the loader may have fetched one batch ahead
    local = torch.tensor([sum(b[0] for b in batches[WARMUP_STEPS:]), sum(b[0] for b in batches),
                          sum(b[1] for b in batches), sum(b[2] for b in batches)], dtype=torch.float64, device="cuda")
    totals = trainer.accelerator.reduce(local, reduction="sum")
    peak = trainer.accelerator.gather(peak.unsqueeze(0)).max(dim=0).values  # the fullest GPU
    trainer.save_model(str(out))  # through ZeRO-2, then the adapter must be non-empty and trained
    if trainer.is_world_process_zero():
        report = check_adapter(out)
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        seconds = clock.times[args.steps - 1] - clock.times[WARMUP_STEPS - 1]
        result = {
            "variant": out.name, "processes": trainer.accelerator.num_processes, "steps": args.steps,
            "per_device_batch": batch, "tokens_per_s": float(totals[0]) / seconds,
            "tokens_per_step": float(totals[1]) / args.steps, "padding_fraction": 1 - float(totals[1] / totals[2]),
            "trained_fraction": float(totals[3] / totals[1]), "peak_allocated_gb": float(peak[0]) / 2**30,
            "peak_reserved_gb": float(peak[1]) / 2**30, "loss_first": losses[0], "loss_last": losses[-1],
            "adapter_lora_b_max_abs": report.lora_b_max_abs, "gpu": torch.cuda.get_device_name(),
        }
        (Path(args.out_dir) / f"{out.name}.json").write_text(json.dumps(result, indent=2))
    if hasattr(trainer, "end"):
        trainer.end()


# ---------------------------------------------------------------- driver

def launch(args, packing: bool, packed_batch: int) -> dict:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIG),
           "--num_processes", str(args.gpus), __file__, "--worker", "--steps", str(args.steps),
           "--out-dir", str(args.out_dir), "--model-dir", str(args.model_dir), "--data-dir", str(args.data_dir),
           "--attn", args.attn, "--packed-batch", str(packed_batch)] + (["--packing"] if packing else [])
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads((Path(args.out_dir) / ("packed.json" if packing else "unpacked.json")).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=None, help="processes (default: every visible GPU)")
    ap.add_argument("--steps", type=int, default=200, help="training steps per variant")
    ap.add_argument("--examples", type=int, default=4000, help="synthetic training chats")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa; flash_attention_2 if installed)")
    ap.add_argument("--out-dir", default=str(ROOT / "runs" / "bench_train_gpu"))
    # worker-only arguments, set by launch()
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--packing", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--packed-batch", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))  # the repo's packages, also when it is not pip-installed
    if args.worker:
        return worker(args)

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/train_gpu.py needs a CUDA GPU")
    if args.steps <= WARMUP_STEPS:
        raise SystemExit(f"--steps must be more than the {WARMUP_STEPS} warm-up steps")
    args.gpus = args.gpus or torch.cuda.device_count()
    out = Path(args.out_dir)
    args.model_dir = build_model(out / "model")
    args.data_dir = write_data(out / "data", args.examples)
    length = mean_length(args.model_dir, args.data_dir)
    # packed rows are MAX_LENGTH long: size the batch for about the unpacked run's real tokens per step
    packed_batch = max(1, round(UNPACKED_BATCH * length / MAX_LENGTH))
    print(f"mean example length {length:.0f} tokens; packed per-device batch {packed_batch} x {MAX_LENGTH}", flush=True)
    results = [launch(args, False, packed_batch), launch(args, True, packed_batch)]

    print(f"\nLoRA r16 SFT, Qwen2 0.5B shape, ZeRO-2 on {args.gpus} x {results[0]['gpu']}, {args.steps} steps each")
    print(f"{'variant':<9} {'batch':>5} {'tokens/s':>10} {'tokens/step':>11} {'padding':>8} {'peak alloc':>10} "
          f"{'peak resv':>9}  loss first -> last")
    for r in results:
        print(f"{r['variant']:<9} {r['per_device_batch']:>5} {r['tokens_per_s']:>10.0f} {r['tokens_per_step']:>11.0f} "
              f"{r['padding_fraction']:>8.1%} {r['peak_allocated_gb']:>8.1f}GB {r['peak_reserved_gb']:>7.1f}GB"
              f"  {r['loss_first']:.3f} -> {r['loss_last']:.3f}")
    print(f"packed / unpacked tokens/s: {results[1]['tokens_per_s'] / results[0]['tokens_per_s']:.2f}x")
    (out / "summary.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
