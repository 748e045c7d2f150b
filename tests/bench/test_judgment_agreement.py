"""bench/judgment_agreement.py: a student's judgments on relabelled step prompts against the chain's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import judgment_agreement  # noqa: E402

from kair_runtime.llm.scripted import ScriptedLLM  # noqa: E402


def step(judged: str) -> str:
    query = "none" if judged == "sufficient" else "the next hop"
    return (f"<index>\nKeywords: A\nRelationships:\n</index>\n<reasoning>So. Judgment: {judged}</reasoning>\n"
            f"<query>{query}</query>")


def test_a_student_that_always_stops_agrees_only_where_the_chain_stops(tmp_path):
    targets = ["sufficient", "insufficient", "insufficient"]
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": step(t)}],
             "source": "relabelled: student", "kind": "update", "question_id": str(i)} for i, t in enumerate(targets)]
    rows.append(dict(rows[0], source="annotations"))  # silver: not the student's state, left out
    rows.append(dict(rows[0], kind="answer", source="relabelled: student"))
    path = tmp_path / "validation.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    picked = judgment_agreement.step_rows(path)
    assert len(picked) == 3
    counts = judgment_agreement.agreement(picked, ScriptedLLM(lambda m: step("sufficient")), 64)
    assert counts == {("sufficient", "sufficient"): 1, ("insufficient", "sufficient"): 2}
