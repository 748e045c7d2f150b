"""2Wiki evidence scores of an index's relations, as 2WikiMultihopQA's official evaluator scores evidence.

    kair datagen quality runs/datagen/silver     (the "evidence" columns of quality.md / quality.json)

The official evaluator (Alab-NII/2wikimultihop, evaluation script) scores a question's predicted
evidence triples against its gold `evidences`:

    normalise   every string lowercased, ASCII punctuation removed, whitespace collapsed; articles
                are kept (unlike the answer normalisation)
    match       the predicted triples form a set; a predicted triple counts when it equals a gold
                triple exactly, relation included
    score       precision = matched / predicted (0 with no prediction), recall = matched / gold,
                F1 from the two, EM = 1 when matched == predicted == gold; each metric is averaged
                over questions

Here the prediction is the final index's relations (K&R: [head, relation, tail]). Two scores:

    strict      the official match, relation included. The official script also accepts Wikidata
                aliases of subject and object (id_aliases.json, not in ../shared/data), so strict
                here is a lower bound of the official figure.
    relaxed     the relation is ignored: (subject, object) pairs, same normalisation, distinct gold
                pairs. Our relation words are free text ("directed by" vs "director"), so this is
                the part of the evidence the index anchored.

Formats without relations (text, keywords, facts, kf, none) get no score (n/a, counted apart, not 0);
questions without gold evidences are left out of the means and counted.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from kair_runtime.records import Index

# The index formats whose records keep [head, relation, tail] relations (kair_runtime.index).
RELATION_FORMATS = frozenset({"kr"})
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_evidence(s: str) -> str:
    return " ".join(s.lower().translate(_PUNCT).split())


@dataclass
class EvidenceScore:
    matched: int
    predicted: int
    gold: int

    @property
    def precision(self) -> float:
        return self.matched / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.matched / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def em(self) -> float:
        return float(self.matched == self.predicted == self.gold)

    def as_dict(self) -> dict[str, float | int]:
        return {"matched": self.matched, "predicted": self.predicted, "gold": self.gold,
                "precision": self.precision, "recall": self.recall, "f1": self.f1, "em": self.em}


def _key(triple: Sequence[str], strict: bool, where: str) -> tuple[str, ...]:
    if len(triple) != 3:
        raise ValueError(f"{where}: an evidence triple should be [subject, relation, object], got {list(triple)!r}")
    s, r, o = (normalize_evidence(str(x)) for x in triple)
    return (s, r, o) if strict else (s, o)


def score_evidence(predicted: Sequence[Sequence[str]], gold: Sequence[Sequence[str]], strict: bool) -> EvidenceScore:
    """One question's score. Strict keeps the official count of gold triples (a list: a repeated
    gold triple counts twice); relaxed counts distinct gold pairs, since two gold relations between
    the same entities are one pair."""
    pred = {_key(t, strict, "predicted evidence") for t in predicted}
    gold_keys = [_key(t, strict, "gold evidence") for t in gold]
    if not strict:
        gold_keys = list(dict.fromkeys(gold_keys))
    gold_set = set(gold_keys)
    return EvidenceScore(matched=sum(p in gold_set for p in pred), predicted=len(pred), gold=len(gold_keys))


@dataclass
class IndexEvidence:
    """An index's evidence scores; status says why they are absent."""

    status: str  # "scored" | "no relations" (format keeps none: n/a) | "no gold" (question lacks evidences)
    strict: EvidenceScore | None = None
    relaxed: EvidenceScore | None = None


def index_evidence(index: Index, gold: Sequence[Sequence[str]]) -> IndexEvidence:
    if not gold:
        return IndexEvidence("no gold")
    if index.format not in RELATION_FORMATS:
        return IndexEvidence("no relations")
    return IndexEvidence("scored", score_evidence(index.relations, gold, strict=True),
                         score_evidence(index.relations, gold, strict=False))


def summarize_evidence(scores: Sequence[IndexEvidence]) -> dict[str, float | int | str | None]:
    """Means over the scored questions (the official evaluator's per-question average), and the
    counts left out: formats without relations (n/a) and questions without gold evidences."""
    scored = [s for s in scores if s.status == "scored"]
    na = sum(s.status == "no relations" for s in scores)
    row: dict[str, float | int | str | None] = {"evidence_n": len(scored), "evidence_na": na,
                                                "evidence_no_gold": sum(s.status == "no gold" for s in scores)}
    for kind in ("strict", "relaxed"):
        for metric in ("precision", "recall", "f1", "em"):
            vals = [getattr(getattr(s, kind), metric) for s in scored]
            # n/a (a string, not 0) when the questions had gold evidence but no index could hold it.
            row[f"evidence_{kind}_{metric}"] = round(sum(vals) / len(vals), 4) if vals else ("n/a" if na else None)
    return row
