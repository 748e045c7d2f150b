"""python bench/cpu_ceiling.py [--sft-data runs/distill-cpu/sft/dataset] [--train-steps 8] [--questions 32] [--batches 8,32] [--breakdown] [--profile]

How close training and generation come to this CPU's ceiling, float32 (the recipe before
2026-12-05) against the new default (bfloat16 on AMX), measured in one run:

1. the ceiling: a 2048 x 2048 matmul in float32 and in bfloat16, GFLOP/s on all torch threads;
2. training: the benchmark student (configs/train/smollm2-135m-benchmark-cpu.yaml: SmolLM2-135M,
   LoRA r16 on every projection, batch 4, assistant-only loss) on batches of real SFT chats spread
   over one epoch of each variant's sampler, built by train/sft.py's own build_trainer and stepped
   by the Trainer's training_step and optimizer under the accelerator's autocast, inside the same
   contexts train/sft.py trains in. float32 (train/sft.py before): float32 weights, no autocast,
   the LM head over every position, random batches; new default: a bf16 frozen base, bf16 autocast,
   float32 adapter fed its bf16 input uncast, the LM head on labelled positions only. With
   --breakdown also each change alone, and the new default on batches grouped by length
   (train_sampling_strategy: group_by_length). Prints real (non-padding) tokens/s, the padding
   share, and each variant's loss on each batch (the random-batch variants share their batches,
   so their losses compare);
3. generation: the KAIR loop on the hf backend (SmolLM2-135M, MiniLM dense over the demo corpus,
   bench/loop_batching.py's questions and loop: 2 steps, 64 step tokens), float32 vs bfloat16
   weights and KV cache, at each batch size: output tokens/s, and how many greedy traces agree
   between batch sizes and between the two dtypes;
4. model FLOPs utilisation of each against the bf16 ceiling (and float32's against its own);
5. with --profile, the top operators of one training step per variant and one generate() call.

Model FLOPs as bench/flops.py counts them (training: 4 N per real token with LoRA, the LM head on
labelled positions, causal attention); generation 2 N per prompt and completion token plus
attention over the context; N = the non-embedding parameters.

--sft-data takes a DatasetDict of SFT chats (a demo run's OUT/sft/dataset after `kair demo
--config configs/demo/benchmark-cpu.yaml`); without one it falls back to the embedded demo's SFT
chats (shorter than the benchmark's) and says so.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from flops import Shape, matmul_gflops, training_flops
from loop_batching import outputs, questions

ROOT = Path(__file__).resolve().parents[1]
TRAIN_CONFIG = ROOT / "configs" / "train" / "smollm2-135m-benchmark-cpu.yaml"
FLOAT32_TRAINING = ["--dtype", "float32", "--bf16", "false", "--lm_head_on_labels_only", "false"]


# ---------------------------------------------------------------- training

def build(variant_flags: list[str], sft_data: Path, out: Path):
    from train.sft import build_trainer, parse_args

    args = parse_args(["--config", str(TRAIN_CONFIG), "--dataset_path", str(sft_data), "--output_dir", str(out),
                       "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none",
                       "--max_steps", "100", *variant_flags])
    from kair_runtime.llm.hf import resolve_model

    args[2].model_name_or_path = resolve_model(args[2].model_name_or_path)
    trainer = build_trainer(*args)
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); training_step divides by it
    return trainer, args[0]


def time_training(name: str, flags: list[str], sft_data: Path, steps: int, profile: bool) -> dict:
    """Time `steps` training steps (after one untimed warm-up) on batches spread evenly over one epoch
    of this variant's own sampler: length-grouped batches run from the longest to the shortest within
    each group, so the first few would not be a fair sample."""
    from train.sft import cpu_fast_paths

    with tempfile.TemporaryDirectory() as tmp:
        trainer, script_args = build(flags, sft_data, Path(tmp))
    model = trainer.model
    model.train()
    epoch = list(trainer.get_train_dataloader())
    batches = [epoch[i * len(epoch) // (steps + 1)] for i in range(steps + 1)]

    def step(b):
        with trainer.accelerator.autocast():
            loss = trainer.training_step(model, b)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
        return float(loss)

    losses, seconds = [], 0.0
    with cpu_fast_paths(trainer, script_args):
        for i, b in enumerate(batches):
            t0 = time.perf_counter()
            losses.append(step(b))
            if i:
                seconds += time.perf_counter() - t0
        if profile:
            from torch.profiler import ProfilerActivity, profile as torch_profile

            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                step(batches[1])
            print(f"\n--- one training step, {name} ---")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    timed = batches[1:]
    real = sum(int(b["attention_mask"].sum()) for b in timed)
    padded = sum(b["input_ids"].numel() for b in timed)
    return {"name": name, "seconds": seconds, "real_tokens": real, "padding": 1 - real / padded,
            "losses": losses, "flops": training_flops(Shape.of(model), timed), "dtypes": sorted(
                {str(p.dtype).removeprefix("torch.") for p in model.parameters()})}


def epoch_padding(sft_data: Path, sampling: str) -> float:
    """The padding share of one epoch of batches under a sampling strategy (no model run)."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer, _ = build(["--train_sampling_strategy", sampling], sft_data, Path(tmp))
    real = total = 0
    for b in trainer.get_train_dataloader():
        real += int(b["attention_mask"].sum())
        total += b["input_ids"].numel()
    return 1 - real / total


