"""bench/answer_reach.py: a question counts as reached when a gold answer is in its final prompt,
and its F1 lands in the matching column."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import answer_reach  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / "eval_scripted" / "musique" / "kair.jsonl"


def test_answers_in_the_final_prompt_are_counted_and_split_the_f1(tmp_path, monkeypatch, capsys):
    first, second = (json.loads(line) for line in GOLDEN.read_text(encoding="utf-8").splitlines()[:2])
    prompt = " ".join(m["content"] for m in first["final_prompt"])
    word = next(w for w in prompt.split() if w.isalpha() and len(w) > 6)
    first["question"]["answers"], first["answer"] = [word], word  # in the prompt, answered right
    second["question"]["answers"], second["answer"] = ["Zyxwvut Qponml"], "Stanley"  # nowhere, answered wrong
    run = tmp_path / "run"
    (run / "traces" / "musique").mkdir(parents=True)
    (run / "traces" / "musique" / "tuned-kair.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in (first, second)), encoding="utf-8")

    assert answer_reach.holds_answer(f"... {word.upper()}, ...", [word])
    assert not answer_reach.holds_answer(prompt, ["Zyxwvut Qponml"])
    monkeypatch.setattr(sys, "argv", ["answer_reach.py", str(run)])
    answer_reach.main()
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[1:] == ["musique", "2", "1", row[4], "100.0", "0.0"]
