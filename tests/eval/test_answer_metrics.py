"""EM / F1 / Acc against hand-computed cases, and aggregation with failed questions."""

from __future__ import annotations

import pytest

from eval.metrics import (METRICS, QuestionScore, aggregate, evaluate_traces, normalize_answer, score,
                          score_question, score_trace)
from kair_runtime.records import Question, Trace


def test_registry_has_the_three_metrics():
    assert {"em", "f1", "acc"} <= set(METRICS)


@pytest.mark.parametrize("raw, normalized", [
    ("The Beatles!", "beatles"),          # lower, "!" dropped, article "the" dropped
    ("an apple a day", "apple day"),      # every whole-word article goes
    ("Theatre", "theatre"),               # "the" inside a word stays
    ("U.S.A.", "usa"),                    # ASCII punctuation removed, letters glued
    ("  New\tYork \n City ", "new york city"),
    ("CAFÉ MÜLLER", "café müller"),       # unicode lowercases, accents are kept
    ("Ruth’s", "ruth’s"),                 # unicode apostrophe is not ASCII punctuation
    ("The", ""),
])
def test_normalization(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_exact_match_after_normalization():
    assert score("The Beatles!", ["beatles"])["em"] == 1.0
    assert score("U.S.A.", ["USA"])["em"] == 1.0
    assert score("Café Müller", ["cafe muller"])["em"] == 0.0  # no accent folding
    assert score("Ruth’s", ["Ruths"])["em"] == 0.0  # "’" survives, "'" would not
    assert score("Ruth's", ["Ruths"])["em"] == 1.0


def test_partial_f1():
    # pred tokens [barack, obama, was, president] (4), gold [obama] (1), common 1
    # P = 1/4, R = 1/1, F1 = 2 * 0.25 * 1 / 1.25 = 0.4
    s = score("Barack Obama was president", ["Obama"])
    assert s["f1"] == pytest.approx(0.4)
    assert s["em"] == 0.0
    assert s["acc"] == 1.0  # "obama" is contained in the prediction


def test_f1_counts_repeated_tokens_once_per_match():
    # pred "the the cat cat cat" -> [cat, cat, cat]; gold [cat, cat]; common min(3, 2) = 2
    # P = 2/3, R = 2/2, F1 = 2 * (2/3) / (5/3) = 0.8
    assert score("the the cat cat cat", ["cat cat"])["f1"] == pytest.approx(0.8)


def test_max_over_golds():
    # vs "new york": common 2, P = 2/3, R = 1, F1 = 0.8; vs "NYC": 0. Best: 0.8.
    s = score("New York City", ["NYC", "New York"])
    assert s == pytest.approx({"em": 0.0, "f1": 0.8, "acc": 1.0})
    # an alias matching exactly gives EM 1 even if the main answer does not
    assert score("G. Stanley Hall", ["Stanley Hall", "G. Stanley Hall"])["em"] == 1.0


def test_yes_no_rule():
    assert score("no", ["no"]) == {"em": 1.0, "f1": 1.0, "acc": 1.0}
    assert score("Yes.", ["no"])["f1"] == 0.0
    # token overlap alone would give P = 1/2, R = 1, F1 = 2/3; the yes/no rule makes it 0
    assert score("no way", ["no"])["f1"] == 0.0
    assert score("yes", ["yes it is"])["f1"] == 0.0  # the rule applies on the prediction side too
    # Acc is a substring test, so "no" is covered by "no way" (and by "know": a known looseness)
    assert score("no way", ["no"])["acc"] == 1.0


def test_empty_prediction_and_empty_gold():
    assert score("", ["Paris"]) == {"em": 0.0, "f1": 0.0, "acc": 0.0}
    # official scorer: EM("", "") is True, F1 has no shared token so 0; Acc falls back to EM
    assert score("", [""]) == {"em": 1.0, "f1": 0.0, "acc": 1.0}
    assert score("Paris", ["the"]) == {"em": 0.0, "f1": 0.0, "acc": 0.0}  # gold normalizes to ""


def test_bad_gold_lists_are_errors():
    with pytest.raises(ValueError, match="empty list"):
        score("x", [])
    with pytest.raises(TypeError, match="list of strings"):
        score("x", "x")
    with pytest.raises(KeyError, match="unknown metric"):
        score("x", ["x"], metrics=["bleu"])


def test_aggregate_keeps_failed_questions_in_the_denominator():
    rows = [
        score_question("q1", "Paris", ["Paris"]),                         # EM 1, F1 1
        score_question("q2", "Barack Obama was president", ["Obama"]),    # EM 0, F1 0.4
        score_question("q3", "Paris", ["Paris"], error="backend died"),   # failed: 0 despite a right answer
    ]
    summary = aggregate(rows)
    assert summary["n"] == 3 and summary["failed"] == 1
    assert summary["em"] == pytest.approx(100 * 1 / 3)            # (1 + 0 + 0) / 3
    assert summary["f1"] == pytest.approx(100 * (1 + 0.4) / 3)    # 46.67
    assert summary["acc"] == pytest.approx(100 * 2 / 3)           # q1 and q2 cover, q3 failed


def test_aggregate_rejects_duplicates_and_mixed_metrics():
    with pytest.raises(ValueError, match="more than once"):
        aggregate([score_question("q", "a", ["a"]), score_question("q", "b", ["b"])])
    with pytest.raises(ValueError, match="expected"):
        aggregate([score_question("a", "a", ["a"], metrics=["em"]), score_question("b", "b", ["b"])])
    assert aggregate([])["n"] == 0


def test_traces_are_scored_with_their_answers_and_errors():
    traces = [
        Trace(question=Question(id="a", question="?", answers=["Stanley Hall", "G. Stanley Hall"]), answer="G. Stanley Hall"),
        Trace(question=Question(id="b", question="?", answers=["1996"]), answer="", error="timeout"),
    ]
    assert score_trace(traces[0]) == QuestionScore("a", {"em": 1.0, "f1": 1.0, "acc": 1.0}, None,
                                                   "G. Stanley Hall", ["Stanley Hall", "G. Stanley Hall"])
    summary = evaluate_traces(traces, metrics=["em"])
    assert summary == {"n": 2, "failed": 1, "em": 50.0}
    with pytest.raises(ValueError, match="no gold answers"):
        score_trace(Trace(question=Question(id="c", question="?", answers=[]), answer="x"))
