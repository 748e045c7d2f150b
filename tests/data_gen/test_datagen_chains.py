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
