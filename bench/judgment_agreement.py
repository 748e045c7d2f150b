"""python bench/judgment_agreement.py EXAMPLES ADAPTER [ADAPTER ...] [--model smollm2-135m] [--dtype bfloat16]

Whether a student has learned when to stop searching. On step prompts whose targets the gold chain
wrote (`kair datagen relabel` rows, source "relabelled: ..."), each student decodes its own step
greedily; its judgment, as the loop's parser reads it, is compared with the target's. Give it the
validation split of SFT data that holds relabelled rows (runs/.../sft/validation.jsonl): its
questions were never trained on. Prints, per student, the four counts (target -> student) and
the agreement; "stopped short" is a "sufficient" where the chain says "insufficient".
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from kair_runtime.index import empty_index
from kair_runtime.llm.base import LLM, SamplingParams
from kair_runtime.parser import parse_step_output

SOURCE = "relabelled: "


def judgment(text: str) -> str:
    return parse_step_output(text, "kr", empty_index("kr"), "").judgment


def step_rows(path: str | Path) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if r["source"].startswith(SOURCE) and r["kind"] in ("init", "update")]


def agreement(rows: list[dict], llm: LLM, max_tokens: int) -> Counter:
    """(target judgment, student judgment) -> count."""
    outs = llm.generate([r["messages"][:-1] for r in rows], SamplingParams(max_tokens=max_tokens))
    return Counter((judgment(r["messages"][-1]["content"]), judgment(o.text)) for r, o in zip(rows, outs))


def main() -> None:
    from kair_runtime.config import LLMConfig
    from kair_runtime.llm import build_llm

    ap = argparse.ArgumentParser()
    ap.add_argument("examples", help="SFT rows (jsonl) holding relabelled steps")
    ap.add_argument("adapters", nargs="+")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=160, help="the loop's step_max_tokens")
    args = ap.parse_args()
    rows = step_rows(args.examples)
    if not rows:
        raise SystemExit(f"error: {args.examples} holds no relabelled step rows")
    print(f"{len(rows)} relabelled step prompts; the chain says {dict(Counter(judgment(r['messages'][-1]['content']) for r in rows))}")
    for adapter in args.adapters:
        llm = build_llm(LLMConfig(backend="hf", model=args.model, adapter=adapter, dtype=args.dtype, device="cpu",
                                  batch_size=32))
        c = agreement(rows, llm, args.max_tokens)
        agree = c["sufficient", "sufficient"] + c["insufficient", "insufficient"]
        print(f"{adapter}: agreement {100 * agree / len(rows):.1f}% ({agree}/{len(rows)}); stopped short "
              f"{c['insufficient', 'sufficient']} of {c['insufficient', 'sufficient'] + c['insufficient', 'insufficient']}; "
              f"searched on {c['sufficient', 'insufficient']} of {c['sufficient', 'sufficient'] + c['sufficient', 'insufficient']}")


if __name__ == "__main__":
    main()
