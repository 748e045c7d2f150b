"""python bench/loop_overhead.py [--questions 2000] [--steps 4]

Runtime overhead of the KAIR loop per step, with a zero-cost LLM (a fixed well-formed output)
and a zero-cost retriever (the same 5 passages for every query): prompt rendering, parsing,
index merging and trace bookkeeping. Target: < 1 ms per step.
"""

from __future__ import annotations

import argparse
import time

from kair_runtime.config import LoopConfig
from kair_runtime.llm.scripted import ScriptedLLM
from kair_runtime.loop import KairLoop
from kair_runtime.records import Question, ScoredPassage

OUTPUT = """<index>
Keywords: Lost!, Coldplay, British rock band, 1996, London
Relationships:
Lost! -> is a song by -> Coldplay
Coldplay -> is a -> British rock band
Coldplay -> formed in -> 1996
</index>
<reasoning>The band is known but the year needs checking. Judgment: insufficient</reasoning>
<query>When was Coldplay formed?</query>"""

PASSAGES = [ScoredPassage(id=f"p{i}", title=f"Title {i}", text="word " * 100, score=1.0 - i / 10) for i in range(5)]


class FixedRetriever:
    name = "fixed"

    def search(self, queries, k):
        return [PASSAGES[:k] for _ in queries]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    questions = [Question(id=str(i), question=f"Question number {i} about a song?") for i in range(args.questions)]
    loop = KairLoop(ScriptedLLM(lambda m: OUTPUT), FixedRetriever(),
                    LoopConfig(max_steps=args.steps, top_k=5, round_size=256))
    t0 = time.perf_counter()
    traces = loop.run(questions)
    elapsed = time.perf_counter() - t0
    steps = sum(len(t.steps) for t in traces)
    calls = steps + len(traces)  # step calls plus one answer call per question
    print(f"questions={len(traces)} steps={steps} answer_calls={len(traces)} elapsed={elapsed:.2f}s")
    print(f"overhead per step (incl. its share of the answer call): {elapsed / steps * 1e6:.0f} us")
    print(f"overhead per LLM call: {elapsed / calls * 1e6:.0f} us   target < 1000 us per step: "
          f"{'met' if elapsed / steps < 1e-3 else 'NOT met'}")


if __name__ == "__main__":
    main()
