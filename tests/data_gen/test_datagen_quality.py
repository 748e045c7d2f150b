"""Index quality metrics on small hand-made trajectories (no data files needed)."""

from __future__ import annotations

from data_gen.quality import fuzzy_match, summarize_quality, trajectory_quality
from kair_runtime.records import Index, Question, Step, Trace

EVIDENCES = [["Free Guy", "director", "Shawn Levy"], ["Shawn Levy", "date of birth", "July 23, 1968"]]


def step(n: int, index: Index) -> Step:
    return Step(step=n, query="q", retrieved=[], prompt=[], raw_output="", index=index, reasoning="",
                judgment="insufficient", next_query="q")


def trace(steps: list[Index], answers=("July 23, 1968",), meta=None, teacher="t") -> Trace:
    q = Question(id="q1", question="When was the director of Free Guy born?", answers=list(answers),
                 dataset="2wikimultihopqa", metadata=meta if meta is not None else {"evidences": EVIDENCES})
    return Trace(question=q, index_format=steps[0].format, steps=[step(i, ix) for i, ix in enumerate(steps, 1)],
                 extra={"teacher": teacher})


def test_fuzzy_match_is_normalized_token_f1_or_containment():
    assert fuzzy_match("G. Stanley Hall", "Stanley Hall")
    assert fuzzy_match("the Beatles", "Beatles")
    assert fuzzy_match("Montreal, Quebec", "Montreal Quebec Canada")  # F1 0.8
    assert not fuzzy_match("Paris", "London") and not fuzzy_match("", "x")


def test_recall_of_entities_and_triples_and_the_answer_step():
    first = Index("kr", keywords=["Free Guy", "shawn levy"], relations=[["Free Guy", "directed by", "Shawn Levy"]])
    final = Index("kr", keywords=["Free Guy", "Shawn Levy", "1968"],
                  relations=[["Free Guy", "directed by", "Shawn Levy"], ["Levy", "born", "23 July 1968"]])
    q = trajectory_quality(trace([first, final]))
    assert (q.entities, q.entities_found) == (3, 3)  # Free Guy, Shawn Levy, and "1968" inside the date
    assert (q.triples, q.triples_found) == (2, 2)  # relation words are free; "23 July 1968" ~ "July 23, 1968"
    assert q.answer_step is None  # the exact date never appears in the index text ("23 July 1968" differs)
    later = Index("kr", keywords=["July 23, 1968"], relations=[])
    assert trajectory_quality(trace([first, later])).answer_step == 2
    wrong_tail = Index("kr", keywords=[], relations=[["Free Guy", "director", "Ryan Reynolds"]])
    assert trajectory_quality(trace([wrong_tail])).triples_found == 0


def test_formats_without_keywords_match_the_index_text_and_have_no_triple_recall():
    facts = Index("facts", facts=["Free Guy is a film directed by Shawn Levy."])
    q = trajectory_quality(trace([facts]))
    assert q.entities_found == 2 and q.triple_recall is None


def test_gold_entities_from_each_benchmark_and_the_summary():
    musique = {"decomposition": [{"answer": "American Psychological Association"}, {"answer": "G. Stanley Hall"}],
               "supporting_titles": ["Journal of Psychotherapy Integration", "Adolescence"]}
    ix = Index("kr", keywords=["Journal of Psychotherapy Integration", "American Psychological Association"])
    q = trajectory_quality(trace([ix], answers=["G. Stanley Hall"], meta=musique))
    assert (q.entities, q.entities_found, q.triples) == (4, 2, 0)
    hotpot = {"supporting_titles": ["Lilu (mythology)", "Alû"]}
    q = trajectory_quality(trace([Index("kr", keywords=["Lilu"])], answers=["yes"], meta=hotpot))
    assert (q.entities, q.entities_found, q.answer_eligible) == (2, 1, False)  # "(mythology)" dropped; yes/no
    rows = summarize_quality([trace([ix], answers=["G. Stanley Hall"], meta=musique, teacher="a"),
                              trace([Index("kr", keywords=["Free Guy"])], teacher="b")])
    assert [(r["source"], r["n"], r["entity_recall"]) for r in rows] == [("a", 1, 0.5), ("b", 1, round(1 / 3, 4))]


def test_failed_trajectories_are_counted_and_left_out_of_the_means():
    good = trace([Index("kr", keywords=["Free Guy", "Shawn Levy", "July 23, 1968"])])
    failed = trace([Index("kr")])
    failed.error = "BackendError: engine died"
    rows = summarize_quality([good, failed])
    assert len(rows) == 1 and rows[0]["n"] == 1 and rows[0]["failed"] == 1
    assert rows[0]["entity_recall"] == 1.0  # 0.5 if the failed trajectory's empty index counted
    only_failed = summarize_quality([failed])
    assert only_failed[0]["n"] == 0 and only_failed[0]["failed"] == 1 and only_failed[0]["entity_recall"] is None
