"""python bench/answer_agreement.py RUN_A RUN_B [--run tuned-kair]

How many questions two `kair demo` run folders answer alike, per dev set: the same normalised
answer, the same whole trace (every step's raw output and the final output), and each run's
F1 / EM over the same questions; then, over all dev sets, B minus A in F1 and in format validity
with a 95% paired bootstrap interval over questions (2,000 resamples, seed 0). Made to compare one recipe at two precisions (docs/results.md,
"bfloat16 on the CPU"): F1 says whether quality moved, agreement says how much of it is the same
answers. Reads RUN/traces/<dataset>/<run>.jsonl; a question missing from either side is counted
and reported, never dropped silently.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from loop_batching import outputs

from eval.metrics import format_validity, normalize_answer, score_trace
from kair_runtime.jsonl import iter_json_records
from kair_runtime.records import Trace


def read(path: Path) -> dict[str, Trace]:
    return {t.question.id: t for t in (Trace.from_dict(r) for _, r in iter_json_records(path))}


def paired_bootstrap(pairs: list[tuple[Trace, Trace]], stat, n: int = 2000) -> tuple[float, float, float]:
    """stat(B traces) - stat(A traces), and its 95% interval when questions are resampled in pairs."""
    def diff(sample):
        return stat([b for _, b in sample]) - stat([a for a, _ in sample])

    rng = random.Random(0)
    draws = sorted(diff([rng.choice(pairs) for _ in pairs]) for _ in range(n))
    return diff(pairs), draws[int(0.025 * n)], draws[int(0.975 * n) - 1]


def mean_f1(traces: list[Trace]) -> float:
    return 100 * sum(score_trace(t).scores["f1"] for t in traces) / len(traces)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--run", default="tuned-kair", help="the eval run to compare (a traces file name)")
    args = ap.parse_args()
    a_root, b_root = Path(args.run_a) / "traces", Path(args.run_b) / "traces"
    total = {"n": 0, "answer": 0, "trace": 0}
    pairs: list[tuple[Trace, Trace]] = []
    print(f"{'dataset':18s} {'n':>4s} {'same answer':>12s} {'same trace':>11s}   F1/EM A      F1/EM B   (missing)")
    for a_file in sorted(a_root.glob(f"*/{args.run}.jsonl")):
        b_file = b_root / a_file.parent.name / a_file.name
        if not b_file.is_file():
            print(f"{a_file.parent.name:18s} only in {args.run_a}")
            continue
        a, b = read(a_file), read(b_file)
        common = [q for q in a if q in b]
        missing = len(set(a) ^ set(b))
        same_answer = sum(normalize_answer(a[q].answer) == normalize_answer(b[q].answer) for q in common)
        same_trace = sum(outputs(a[q]) == outputs(b[q]) for q in common)
        sa, sb = [score_trace(a[q]) for q in common], [score_trace(b[q]) for q in common]

        def f1_em(scores) -> str:
            n = max(len(scores), 1)
            return f"{100 * sum(s.scores['f1'] for s in scores) / n:5.1f}/{100 * sum(s.scores['em'] for s in scores) / n:5.1f}"

        print(f"{a_file.parent.name:18s} {len(common):4d} {same_answer:12d} {same_trace:11d}   {f1_em(sa)}  {f1_em(sb)}"
              f"   ({missing})")
        pairs += [(a[q], b[q]) for q in common]
        total["n"] += len(common)
        total["answer"] += same_answer
        total["trace"] += same_trace
    print(f"{'all':18s} {total['n']:4d} {total['answer']:12d} {total['trace']:11d}")
    if pairs:
        stats = [("F1", mean_f1)]
        if format_validity([a for a, _ in pairs]) is not None:  # None: a method without KAIR steps (vanilla)
            stats.append(("format valid %", format_validity))
        for name, stat in stats:
            d, lo, hi = paired_bootstrap(pairs, stat)
            print(f"B - A, {name}: {d:+.1f} (95% paired bootstrap over questions [{lo:+.1f}, {hi:+.1f}])")


if __name__ == "__main__":
    main()
