"""Gold chains per benchmark (data_gen/chains.py): the hops a silver trajectory replays."""

from __future__ import annotations

from data_gen.chains import demo_chain, with_passages
from kair_runtime.demo_data import load_demo_corpus, load_demo_questions


def test_demo_chain_follows_the_gold_decomposition():
    passages = {p.id: p for p in load_demo_corpus()}
    q = with_passages(load_demo_questions("train")[:1], passages)[0]
    hops = demo_chain(q, None)
    assert [h.doc_ids for h in hops] == [[pid] for pid in q.metadata["supporting_ids"]]
    assert hops[0].queries[0] == q.metadata["decomposition"][0]["question"]
    # Every evidence triple lands on exactly one hop; the first hop's object is its answer.
    assert sum(len(h.triples) for h in hops) == len(q.metadata["evidences"])
    assert hops[0].triples[0][2].lower().endswith("glass herons")


def test_an_a_or_b_outcome_names_the_answer_what_was_compared_and_the_other_option():
    from data_gen.chains import Hop, outcome
    from kair_runtime.records import Question

    def said(question, answer, titles):
        hops = [Hop(title=t, doc_ids=[], queries=[]) for t in titles]
        return outcome(Question(id="q", question=question, answers=[answer], dataset="d"), hops)

    passages = {p.id: p for p in load_demo_corpus()}
    q = next(q for q in with_passages(load_demo_questions("train"), passages) if q.metadata["type"] == "comparison")
    assert outcome(q, demo_chain(q, None)) == ["The Glass Herons", "was formed earlier rather than", "Tinfoil Saints"]
    # the options among the chain's entities (a title's disambiguation dropped); the words before them
    assert said("Which film was released earlier, Crime After Crime (Film) or The Mayor Of 44Th Street?",
                "The Mayor Of 44Th Street", ["Crime After Crime (film)", "The Mayor of 44th Street", "Edward Ludwig"]) \
        == ["The Mayor Of 44Th Street", "was released earlier rather than", "Crime After Crime"]
    assert said("Which Genus has more species Eucryphia or Lepidozamia ?", "Eucryphia", ["Lepidozamia", "Eucryphia"]) \
        == ["Eucryphia", "has more species rather than", "Lepidozamia"]
    assert said("Who was born first out of Arthur Schneider and Julien Cardy?", "Julien Cardy",
                ["Arthur Schneider", "Julien Cardy"]) == ["Julien Cardy", "was born first rather than", "Arthur Schneider"]
    # nothing before the options: the words after them
    assert said("Was Diego Lugano or John R. Gunn born first?", "John R. Gunn", ["Diego Lugano", "John R. Gunn"]) \
        == ["John R. Gunn", "born first rather than", "Diego Lugano"]
    # HotpotQA's phrasings: an article before an option, "Between A and B, ...", the options first
    assert said("Which plant is larger, the Pterocarya or the Cotula?", "Pterocarya", ["Pterocarya", "Cotula"])[1] \
        == "is larger rather than"
    assert said("Between Iain Banks and Irwin Shaw, which writer has had a more diverse career?", "Irwin Shaw",
                ["Iain Banks", "Irwin Shaw"])[1] == "has had a more diverse career rather than"
    assert said("Little Caesars and Pizza Hut were founded in the 1950s within a year of each other. Which was the "
                "first to serve pizza?", "Pizza Hut", ["Little Caesars", "Pizza Hut"])[1] \
        == "the first to serve pizza rather than"
    # no outcome: a yes/no answer, an answer the question does not name, or not exactly one other option
    assert said("Are Alma Berg and Carl Dunn both painters?", "yes", ["Alma Berg", "Carl Dunn"]) is None
    assert said("Where was Carl Dunn born?", "Stanley", ["Carl Dunn", "Stanley"]) is None
    assert said("Who is older, Alma Berg, Carl Dunn or Eve Fox?", "Eve Fox", ["Alma Berg", "Carl Dunn", "Eve Fox"]) is None
    # ... or words that are not a predicate: a bare preposition (then the words after the options), a clause
    assert said("In Tom Mix or Buck Jones, who was the film star?", "Tom Mix", ["Tom Mix", "Buck Jones"])[1] \
        == "was the film star rather than"
    assert said("Of Tom Mix and Buck Jones, the one born first, the older?", "Tom Mix", ["Tom Mix", "Buck Jones"]) \
        is None
