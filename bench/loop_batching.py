"""python bench/loop_batching.py [--backends hf] [--questions 32] [--batches 1,8,32] [--max-steps 2] [--step-tokens 64]

The same questions through the KAIR loop with SmolLM2-135M-Instruct (the embedded default) and
the offline MiniLM dense retriever over the demo corpus, at several batch sizes (questions per
round = sequences per generate call). Prints questions/s and output tokens/s for each, the
speedup over the smallest batch measured in the same run, and how many traces agree exactly
with it under greedy decoding (left padding can change float32 logits in the last bits).
Target: >= 5x at batch 32.

hf against vllm, in the vllm environment (`nox -s vllm` builds it; vLLM's CPU build here):

    python bench/loop_batching.py --backends hf,vllm --batches 32

runs both backends on the same loop, float32 on a CPU (`--dtype`), and prints the vllm/hf ratio
of questions/s at each batch size and how many traces the two backends agree on. vLLM's start
(seconds to minutes) is not timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig
from kair_runtime.demo_data import load_demo_questions
from kair_runtime.llm import build_llm, close_llm
from kair_runtime.loop import KairLoop
from kair_runtime.records import Question
from kair_runtime.retrieval import build_retriever


def questions(n: int) -> list[Question]:
    demo = load_demo_questions()
    # Cycle the demo questions with distinct ids when more are asked for than exist.
    return [dataclasses.replace(demo[i % len(demo)], id=f"{demo[i % len(demo)].id}#{i}") for i in range(n)]


def llm_config(backend: str, args) -> LLMConfig:
    cfg = LLMConfig(backend=backend, model="smollm2-135m", dtype=args.dtype, batch_size=1)
    if backend == "vllm":
        cfg = dataclasses.replace(cfg, kv_cache_gib=args.kv_cache_gib, enforce_eager=args.eager)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="hf", help="comma-separated: hf, vllm")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--max-steps", type=int, default=2)
    ap.add_argument("--step-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="auto", help="auto: float32 on a CPU, bfloat16 on a GPU (both backends)")
    ap.add_argument("--kv-cache-gib", type=float, default=2.0, help="vllm: KV-cache size")
    ap.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True,
                    help="vllm: enforce_eager (no torch.compile / CUDA graphs; starts in seconds)")
    args = ap.parse_args()
    qs = questions(args.questions)
    retriever = build_retriever(RetrieverConfig(kind="dense", encoder="minilm"))
    batches = [int(x) for x in args.batches.split(",")]
    results: dict[tuple[str, int], tuple[float, list]] = {}
    for backend in args.backends.split(","):
        llm = build_llm(llm_config(backend, args))
        for b in batches:
            llm.batch_size = b  # hf: sequences per generate(); vllm schedules the whole round itself
            cfg = LoopConfig(max_steps=args.max_steps, top_k=3, step_max_tokens=args.step_tokens,
                             answer_max_tokens=16, max_passage_words=40, round_size=b)
            t0 = time.perf_counter()
            traces = KairLoop(llm, retriever, cfg).run(qs)
            elapsed = time.perf_counter() - t0
            results[backend, b] = (elapsed, traces)
            out_tokens = sum(t.usage.completion_tokens for t in traces)
            print(f"{backend:5s} batch {b:3d}: {len(qs) / elapsed:.3f} questions/s, {out_tokens / elapsed:.1f} "
                  f"output tok/s ({elapsed:.1f}s)", flush=True)
        close_llm(llm)
    for backend in args.backends.split(","):
        ref_time, ref = results[backend, batches[0]]
        for b in batches[1:]:
            elapsed, traces = results[backend, b]
            same = sum(outputs(a) == outputs(t) for a, t in zip(ref, traces))
            print(f"{backend:5s} batch {b:3d}: speedup x{ref_time / elapsed:.2f} vs batch {batches[0]}; "
                  f"traces identical to batch {batches[0]}: {same}/{len(traces)}")
    if {"hf", "vllm"} <= set(args.backends.split(",")):
        for b in batches:
            (hf_time, hf), (vllm_time, vl) = results["hf", b], results["vllm", b]
            same = sum(outputs(a) == outputs(t) for a, t in zip(hf, vl))
            print(f"batch {b:3d}: vllm/hf questions/s x{hf_time / vllm_time:.2f}; "
                  f"traces identical across backends: {same}/{len(hf)}")


def outputs(trace) -> tuple:
    """Everything a greedy trace generated: two traces agree when these are equal."""
    return tuple(s.raw_output for s in trace.steps) + (trace.final_output,)


if __name__ == "__main__":
    main()