# ---------------------------------------------------------------- generation

def time_generation(dtype: str, batches: list[int], n_questions: int, profile: bool) -> dict:
    from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig
    from kair_runtime.llm import build_llm
    from kair_runtime.loop import KairLoop
    from kair_runtime.retrieval import build_retriever

    qs = questions(n_questions)
    retriever = build_retriever(RetrieverConfig(kind="dense", encoder="minilm"))
    llm = build_llm(LLMConfig(backend="hf", model="smollm2-135m", device="cpu", dtype=dtype, batch_size=1))
    shape = Shape.of(llm.model)
    out = {}
    for b in batches:
        llm.batch_size = b
        cfg = LoopConfig(max_steps=2, top_k=3, step_max_tokens=64, answer_max_tokens=16, max_passage_words=40,
                         round_size=b)
        t0 = time.perf_counter()
        traces = KairLoop(llm, retriever, cfg).run(qs)
        seconds = time.perf_counter() - t0
        prompt = sum(t.usage.prompt_tokens for t in traces)
        completion = sum(t.usage.completion_tokens for t in traces)
        # Each call's prompt is processed once, each completion token attends to its prompt and earlier output.
        calls = [(s.prompt_tokens, s.completion_tokens) for t in traces for s in t.steps] + \
                [(t.final_prompt_tokens, t.final_completion_tokens) for t in traces]
        flops = 2 * (shape.body_params + shape.head) * (prompt + completion) + sum(
            shape.attention(p / 2) * p + shape.attention(p + c / 2) * c for p, c in calls)
        out[b] = {"seconds": seconds, "completion": completion, "flops": flops, "traces": traces}
    if profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile

        from kair_runtime.llm.base import SamplingParams

        prompts = [s.prompt for t in out[batches[0]]["traces"][:8] for s in t.steps[:1]]
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            llm.batch_size = 8
            llm.generate(prompts, SamplingParams(max_tokens=32))
        print(f"\n--- one generate() call, 8 prompts x 32 tokens, {dtype} ---")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return out


# ---------------------------------------------------------------- report

