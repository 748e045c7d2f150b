"""python bench/loop_batching.py [--questions 32] [--batches 1,8,32] [--max-steps 2] [--step-tokens 64]

The same questions through the KAIR loop with the hf backend and SmolLM2-135M-Instruct (the
embedded default) and the offline MiniLM dense retriever over the demo corpus, at several
batch sizes (questions per round = sequences per generate call). Prints questions/s for each,
the speedup over batch 1 measured in the same run, and how many traces agree exactly with the
batch-1 run under greedy decoding (left padding can change float32 logits in the last bits).
Target: >= 5x at batch 32.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig
from kair_runtime.demo_data import load_demo_questions
from kair_runtime.llm import build_llm
from kair_runtime.loop import KairLoop
from kair_runtime.records import Question
from kair_runtime.retrieval import build_retriever


def questions(n: int) -> list[Question]:
    demo = load_demo_questions()
    # Cycle the demo questions with distinct ids when more are asked for than exist.
    return [dataclasses.replace(demo[i % len(demo)], id=f"{demo[i % len(demo)].id}#{i}") for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--max-steps", type=int, default=2)
    ap.add_argument("--step-tokens", type=int, default=64)
    args = ap.parse_args()
    qs = questions(args.questions)
    retriever = build_retriever(RetrieverConfig(kind="dense", encoder="minilm"))
    base_llm = build_llm(LLMConfig(backend="hf", model="smollm2-135m", batch_size=1))
    results = {}
    for b in [int(x) for x in args.batches.split(",")]:
        base_llm.batch_size = b
        cfg = LoopConfig(max_steps=args.max_steps, top_k=3, step_max_tokens=args.step_tokens,
                         answer_max_tokens=16, max_passage_words=40, round_size=b)
        loop = KairLoop(base_llm, retriever, cfg)
        t0 = time.perf_counter()
        traces = loop.run(qs)
        elapsed = time.perf_counter() - t0
        results[b] = (elapsed, traces)
        print(f"batch {b:3d}: {len(qs) / elapsed:.3f} questions/s ({elapsed:.1f}s)", flush=True)
    first = min(results)
    ref_time, ref = results[first]
    for b, (elapsed, traces) in results.items():
        same = sum(_outputs(a) == _outputs(t) for a, t in zip(ref, traces))
        print(f"batch {b:3d}: speedup x{ref_time / elapsed:.2f} vs batch {first}; "
              f"traces identical to batch {first}: {same}/{len(traces)}")


def _outputs(trace) -> tuple:
    return tuple(s.raw_output for s in trace.steps) + (trace.final_output,)


if __name__ == "__main__":
    main()
