"""A tiny real retriever for tests: word overlap over a handful of passages about bands."""

from __future__ import annotations

import dataclasses
import re

from kair_runtime.records import ScoredPassage

CORPUS = [ScoredPassage(id=f"p{i}", title=t, text=x, score=0.0) for i, (t, x) in enumerate([
    ("Lost!", "Lost! is a song by the British rock band Coldplay."),
    ("Coldplay", "Coldplay is a British rock band formed in London in 1996."),
    ("Viva la Vida", "Viva la Vida is an album by Coldplay released in 2008."),
    ("London", "London is the capital of England."),
    ("Oasis", "Oasis was an English rock band formed in Manchester in 1991."),
    ("Manchester", "Manchester is a city in North West England."),
    ("Wonderwall", "Wonderwall is a song by Oasis."),
    ("Blur", "Blur are an English rock band formed in London in 1988."),
])]


class WordOverlap:
    """A tiny real retriever: rank by shared lowercase words, ties by corpus order."""

    name = "word-overlap"

    def __init__(self, passages=CORPUS):
        self.passages = passages
        self.calls: list[int] = []

    def search(self, queries, k):
        self.calls.append(len(queries))
        out = []
        for q in queries:
            qw = set(re.findall(r"\w+", q.lower()))
            scored = [(len(qw & set(re.findall(r"\w+", (p.title + " " + p.text).lower()))), -i, p)
                      for i, p in enumerate(self.passages)]
            scored = sorted((s for s in scored if s[0] > 0), key=lambda s: (s[0], s[1]), reverse=True)
            out.append([dataclasses.replace(p, score=float(s)) for s, _, p in scored[:k]])
        return out