def allocator() -> str:
    """The malloc this process runs on: the C library's unless LD_PRELOAD put jemalloc or tcmalloc
    first (jemalloc was tried against glibc's malloc and gained nothing here: docs/results.md)."""
    maps = Path("/proc/self/maps")
    libs = maps.read_text() if maps.is_file() else ""
    return next((name for name in ("jemalloc", "tcmalloc") if f"lib{name}" in libs), "the C library's")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sft-data", default="runs/distill-cpu/sft/dataset")
    ap.add_argument("--train-steps", type=int, default=8, help="timed steps per variant (after one warm-up step)")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: train, generate")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--breakdown", action="store_true",
                    help="also train float32 with the labelled-only LM head, and bf16 with the LM head on every position")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, oneDNN "
          f"{'on' if torch.backends.mkldnn.is_available() else 'off'}, allocator {allocator()}")

    f32, bf16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
    print(f"ceiling: 2048^3 matmul float32 {f32:.0f} GFLOP/s, bfloat16 {bf16:.0f} GFLOP/s (x{bf16 / f32:.2f})")

    def mfu(flops: float, seconds: float, peak: float) -> str:
        return f"{flops / seconds / 1e9 / peak:.1%}"

    if "train" not in skip:
        sft = Path(args.sft_data)
        if not (sft / "dataset_dict.json").is_file():
            from train.tiny_run import write_demo_sft

            sft = write_demo_sft(Path(tempfile.mkdtemp()) / "sft")
            print(f"{args.sft_data} is not an SFT DatasetDict: using the embedded demo's SFT chats (shorter)")
        variants = [("float32", FLOAT32_TRAINING), ("new default", [])]
        if args.breakdown:  # each change alone, and batches grouped by length (an option, not the recipe's)
            variants += [("f32 labelled", ["--dtype", "float32", "--bf16", "false"]),
                         ("bf16 all pos", ["--lm_head_on_labels_only", "false"]),
                         ("grouped", ["--train_sampling_strategy", "group_by_length"])]
        runs = [time_training(name, flags, sft, args.train_steps, args.profile) for name, flags in variants]
        print(f"\ntraining, LoRA SmolLM2-135M, batch 4, {args.train_steps} timed steps over one epoch of {sft}:")
        for r in runs:
            print(f"  {r['name']:12s} {r['real_tokens'] / r['seconds']:7.1f} real tok/s, {r['seconds'] / args.train_steps:5.2f}"
                  f" s/step, padding {r['padding']:.1%}, MFU {mfu(r['flops'], r['seconds'], bf16)} of bf16 "
                  f"({mfu(r['flops'], r['seconds'], f32)} of float32); weights {', '.join(r['dtypes'])}; "
                  f"losses {' '.join(f'{x:.4f}' for x in r['losses'])}")
        rate = {r["name"]: r["real_tokens"] / r["seconds"] for r in runs}
        print(f"  new default / float32: x{rate['new default'] / rate['float32']:.2f} real tokens/s")
        print("  padding share of one epoch at batch 4: " + ", ".join(
            f"{s} sampling {epoch_padding(sft, s):.1%}" for s in ("random", "group_by_length")))

    if "generate" not in skip:
        batches = [int(x) for x in args.batches.split(",")]
        gen = {d: time_generation(d, batches, args.questions, args.profile) for d in ("float32", "bfloat16")}
        print(f"\ngeneration, KAIR loop on the hf backend, SmolLM2-135M, {args.questions} questions, 2 steps x 64 tokens:")
        for d, res in gen.items():
            for b, r in res.items():
                peak = f32 if d == "float32" else bf16
                print(f"  {d:8s} batch {b:3d}: {r['completion'] / r['seconds']:6.1f} output tok/s "
                      f"({r['seconds']:.0f} s), MFU {mfu(r['flops'], r['seconds'], bf16)} of bf16"
                      + (f" ({mfu(r['flops'], r['seconds'], peak)} of float32)" if d == "float32" else ""))
        for b in batches:
            a, n = gen["float32"][b], gen["bfloat16"][b]
            ratio = (n["completion"] / n["seconds"]) / (a["completion"] / a["seconds"])
            same = sum(outputs(x) == outputs(y) for x, y in zip(a["traces"], n["traces"]))
            print(f"  batch {b:3d}: bfloat16 / float32 x{ratio:.2f} output tok/s; traces identical across dtypes "
                  f"{same}/{args.questions}")
        for d, res in gen.items():
            ref = res[batches[0]]["traces"]
            for b in batches[1:]:
                same = sum(outputs(x) == outputs(y) for x, y in zip(ref, res[b]["traces"]))
                print(f"  {d:8s}: traces identical at batch {batches[0]} and {b}: {same}/{args.questions}")


if __name__ == "__main__":
    main()
