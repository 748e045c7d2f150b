"""python bench/self_repeats.py runs/distill-cpu/sft/train.jsonl runs/distill-cpu/sft/validation.jsonl

How many tokens the assistant replies of an SFT set repeat of themselves, in the student's own
tokens (--model, default the embedded SmolLM2). `loop.no_repeat_ngram: n` leaves a reply as it
was trained iff its longest self-repeat is shorter than n, so this prints the share of replies
each n would alter; the largest longest-repeat + 1 is the smallest n that alters none of them.
"""

from __future__ import annotations

import argparse
import json

from transformers import AutoTokenizer

from kair_runtime.llm.hf import resolve_model


def longest_self_repeat(ids: list[int]) -> int:
    """The largest n such that some n tokens occur twice in ids (overlaps count; 0 if none)."""
    def repeats(n: int) -> bool:
        grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
        return len(grams) != len(set(grams))

    lo, hi = 0, max(0, len(ids) - 1)  # a repeat of n tokens contains one of every shorter length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if repeats(mid) else (lo, mid - 1)
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    ap.add_argument("files", nargs="+", help="SFT jsonl files ({messages: [...]} per line)")
    ap.add_argument("--model", default="smollm2-135m", help="whose tokenizer counts the tokens")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(resolve_model(args.model))
    replies = [m["content"] for path in args.files for line in open(path, encoding="utf-8") if line.strip()
               for m in json.loads(line)["messages"] if m["role"] == "assistant"]
    if not replies:
        raise SystemExit(f"no assistant replies in {', '.join(args.files)}")
    longest = sorted(longest_self_repeat(tok(r, add_special_tokens=False)["input_ids"]) for r in replies)
    print(f"{len(replies)} replies; longest self-repeat (tokens): median {longest[len(longest) // 2]}, "
          f"p95 {longest[int(len(longest) * 0.95)]}, max {longest[-1]}")
    print("| no_repeat_ngram | replies it would alter |\n|---|---|")
    for n in (8, 12, 16, 20, 24, 32):
        k = sum(x >= n for x in longest)
        print(f"| {n} | {k} ({100 * k / len(longest):.1f}%) |")
    print(f"smallest n that alters no reply: {longest[-1] + 1}")


if __name__ == "__main__":
    main()
