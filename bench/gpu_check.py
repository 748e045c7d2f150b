"""python bench/gpu_check.py [--out-dir runs/gpu_check]          # one GPU, no network: Qwen2.5-7B shapes, bf16
python bench/gpu_check.py --toy [--out-dir runs/gpu_check]    # CPU: a toy shape, float32, a few tokens
python bench/gpu_check.py --loop-backend hf                   # a GPU without vLLM: the loop on hf + peft

The prepared GPU check: one command for a machine with one GPU and no network (written for an
H200; install with `pip install -e ".[vllm,gpu,serve]"`), meant to finish in under 8 minutes. It
measures what docs/results.md anchors, on a model nothing has to download:

1. model: a random-init Qwen2 at Qwen2.5-7B's shapes (hidden 3584, MLP 18944, 28 layers, 28/4
   heads, vocab 152064, untied head; 7.6B parameters) built on the GPU in bf16 and saved as
   safetensors, with the tiny ChatML tokenizer of train/tiny_model.py (~700 tokens, built
   locally). That tokenizer spends about twice as many tokens per word as Qwen's, so the same
   chats are ~2x longer in tokens. The LM head rows past the tokenizer's last id are zero, the
   way a real checkpoint pads its vocabulary: every one of the 152064 logits is still computed,
   but a greedy step always picks a token the tokenizer can decode.
2. sft: LoRA SFT steps the way train/sft.py trains (configs/train/qwen2.5-7b-lora.yaml as
   shipped: rank 16 on every projection, bf16, packed padding-free rows on flash-attention (sdpa
   when flash-attn is not installed, said in the report), no gradient checkpointing, 2 rows x 1
   accumulation, assistant-only loss) under `accelerate launch --config_file
   configs/accelerate/deepspeed_zero2.yaml --num_processes 1`, on synthetic KAIR-shaped chats
   (bench/train_gpu.py's). Reports trained tokens/s (non-padding tokens of the batches, after
   warm-up steps), peak memory (GPU: torch.cuda max allocated/reserved; CPU: peak RSS) and MFU
   (bench/flops.py's model FLOPs against the GPU's bf16 dense peak). The adapter it saves is the
   one the vLLM phase serves.
3. vllm: the KAIR loop (bm25 over the demo corpus, greedy) on a vLLM engine with that adapter on
   every request, once with prefix caching on and once off, each engine in its own process
   (vLLM does not reliably give device memory back when an engine is dropped, and a prefix cache
   cannot be switched off in a running engine). The questions are the demo questions, copied
   until the batch is full and numbered so that no two prompts are equal: prefix caching can
   reuse what distinct questions share, never a whole repeated prompt. Reports questions/s and
   output tok/s over the loop's wall time (retrieval and prefill included), and the on/off ratio.

--loop-backend hf runs phase 3 once on the hf backend (transformers + peft, batch = all questions)
instead of twice on vLLM, for a machine where vLLM cannot be installed; its tok/s are printed with
the ratio to the vLLM anchor, labelled as such.

Each figure is printed with its ratio to the anchors below. --toy runs the same phases at a toy
shape on CPU (vLLM's CPU backend, DeepSpeed on CPU); its figures are real measurements of a toy,
so its ratios to the anchors mean nothing and are labelled so. A JSON summary goes to
OUT_DIR/summary.json. The first DeepSpeed run on a CPU machine compiles a small op (~2 min,
cached in ~/.cache/torch_extensions).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZERO2_CONFIG = ROOT / "configs" / "accelerate" / "deepspeed_zero2.yaml"
SFT_CONFIG = ROOT / "configs" / "train" / "qwen2.5-7b-lora.yaml"
TIME_BUDGET_S = 8 * 60

# The anchors of docs/results.md (keep the two in step):
VLLM_ANCHOR_TOK_S = 5800.0  # vLLM output tok/s, an 8B model on one H100
SFT_ANCHOR_TOK_S = (3000.0, 4700.0)  # LoRA SFT tok/s of an 8B model on one consumer GPU

QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
                 rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
# head_dim 64: one of the sizes vLLM's CPU attention supports (the tiny test model's 16 is not)
TOY = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, vocab_size=2048, max_position_embeddings=8192,
           rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)


@dataclasses.dataclass
class Plan:
    """Everything that differs between the GPU run and the CPU toy run."""

    shape: dict
    dtype: str
    sft_steps: int  # optimizer steps; the first sft_warmup are not timed
    sft_warmup: int
    sft_flags: list[str]  # on top of configs/train/qwen2.5-7b-lora.yaml
    questions: int  # KAIR loop questions per vLLM configuration, all in one round
    hf_questions: int  # the same on the hf backend (--loop-backend hf), one generate() batch
    hf_loop: dict  # LoopConfig fields on the hf backend: it decodes ~30x slower than vLLM, so fewer tokens
    warmup_questions: int
    loop: dict  # LoopConfig fields
    vllm: dict  # LLMConfig fields


GPU_PLAN = Plan(shape=QWEN25_7B, dtype="bfloat16", sft_steps=12, sft_warmup=2, sft_flags=[],
                questions=256, hf_questions=16, warmup_questions=8,
                loop=dict(max_steps=2, top_k=5, step_max_tokens=384, answer_max_tokens=32),
                # measured on an H200: 64 questions x 384 step tokens did not finish in 7.5 min
                hf_loop=dict(max_steps=2, top_k=5, step_max_tokens=128, answer_max_tokens=32),
                vllm=dict(gpu_memory_utilization=0.9, max_model_len=16384, enforce_eager=False))
TOY_PLAN = Plan(shape=TOY, dtype="float32", sft_steps=4, sft_warmup=1,
                # TrainingArguments refuses bf16 without a device for it; the batch is cut for 2 cores
                sft_flags=["--use_cpu", "true", "--bf16", "false", "--dtype", "float32", "--attn_implementation", "sdpa",
                           "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
                           "--max_length", "1024"],
                questions=8, hf_questions=4, warmup_questions=2,
                loop=dict(max_steps=2, top_k=3, step_max_tokens=24, answer_max_tokens=8),
                hf_loop=dict(max_steps=2, top_k=3, step_max_tokens=24, answer_max_tokens=8),
                vllm=dict(kv_cache_gib=0.25, max_model_len=4096, enforce_eager=True))


# ---------------------------------------------------------------- phase 1: the model

def build_model(out: Path, plan: Plan, device: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from train.tiny_model import build_tiny_chat_model

    tok = AutoTokenizer.from_pretrained(build_tiny_chat_model(out.parent / "tokenizer", family="qwen2"))
    config = Qwen2Config(**plan.shape, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    # Initialised where it will run: 7.6B parameters filled on a CPU take minutes, on a GPU seconds.
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, plan.dtype))
    with torch.no_grad():
        model.lm_head.weight[len(tok):] = 0  # see the docstring: padded vocabulary, decodable argmax
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # the next phases' processes need the whole GPU
    return {"parameters": params, "tokenizer_tokens": len(tok), **plan.shape}


# ---------------------------------------------------------------- phase 2: LoRA SFT under ZeRO-2

def sft_worker(args) -> None:
    """One training, inside `accelerate launch`: train/sft.py's trainer with a token counter and a
    step clock attached."""
    import resource

    import torch
    from transformers import TrainerCallback

    from bench.flops import Shape, gpu_peak_tflops, matmul_gflops, training_flops
    from bench.train_gpu import CountingCollator
    from train.checks import check_adapter
    from train.sft import build_trainer, cpu_fast_paths, parse_args

    plan = TOY_PLAN if args.toy else GPU_PLAN
    cuda = torch.cuda.is_available() and not args.toy

    class StepClock(TrainerCallback):
        def __init__(self):
            self.times = []

        def on_step_end(self, a, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()  # kernels are asynchronous: the step ends when they do
            self.times.append(time.perf_counter())

    out = Path(args.out_dir) / "sft"
    argv = ["--config", str(SFT_CONFIG), "--model_name_or_path", args.model_dir, "--dataset_path", args.data_dir,
            "--output_dir", str(out), "--max_steps", str(plan.sft_steps), "--eval_strategy", "no",
            "--save_strategy", "no", "--logging_steps", "1", "--report_to", "none", "--disable_tqdm", "true",
            "--dataloader_num_workers", "0", *plan.sft_flags]
    script_args, training_args, model_args = parse_args(argv)
    if cuda and model_args.attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        # The shipped config packs on flash-attention's varlen path; without the package, sdpa keeps
        # packed examples apart too (tests/train/test_train_precision.py), slower: said in the report.
        model_args.attn_implementation = "sdpa"
    trainer = build_trainer(script_args, training_args, model_args)
    plugin = trainer.accelerator.state.deepspeed_plugin
    if not trainer.is_deepspeed_enabled or plugin.zero_stage != 2:
        raise SystemExit("DeepSpeed ZeRO-2 is not active: launch through accelerate with "
                         "configs/accelerate/deepspeed_zero2.yaml")
    counter, clock = CountingCollator(trainer.data_collator), StepClock()
    trainer.data_collator = counter
    trainer.add_callback(clock)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with cpu_fast_paths(trainer, script_args):
        trainer.train()
    accum = training_args.gradient_accumulation_steps
    batches = counter.batches[:plan.sft_steps * accum]  # the loader fetches one batch ahead
    timed = batches[plan.sft_warmup * accum:]
    seconds = clock.times[plan.sft_steps - 1] - clock.times[plan.sft_warmup - 1]
    if cuda:
        peak = {"kind": "gpu", "allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
                "reserved_gb": torch.cuda.max_memory_reserved() / 2**30}
    else:
        peak = {"kind": "cpu peak RSS", "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    trainer.save_model(str(out))  # through ZeRO-2, as any run saves its adapter
    adapter = check_adapter(out)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    # Model FLOPs utilisation: the timed steps' model FLOPs per second against the device's bf16
    # dense peak (a GPU's data sheet; on the --toy CPU run, a float32 matmul measured here).
    flops = training_flops(Shape.of(trainer.model), counter.shapes[plan.sft_warmup * accum:plan.sft_steps * accum])
    if cuda:
        device_name = torch.cuda.get_device_name()
        peak_tflops, peak_source = gpu_peak_tflops(device_name), f"{device_name} bf16 dense peak"
    else:
        peak_tflops, peak_source = matmul_gflops(torch.float32) / 1e3, "this CPU's float32 matmul, measured"
    result = {
        "tokens_per_s": sum(b[0] for b in timed) / seconds,
        "model_tflops_per_s": flops / seconds / 1e12, "peak_tflops": peak_tflops, "peak_source": peak_source,
        "mfu": flops / seconds / 1e12 / peak_tflops if peak_tflops else None,
        "attn_implementation": model_args.attn_implementation, "packing": training_args.packing,
        "gradient_checkpointing": training_args.gradient_checkpointing,
        "liger": bool(getattr(training_args, "use_liger_kernel", False)),
        "peak_memory_gb": peak.get("allocated_gb", peak.get("rss_gb")), "peak": peak,
        "steps": plan.sft_steps, "timed_steps": plan.sft_steps - plan.sft_warmup, "timed_s": seconds,
        "per_device_batch": training_args.per_device_train_batch_size, "gradient_accumulation": accum,
        "tokens_per_step": sum(b[0] for b in batches) / plan.sft_steps,
        "padding_fraction": 1 - sum(b[0] for b in batches) / sum(b[1] for b in batches),
        "loss_tokens_fraction": sum(b[2] for b in batches) / sum(b[0] for b in batches),
        "loss_first": losses[0], "loss_last": losses[-1], "adapter": str(out),
        "adapter_lora_b_max_abs": adapter.lora_b_max_abs, "zero_stage": plugin.zero_stage,
    }
    (Path(args.out_dir) / "sft.json").write_text(json.dumps(result, indent=2))
    if hasattr(trainer, "end"):
        trainer.end()


def run_sft(args, plan: Plan, model_dir: Path) -> dict:
    from bench.train_gpu import write_data

    out = Path(args.out_dir)
    # more rows than the steps take (GPU: 12 steps x batch 4 x 2 accumulation = 96)
    data_dir = write_data(out / "sft_data", 256)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ZERO2_CONFIG),
           "--num_processes", "1", __file__, "--sft-worker", "--out-dir", str(out),
           "--model-dir", str(model_dir), "--data-dir", str(data_dir)] + (["--toy"] if args.toy else [])
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env=child_env())
    return json.loads((out / "sft.json").read_text())


# ---------------------------------------------------------------- phase 3: the KAIR loop with the adapter

def loop_questions(n: int, start: int):
    """n demo questions, cycled, each numbered (start, start+1, ...) so that no two prompts are equal."""
    from kair_runtime.demo_data import load_demo_questions

    base = load_demo_questions()
    return [dataclasses.replace(q, id=f"{q.id}-{i}", question=f"({i}) {q.question}")
            for i in range(start, start + n) for q in [base[i % len(base)]]]


def loop_worker(args) -> None:
    """One engine (vllm: one prefix-caching setting), warm up, then time the KAIR loop (vllm: on a fresh
    prefix cache)."""
    from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig
    from kair_runtime.llm import build_llm, close_llm
    from kair_runtime.loop import KairLoop
    from kair_runtime.retrieval import build_retriever

    plan = TOY_PLAN if args.toy else GPU_PLAN
    on = args.prefix_caching == "on"
    vllm = args.loop_backend == "vllm"
    n = plan.questions if vllm else plan.hf_questions
    loop_cfg = plan.loop if vllm else plan.hf_loop
    backend = (dict(backend="vllm", enable_prefix_caching=on, **plan.vllm) if vllm
               else dict(backend="hf", batch_size=n))
    t0 = time.perf_counter()
    llm = build_llm(LLMConfig(model=args.model_dir, adapter=args.adapter, dtype=plan.dtype, **backend))
    start_s = time.perf_counter() - t0
    retriever = build_retriever(RetrieverConfig(kind="bm25"))
    # The warm-up only has to take every code path once (adapter load, prefill, decode, sampling):
    # a few short replies, on questions numbered apart from the timed ones.
    short = {**loop_cfg, "step_max_tokens": 8, "answer_max_tokens": 4}
    KairLoop(llm, retriever, LoopConfig(**short)).run(loop_questions(plan.warmup_questions, start=n))
    loop = KairLoop(llm, retriever, LoopConfig(**loop_cfg, round_size=n))
    if vllm and on:
        llm.llm.reset_prefix_cache()  # the timed run gets no head start from the warm-up's prompts
    questions = loop_questions(n, start=0)
    t0 = time.perf_counter()
    traces = loop.run(questions)
    wall = time.perf_counter() - t0
    close_llm(llm)
    errors = [t.error for t in traces if t.error]
    if errors:
        raise SystemExit(f"{len(errors)} of {len(traces)} questions failed, e.g.: {errors[0]}")
    output = sum(t.usage.completion_tokens for t in traces)
    result = {
        "backend": args.loop_backend, "prefix_caching": on if vllm else None, "questions": len(traces), "wall_s": wall, "engine_start_s": start_s,
        "questions_per_s": len(traces) / wall, "output_tok_s": output / wall,
        "output_tokens": output, "prompt_tokens": sum(t.usage.prompt_tokens for t in traces),
        "llm_calls": sum(len(t.steps) + 1 for t in traces), **loop_cfg,
    }
    (Path(args.out_dir) / f"loop_{args.loop_backend}_{args.prefix_caching}.json").write_text(json.dumps(result, indent=2))


def run_loop(args, model_dir: Path, adapter: str, prefix_caching: str) -> dict:
    out = Path(args.out_dir)
    cmd = [sys.executable, __file__, "--loop-worker", "--loop-backend", args.loop_backend,
           "--prefix-caching", prefix_caching, "--out-dir", str(out), "--model-dir", str(model_dir),
           "--adapter", adapter] + (["--toy"] if args.toy else [])
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env=child_env())
    return json.loads((out / f"loop_{args.loop_backend}_{prefix_caching}.json").read_text())


# ---------------------------------------------------------------- driver

def child_env() -> dict:
    # the repo's packages also when it is not pip-installed; nothing may reach a hub
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def ratio(x: float, anchor: float) -> str:
    return f"{x / anchor:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toy", action="store_true", help="a toy shape on CPU, float32 (the smoke run)")
    ap.add_argument("--out-dir", default=str(ROOT / "runs" / "gpu_check"))
    ap.add_argument("--loop-backend", choices=["vllm", "hf"], default="vllm",
                    help="the backend of the KAIR-loop phase (hf: for a machine without vLLM)")
    # worker-only arguments, set by the driver
    ap.add_argument("--sft-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--loop-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prefix-caching", choices=["on", "off"], default="off", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", help=argparse.SUPPRESS)
    ap.add_argument("--adapter", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.sft_worker:
        return sft_worker(args)
    if args.loop_worker:
        return loop_worker(args)

    import torch

    plan = TOY_PLAN if args.toy else GPU_PLAN
    if not args.toy and not torch.cuda.is_available():
        raise SystemExit("bench/gpu_check.py needs a CUDA GPU; on a CPU run it with --toy")
    device = "cpu" if args.toy else "cuda"
    where = "CPU" if args.toy else torch.cuda.get_device_name()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    phases: dict[str, float] = {}
    t_start = time.perf_counter()

    @contextlib.contextmanager
    def phase(name: str):
        elapsed = time.perf_counter() - t_start
        if elapsed > TIME_BUDGET_S:
            print(f"WARNING: {elapsed:.0f} s already, over the {TIME_BUDGET_S} s budget, before {name}", flush=True)
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        yield
        phases[name] = time.perf_counter() - t0
        print(f"== {name}: {phases[name]:.1f} s", flush=True)

    with phase("build model"):
        model_info = build_model(out / "model", plan, device)
    with phase("sft zero2"):
        sft = run_sft(args, plan, out / "model")
    runs = []
    for setting in (["on", "off"] if args.loop_backend == "vllm" else ["off"]):
        label = f"vllm prefix caching {setting}" if args.loop_backend == "vllm" else "hf loop"
        with phase(label):
            runs.append(run_loop(args, out / "model", sft["adapter"], setting))
    total = time.perf_counter() - t_start

    figures = {}
    for r in runs:
        key = f"vllm_prefix_{'on' if r['prefix_caching'] else 'off'}" if r["backend"] == "vllm" else "hf"
        figures |= {f"{key}_questions_per_s": r["questions_per_s"], f"{key}_output_tok_s": r["output_tok_s"],
                    f"{key}_output_tok_s_vs_anchor": r["output_tok_s"] / VLLM_ANCHOR_TOK_S}
    if len(runs) == 2:
        figures["vllm_prefix_on_off_ratio"] = runs[0]["questions_per_s"] / runs[1]["questions_per_s"]
    figures |= {
        "sft_tokens_per_s": sft["tokens_per_s"], "sft_peak_memory_gb": sft["peak_memory_gb"], "sft_mfu": sft["mfu"],
        "sft_tokens_per_s_vs_anchor_low": sft["tokens_per_s"] / SFT_ANCHOR_TOK_S[0],
        "sft_tokens_per_s_vs_anchor_high": sft["tokens_per_s"] / SFT_ANCHOR_TOK_S[1],
    }
    note = "  [toy shape on CPU: ratios to the anchors are meaningless]" if args.toy else ""
    shape = "toy" if args.toy else "Qwen2.5-7B"
    lines = [
        f"gpu_check: {shape} shape, {model_info['parameters'] / 1e9:.3f}B parameters (random init), "
        f"{plan.dtype}, on {where}",
        *(f"phase {name:<24} {s:7.1f} s" for name, s in phases.items()),
        f"total {total:.1f} s (budget {TIME_BUDGET_S} s)",
        f"{'vLLM' if args.loop_backend == 'vllm' else 'hf + peft'} + LoRA r16, KAIR loop, {runs[0]['questions']} "
        f"questions x {runs[0]['max_steps']} steps (+ answer), step/answer max tokens "
        f"{runs[0]['step_max_tokens']}/{runs[0]['answer_max_tokens']}:",
    ]
    for r in runs:
        setting = (f"prefix caching {'on ' if r['prefix_caching'] else 'off'}" if r["backend"] == "vllm"
                   else f"hf, batch {r['questions']}")
        lines.append(f"  {setting}: {r['questions_per_s']:.3f} questions/s, {r['output_tok_s']:.1f} "
                     f"output tok/s ({ratio(r['output_tok_s'], VLLM_ANCHOR_TOK_S)} the vLLM anchor "
                     f"{VLLM_ANCHOR_TOK_S:.0f} tok/s: 8B, one H100){note}")
    if len(runs) == 2:
        lines.append(f"  prefix caching on/off: {figures['vllm_prefix_on_off_ratio']:.3f}x questions/s")
    peak = sft["peak"]
    peak_text = (f"{peak['allocated_gb']:.1f} GiB allocated, {peak['reserved_gb']:.1f} GiB reserved (GPU)"
                 if peak["kind"] == "gpu" else f"{peak['rss_gb']:.2f} GiB peak RSS (CPU)")
    lines += [
        f"LoRA r16 SFT, DeepSpeed ZeRO-2, 1 process, batch {sft['per_device_batch']} x {sft['gradient_accumulation']}, "
        f"{sft['timed_steps']} timed steps: {sft['tokens_per_s']:.1f} trained tok/s "
        f"({ratio(sft['tokens_per_s'], SFT_ANCHOR_TOK_S[1])}-{ratio(sft['tokens_per_s'], SFT_ANCHOR_TOK_S[0])} "
        f"the anchor {SFT_ANCHOR_TOK_S[0]:.0f}-{SFT_ANCHOR_TOK_S[1]:.0f} tok/s: 8B, one consumer GPU){note}",
        f"  peak memory {peak_text}; loss {sft['loss_first']:.3f} -> {sft['loss_last']:.3f}, "
        f"padding {sft['padding_fraction']:.1%}",
        f"  MFU {'n/a' if sft['mfu'] is None else format(sft['mfu'], '.1%')}: {sft['model_tflops_per_s']:.2f} model "
        f"TFLOP/s of {sft['peak_tflops'] or 'unknown'} ({sft['peak_source']}); attention {sft['attn_implementation']}, "
        f"packing {sft['packing']}, gradient checkpointing {sft['gradient_checkpointing']}, liger {sft['liger']}",
    ]
    if total > TIME_BUDGET_S:
        lines.append(f"WARNING: the check took {total:.0f} s, over its {TIME_BUDGET_S} s budget")
    print("\n" + "\n".join(lines), flush=True)
    summary = {"shape": shape, "toy": args.toy, "device": where, "dtype": plan.dtype, "model": model_info,
               "figures": figures, "ratios_meaningful": not args.toy,
               "anchors": {"vllm_output_tok_s": VLLM_ANCHOR_TOK_S, "sft_tok_s": list(SFT_ANCHOR_TOK_S)},
               "phases_s": phases, "total_s": total, "over_budget": total > TIME_BUDGET_S,
               "loop_backend": args.loop_backend, "loop": runs, "sft": sft}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"summary: {out / 'summary.json'}")


if __name__ == "__main__":
    main()
