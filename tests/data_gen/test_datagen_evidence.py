"""2Wiki evidence scores (official strict triples, relaxed entity pairs) on hand-made indexes."""

from __future__ import annotations

import pytest

from data_gen.evidence import index_evidence, normalize_evidence, score_evidence, summarize_evidence
from data_gen.quality import summarize_quality, trajectory_quality
from kair_runtime.records import Index, Question, Step, Trace

GOLD = [["Free Guy", "director", "Shawn Levy"], ["Shawn Levy", "date of birth", "July 23, 1968"]]


def trace(index: Index, evidences=GOLD, extra=None) -> Trace:
    q = Question(id="q1", question="When was the director of Free Guy born?", answers=["July 23, 1968"],
                 dataset="2wikimultihopqa", metadata={"evidences": evidences} if evidences else {})
    step = Step(step=1, query="q", retrieved=[], prompt=[], raw_output="", index=index, reasoning="",
                judgment="sufficient", next_query="")
    return Trace(question=q, index_format=index.format, method="kair", steps=[step],
                 extra=extra if extra is not None else {"teacher": "silver"})


def test_normalisation_is_the_official_one_lowercase_no_punctuation_articles_kept():
    assert normalize_evidence("  July 23,  1968 ") == "july 23 1968"
    assert normalize_evidence("What Will You Do When You Catch Me?") == "what will you do when you catch me"
    assert normalize_evidence("The Zone") == "the zone"  # the answer metric would drop "the"
    assert normalize_evidence("Montreal, Quebec") != normalize_evidence("Montreal Quebec Canada")


def test_strict_and_relaxed_differ_when_the_relation_words_differ():
    pred = [["free guy", "directed by", "Shawn Levy"],  # pair right, relation words free
            ["Shawn Levy", "Date of Birth", "July 23 1968"],  # exact after normalisation
            ["Free Guy", "cast member", "Ryan Reynolds"]]  # not gold
    strict = score_evidence(pred, GOLD, strict=True)
    assert (strict.matched, strict.predicted, strict.gold) == (1, 3, 2)
    assert strict.precision == pytest.approx(1 / 3) and strict.recall == 0.5
    assert strict.f1 == pytest.approx(0.4) and strict.em == 0.0
    relaxed = score_evidence(pred, GOLD, strict=False)
    assert (relaxed.matched, relaxed.predicted, relaxed.gold) == (2, 3, 2)
    assert relaxed.precision == pytest.approx(2 / 3) and relaxed.recall == 1.0
    assert relaxed.f1 == pytest.approx(0.8) and relaxed.em == 0.0
    assert score_evidence(pred[:2], GOLD, strict=False).em == 1.0
    # A reversed pair is not the gold pair; duplicates after normalisation are one prediction.
    rev = score_evidence([["Shawn Levy", "director of", "Free Guy"]], GOLD, strict=False)
    assert rev.matched == 0
    dup = score_evidence([["Free Guy", "director", "Shawn Levy"], ["free guy", "Director", "Shawn Levy."]], GOLD, True)
    assert (dup.matched, dup.predicted, dup.precision) == (1, 1, 1.0)


def test_no_prediction_scores_zero_and_relaxed_counts_distinct_gold_pairs():
    empty = score_evidence([], GOLD, strict=True)
    assert (empty.precision, empty.recall, empty.f1, empty.em) == (0.0, 0.0, 0.0, 0.0)
    two_relations = [["A", "director", "B"], ["A", "producer", "B"]]
    assert score_evidence([["A", "made", "B"]], two_relations, strict=False).as_dict()["recall"] == 1.0
    assert score_evidence([["A", "director", "B"]], two_relations, strict=True).recall == 0.5
    with pytest.raises(ValueError, match="predicted evidence: an evidence triple should be"):
        score_evidence([["A", "B"]], GOLD, strict=True)


def test_formats_without_relations_are_na_and_questions_without_evidences_are_counted_apart():
    facts = Index("facts", facts=["Free Guy is a film directed by Shawn Levy."])
    assert index_evidence(facts, GOLD).status == "no relations"
    kr = Index("kr", keywords=["Free Guy"], relations=[["Free Guy", "director", "Shawn Levy"]])
    assert index_evidence(kr, []).status == "no gold"
    only_na = summarize_evidence([index_evidence(facts, GOLD), index_evidence(kr, [])])
    assert only_na["evidence_strict_f1"] == "n/a" and only_na["evidence_relaxed_em"] == "n/a"
    assert (only_na["evidence_n"], only_na["evidence_na"], only_na["evidence_no_gold"]) == (0, 1, 1)
    mixed = summarize_evidence([index_evidence(kr, GOLD), index_evidence(facts, GOLD), index_evidence(kr, [])])
    assert mixed["evidence_n"] == 1 and mixed["evidence_na"] == 1 and mixed["evidence_no_gold"] == 1
    assert mixed["evidence_strict_precision"] == 1.0 and mixed["evidence_strict_recall"] == 0.5
    assert mixed["evidence_strict_f1"] == round(2 / 3, 4)
    assert summarize_evidence([index_evidence(kr, [])])["evidence_strict_f1"] is None


def test_quality_rows_carry_the_evidence_scores_and_group_eval_traces_by_method_and_model():
    kr = Index("kr", relations=[["Free Guy", "directed by", "Shawn Levy"], ["Shawn Levy", "date of birth", "1968"]])
    q = trajectory_quality(trace(kr))
    assert q.evidence_status == "scored" and q.evidence_strict["matched"] == 0 and q.evidence_relaxed["matched"] == 1
    eval_trace = trace(Index("kr", relations=[["Free Guy", "director", "Shawn Levy"]]),
                       extra={"llm": "hf:tiny", "retriever": "bm25"})
    rows = {r["source"]: r for r in summarize_quality([trace(kr), eval_trace, trace(Index("keywords"), evidences=[])])}
    assert set(rows) == {"silver", "kair:hf:tiny"}
    assert rows["silver"]["evidence_n"] == 1 and rows["silver"]["evidence_no_gold"] == 1
    assert rows["silver"]["evidence_relaxed_f1"] == 0.5 and rows["silver"]["evidence_strict_f1"] == 0.0
    assert rows["kair:hf:tiny"]["evidence_strict_precision"] == 1.0 and rows["kair:hf:tiny"]["evidence_strict_em"] == 0.0
