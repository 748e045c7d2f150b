"""Answer metrics (EM, F1, Acc) and their aggregation over a run.

Normalization and EM/F1 follow the official HotpotQA scorer (`hotpot_evaluate_v1.py`), which
itself extends the SQuAD v1.1 scorer; we reimplement it rather than import it so results match
the numbers papers report:

    normalize(s) = collapse_whitespace(drop_articles(drop_punctuation(lowercase(s))))

- lowercase: `str.lower()`, so unicode letters fold too ("Café" -> "café").
- punctuation: only ASCII `string.punctuation` is removed; unicode punctuation ("’", "–")
  stays, exactly like the official scorer. Removing it glues words: "U.S." -> "us".
- articles: whole words a/an/the become a space (regex `\\b(a|an|the)\\b`, after punctuation).
- whitespace: `" ".join(s.split())`.

EM(p, g) = 1 if normalize(p) == normalize(g). Two empty strings are equal, so EM("", "") = 1.

F1(p, g) = harmonic mean of token precision and recall over the bag of normalized tokens,
with HotpotQA's rule for yes/no questions: if either normalized string is one of
"yes" / "no" / "noanswer" and the two differ, F1 is 0 (otherwise "no" vs "no way" would earn
partial credit). No shared token gives 0, so F1("", "") = 0 (the official scorer's behaviour,
unlike SQuAD v2's, which gives 1).

Acc(p, g) = 1 if normalize(g) occurs as a substring of normalize(p) (FlashRAG's "cover" accuracy,
reported here for long, chatty answers; the KAIR paper reports F1 and EM only, section 4). A gold that normalizes to "" would be
contained in every prediction, so for it Acc falls back to EM.

Each metric is maxed over all gold strings (aliases included). `aggregate` reports means x100
with EVERY question in the denominator: a question whose run failed scores 0 on every metric
and is counted in `failed`, so a crashing method cannot look better by dropping questions.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

from kair_runtime.records import Trace

MetricFn = Callable[[str, str], float]  # (prediction, one gold) -> score in [0, 1]

METRICS: dict[str, MetricFn] = {}

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = frozenset({"yes", "no", "noanswer"})


def metric(name: str) -> Callable[[MetricFn], MetricFn]:
    """Register a metric under `name` so runs and reports can ask for it by name."""
    def register(fn: MetricFn) -> MetricFn:
        if name in METRICS:
            raise ValueError(f"metric {name!r} is already registered")
        METRICS[name] = fn
        return fn
    return register


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


@metric("em")
def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


@metric("f1")
def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


@metric("acc")
def cover_accuracy(prediction: str, gold: str) -> float:
    ref = normalize_answer(gold)
    if not ref:
        return exact_match(prediction, gold)
    return float(ref in normalize_answer(prediction))


def score(prediction: str, golds: list[str], metrics: Iterable[str] | None = None) -> dict[str, float]:
    """Each metric's best value over the gold strings, in [0, 1]."""
    if isinstance(golds, str):  # a bare string would be scored per character
        raise TypeError("golds must be a list of strings, not a string")
    if not golds:
        raise ValueError("cannot score against an empty list of gold answers")
    names = list(metrics) if metrics is not None else list(METRICS)
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise KeyError(f"unknown metric(s) {unknown}; choose from {sorted(METRICS)}")
    return {n: max(METRICS[n](prediction, g) for g in golds) for n in names}


@dataclass
class QuestionScore:
    """One question's scores in [0, 1]; a failed run (error set) has every score at 0."""

    id: str
    scores: dict[str, float]
    error: str | None = None
    prediction: str = ""
    answers: list[str] = field(default_factory=list)


def score_question(id: str, prediction: str, golds: list[str], error: str | None = None,
                   metrics: Iterable[str] | None = None) -> QuestionScore:
    names = list(metrics) if metrics is not None else list(METRICS)
    if error is not None:
        return QuestionScore(id, {n: 0.0 for n in names}, error, prediction, list(golds))
    return QuestionScore(id, score(prediction, golds, names), None, prediction, list(golds))


def score_trace(trace: Trace, metrics: Iterable[str] | None = None) -> QuestionScore:
    q = trace.question
    if not q.answers and trace.error is None:
        raise ValueError(f"question {q.id!r} ({q.dataset or 'no dataset'}) has no gold answers to score")
    return score_question(q.id, trace.answer, q.answers, trace.error, metrics)


def aggregate(scores: Iterable[QuestionScore]) -> dict[str, float]:
    """Means x100 over every question, failed ones included as 0.

    Returns {"n": questions, "failed": runs with an error, <metric>: mean x100, ...}.
    """
    rows = list(scores)
    seen: set[str] = set()
    for r in rows:
        if r.id in seen:  # a question scored twice would be weighted twice
            raise ValueError(f"question {r.id!r} appears more than once in the scores")
        seen.add(r.id)
    names = list(rows[0].scores) if rows else list(METRICS)
    for r in rows:
        if list(r.scores) != names:
            raise ValueError(f"question {r.id!r} has metrics {list(r.scores)}, expected {names}")
    n = len(rows)
    summary: dict[str, float] = {"n": n, "failed": sum(r.error is not None for r in rows)}
    for name in names:
        summary[name] = 100.0 * sum(r.scores[name] for r in rows) / n if n else 0.0
    return summary


def evaluate_traces(traces: Iterable[Trace], metrics: Iterable[str] | None = None) -> dict[str, float]:
    """Score and aggregate a run's traces in one call."""
    names = list(metrics) if metrics is not None else None
    return aggregate(score_trace(t, names) for t in traces)


def format_validity(traces: Iterable[Trace]) -> float | None:
    """The share (x100) of KAIR steps whose index, judgment and query all came from the model
    (`Step.parsed_ok`: no format repair), over the traces of an index-keeping method.

        format_validity = sum(valid steps) / sum(max(steps, 1)) over those traces

    Every question is in the denominator with at least one step: a question that failed (a
    backend error, say) before its first step recorded none, and counts as 0 valid steps out of
    1, so an outage lowers the figure instead of dropping out of it. A question that failed later
    counts the steps it recorded. None when no trace keeps an index (vanilla and the baselines).
    """
    valid = expected = 0
    for t in traces:
        if not t.index_format or t.index_format == "none":
            continue
        valid += sum(s.parsed_ok for s in t.steps)
        expected += max(len(t.steps), 1)
    return 100.0 * valid / expected if expected else None
