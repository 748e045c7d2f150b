"""python bench/answer_reach.py RUN [RUN ...] [--run tuned-kair]

Whether a student fails at searching or at reading: per dev set, how many questions had a gold
answer in the final prompt the student answered from (the acc metric's rule: its normalised text
inside the prompt's) and in all the passages the loop retrieved, and the student's mean F1 on the
questions whose final prompt held an answer and on those whose did not. Reads
RUN/traces/<dataset>/<run>.jsonl of `kair demo` or `kair eval` run folders. A short answer ("no",
"yes", a year) can occur in a prompt by chance, so on comparison questions the counts are upper
bounds; and a comparison question names its answer, so the final prompt (which holds the
question) can have an answer that no passage has.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from eval.metrics import score, score_trace
from kair_runtime.jsonl import iter_json_records
from kair_runtime.records import Trace


def holds_answer(text: str, golds: list[str]) -> bool:
    """A gold answer inside the text, as the acc metric (cover accuracy) judges a prediction."""
    return score(text, golds, ["acc"])["acc"] == 1.0


def mean(xs: list[float]) -> str:
    return f"{sum(xs) / len(xs):.1f}" if xs else "-"


def traces_per_set(argv: list[str] | None = None) -> Iterator[tuple[str, str, list[Trace]]]:
    """(run folder, dev set, its traces) for each RUN argument and each of its traces/<set>/<run>.jsonl."""
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--run", default="tuned-kair", help="the eval run to read (a traces file name)")
    args = ap.parse_args(argv)
    for root in args.runs:
        for path in sorted(Path(root, "traces").glob(f"*/{args.run}.jsonl")):
            yield root, path.parent.name, [Trace.from_dict(r) for _, r in iter_json_records(path)]


def main() -> None:
    print(f"{'run':34s} {'dataset':16s} {'n':>3s} {'in prompt':>9s} {'retrieved':>9s} "
          f"{'F1 answer in prompt':>19s} {'F1 not':>6s}")
    for root, dataset, traces in traces_per_set():
        seen, found, f1_in, f1_out = 0, 0, [], []
        for t in traces:
            golds = t.question.answers
            prompt = " ".join(m["content"] for m in t.final_prompt or [])
            passages = " ".join(p.text for p in t.all_passages())
            in_prompt = holds_answer(prompt, golds)
            seen += in_prompt
            found += holds_answer(passages, golds)
            (f1_in if in_prompt else f1_out).append(100 * score_trace(t).scores["f1"])
        print(f"{root:34s} {dataset:16s} {len(traces):3d} {seen:9d} {found:9d} {mean(f1_in):>19s} "
              f"{mean(f1_out):>6s}")


if __name__ == "__main__":
    main()
