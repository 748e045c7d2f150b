"""bench/comparison_choice.py: a question that names its gold answer among " or " options is
counted, and the student's answer lands as gold, the other option or something else."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import comparison_choice  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / "eval_scripted" / "musique" / "kair.jsonl"


def test_named_options_are_counted_by_what_the_student_picked(tmp_path, monkeypatch, capsys):
    records = [json.loads(line) for line in GOLDEN.read_text(encoding="utf-8").splitlines()[:4]]
    cases = [
        ("Who is older, Alma Berg or Carl Dunn?", "Carl Dunn", "Alma Berg"),  # the other option, named first
        ("Which came first, The Red Door or Blue Sky?", "The Red Door", "the red door"),  # gold, named first
        ("Who is taller, Eve Fox or Gus Hill?", "Gus Hill", "Ian Jones"),  # neither option
        ("Where was Carl Dunn born?", "Stanley", "Stanley"),  # names no option: the rest
    ]
    for record, (question, gold, answer) in zip(records, cases, strict=True):
        record["question"]["question"], record["question"]["answers"], record["answer"] = question, [gold], answer
    # the first question's final index states an outcome, the wrong one, as its answer says
    records[0]["steps"][-1]["index"]["relations"].append(["Alma Berg", "is older rather than", "Carl Dunn"])
    run = tmp_path / "run"
    (run / "traces" / "musique").mkdir(parents=True)
    (run / "traces" / "musique" / "tuned-kair.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")

    assert comparison_choice.named_gold("Are both X and Y from Z, or not?", ["no"]) is None
    monkeypatch.setattr(sys, "argv", ["comparison_choice.py", str(run)])
    comparison_choice.main()
    row = capsys.readouterr().out.splitlines()[1].split()
    # named, gold, other, else, picks 1st, gold 1st, stated, stated gold, both, F1 named, F1 rest
    assert row[1:] == ["musique", "3", "1", "1", "1", "2", "1", "1", "0", "1", "33.3", "100.0"]
