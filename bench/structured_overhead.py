"""python bench/structured_overhead.py [--model smollm2-135m] [--format kr] [--questions 4] [--max-tokens 64]

The structured mode's cost on the hf backend: the same step prompts decoded greedily without and
with the step grammar (kair_runtime/grammar.py through xgrammar's logits processor), in one run.
Prints seconds per generated token for each and their ratio, plus the one-off grammar compile
time (paid once per backend and grammar, so it is measured apart, before the timed runs). The two
runs generate different texts, so time per token, not wall time, is what compares; and the
unconstrained run ignores the end token, so every row of both runs decodes max_tokens (keep
--max-tokens below what the grammar's bounds allow, so the structured rows run to it too) and
the prompts' prefill is spread over the same number of tokens.
`--model tiny` uses the random-weight model of train/tiny_model.py (no download, 768 tokens).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kair_runtime.config import LLMConfig  # noqa: E402
from kair_runtime.grammar import step_grammar  # noqa: E402
from kair_runtime.layout import step_layout  # noqa: E402
from kair_runtime.llm.base import SamplingParams  # noqa: E402
from kair_runtime.llm.hf import HFBackend  # noqa: E402

QUESTIONS = ["Who directed the film that won the 1998 Palme d'Or?", "Which band recorded Viva la Vida?",
             "When was the university in the old city founded?", "Who was the mother of the king of France?",
             "Where was the author of The Hobbit born?", "Which river flows through the capital of Hungary?",
             "Who founded the company that built the first jet airliner?", "What year did Oasis form?"]


def _backend(model: str, batch_size: int) -> HFBackend:
    if model != "tiny":
        return HFBackend.from_config(LLMConfig(model=model, batch_size=batch_size, device="cpu"))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.tiny_model import build_tiny_chat_model

    path = build_tiny_chat_model(Path(tempfile.mkdtemp()) / "tiny")
    return HFBackend(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path),
                     batch_size=batch_size, name="hf:tiny")


def _timed(llm: HFBackend, prompts, sampling: SamplingParams) -> tuple[float, int]:
    start = time.perf_counter()
    completions = llm.generate(prompts, sampling)
    return time.perf_counter() - start, sum(c.completion_tokens for c in completions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--format", default="kr")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args()

    llm = _backend(args.model, args.batch_size)
    layout = step_layout(args.format)
    prompts = [[{"role": "user", "content": f"Question: {q}\nReply in exactly this layout:\n{layout.block}"}]
               for q in (QUESTIONS * args.questions)[:args.questions]]
    grammar = step_grammar(args.format)
    free = SamplingParams(max_tokens=args.max_tokens)
    structured = SamplingParams(max_tokens=args.max_tokens, grammar=grammar)

    start = time.perf_counter()
    llm._grammar_processor(grammar)  # compiles and caches: the one-off cost
    compile_s = time.perf_counter() - start
    _timed(llm, prompts[:1], SamplingParams(max_tokens=4))  # warm-up
    eos_ids, llm.eos_ids = llm.eos_ids, {-1}  # no id ends a row: it decodes max_tokens
    free_s, free_n = _timed(llm, prompts, free)
    llm.eos_ids = eos_ids
    on_s, on_n = _timed(llm, prompts, structured)
    per_free, per_on = free_s / max(free_n, 1), on_s / max(on_n, 1)
    print(f"model {llm.name}, format {args.format}, {len(prompts)} prompts, batch {args.batch_size}, "
          f"max_tokens {args.max_tokens}, grammar {len(grammar)} chars compiled in {compile_s:.2f} s")
    print(f"unconstrained: {free_n} tokens in {free_s:.2f} s = {1000 * per_free:.2f} ms/token")
    print(f"structured:    {on_n} tokens in {on_s:.2f} s = {1000 * per_on:.2f} ms/token")
    print(f"ratio structured/unconstrained per generated token: {per_on / per_free:.2f}")


if __name__ == "__main__":
    main()
