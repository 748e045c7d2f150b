"""Index quality: how much of the gold evidence a trajectory's index anchored, and when.

Works on any trajectory (teacher or silver) whose question keeps its gold annotations:

    entity recall   gold evidence entities found among the final index's keywords
                    (K&F: its keys; formats without keywords, facts and text: anywhere in the
                    index text). Gold entities: 2Wiki evidence subjects and objects; MuSiQue
                    sub-answers and supporting titles; HotpotQA supporting titles and the
                    answer (not yes/no).
    triple recall   gold (subject, relation, object) triples (2Wiki evidences) matched by an
                    index relation on head and tail; the relation words are free (K&R only).
    answer step     the first step whose index contains a gold answer (yes/no answers and
                    questions never anchoring it are left out of the mean).
    evidence        2Wiki's official evidence precision/recall/F1/EM of the final index's
                    relations, strict (relation included) and relaxed (entity pair); see
                    data_gen.evidence.

A failed trajectory (`error` set: the backend or the loop failed) is counted in `failed` and left
out of every mean: its index says nothing about what the model writes.

Trajectories are grouped by dataset and source: the teacher for generated and silver trajectories,
the method and model for eval run traces (`kair eval` writes traces.jsonl; pass that file).

Matching is normalized (the answer metrics' normalization) and fuzzy: two strings match when
their token F1 is >= 0.5 or one contains the other. A title's disambiguation "(film)" is dropped.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from data_gen.chains import entity_of
from data_gen.evidence import IndexEvidence, index_evidence, summarize_evidence
from eval.metrics import normalize_answer, token_f1
from eval.table import Column, Table
from kair_runtime.index import get_format
from kair_runtime.jsonl import atomic_write_text
from kair_runtime.records import Index, Trace

MATCH_F1 = 0.5


@dataclass
class QualityConfig:
    trajectories: str | None = None  # a trajectory folder or jsonl file (the CLI argument wins)
    out: str | None = None  # the quality.json to write; None: in the trajectory folder


def fuzzy_match(a: str, b: str) -> bool:
    na, nb = normalize_answer(a), normalize_answer(b)
    if not na or not nb:
        return False
    return na in nb or nb in na or token_f1(na, nb) >= MATCH_F1


def gold_entities(trace: Trace) -> list[str]:
    """The entities the gold evidence names, from whichever annotations the question has."""
    m = trace.question.metadata
    if m.get("evidences"):
        ents = [x for s, _, o in m["evidences"] for x in (s, o)]
    elif m.get("decomposition"):
        ents = [d["answer"] for d in m["decomposition"]] + [entity_of(t) for t in m.get("supporting_titles", [])]
    else:
        ents = [entity_of(t) for t in m.get("supporting_titles", [])]
        ents += [a for a in trace.question.answers[:1] if normalize_answer(a) not in ("yes", "no")]
    return list(dict.fromkeys(e for e in ents if normalize_answer(e)))


def gold_triples(trace: Trace) -> list[list[str]]:
    return [list(t) for t in trace.question.metadata.get("evidences", [])]


def index_keywords(index: Index) -> list[str] | None:
    """The index's keyword list, or None for formats that have none (match the text instead)."""
    if index.format in ("kr", "keywords"):
        return list(index.keywords)
    if index.format == "kf":
        return [k for k, _ in index.keyword_facts]
    return None


def entity_found(entity: str, index: Index) -> bool:
    keywords = index_keywords(index)
    if keywords is None:
        return fuzzy_containment(entity, get_format(index.format).linearize(index))
    return any(fuzzy_match(entity, k) for k in keywords)


def fuzzy_containment(needle: str, text: str) -> bool:
    n = normalize_answer(needle)
    return bool(n) and f" {n} " in f" {normalize_answer(text)} "


def answer_in_index(answers: list[str], index: Index) -> bool:
    text = get_format(index.format).linearize(index)
    return any(fuzzy_containment(a, text) for a in answers)


@dataclass
class IndexQuality:
    question_id: str
    dataset: str
    source: str
    entities: int
    entities_found: int
    triples: int
    triples_found: int
    answer_eligible: bool  # a gold answer that can appear in an index (not yes/no)
    answer_step: int | None  # first step whose index contains it
    evidence_status: str  # "scored", "no relations" (n/a) or "no gold"
    evidence_strict: dict[str, Any] | None  # data_gen.evidence.EvidenceScore.as_dict()
    evidence_relaxed: dict[str, Any] | None

    @property
    def entity_recall(self) -> float | None:
        return self.entities_found / self.entities if self.entities else None

    @property
    def triple_recall(self) -> float | None:
        return self.triples_found / self.triples if self.triples else None


def source_of(trace: Trace) -> str:
    """The teacher that wrote a trajectory, or for an eval trace its method and model."""
    if "teacher" in trace.extra:
        return str(trace.extra["teacher"])
    if "llm" in trace.extra:
        return f"{trace.method}:{trace.extra['llm']}"
    return "?"


def final_index(trace: Trace) -> Index:
    return trace.final_index or Index(format=trace.index_format)


def trajectory_quality(trace: Trace) -> IndexQuality:
    return _assess(trace)[0]


def _assess(trace: Trace) -> tuple[IndexQuality, IndexEvidence]:
    """A trajectory's quality and its evidence scores (summaries need the scores as objects)."""
    final = final_index(trace)
    ents = gold_entities(trace)
    # Only K&R indexes hold relations; for the other formats triple recall does not apply.
    triples = gold_triples(trace) if final.format == "kr" else []
    rels = final.relations
    found_t = sum(any(fuzzy_match(h, r[0]) and fuzzy_match(t, r[2]) for r in rels) for h, _, t in triples)
    answers = [a for a in trace.question.answers if normalize_answer(a) not in ("yes", "no", "")]
    step = next((s.step for s in trace.steps if answers and answer_in_index(answers, s.index)), None)
    ev = index_evidence(final, gold_triples(trace))
    q = IndexQuality(question_id=trace.question.id, dataset=trace.question.dataset or "?",
                     source=source_of(trace), entities=len(ents),
                     entities_found=sum(entity_found(e, final) for e in ents), triples=len(triples),
                     triples_found=found_t, answer_eligible=bool(answers), answer_step=step,
                     evidence_status=ev.status, evidence_strict=ev.strict and ev.strict.as_dict(),
                     evidence_relaxed=ev.relaxed and ev.relaxed.as_dict())
    return q, ev


@dataclass
class QualityReport:
    rows: list[dict[str, Any]]  # one per (dataset, source)
    trajectories: list[dict[str, Any]]  # one per trajectory, in input order, failed ones included


def assess_quality(traces: list[Trace]) -> QualityReport:
    """Each trajectory assessed once; the summary rows and the per-trajectory records from it."""
    assessed = [_assess(t) for t in traces]
    per = [asdict(q) | {"failed": t.error is not None} for t, (q, _) in zip(traces, assessed)]
    return QualityReport(_summarize(traces, assessed), per)


def summarize_quality(traces: list[Trace]) -> list[dict[str, Any]]:
    """One row per (dataset, source): means over the trajectories that have each annotation."""
    return assess_quality(traces).rows


def _summarize(traces: list[Trace], assessed: list[tuple[IndexQuality, IndexEvidence]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[tuple[Trace, IndexQuality, IndexEvidence]]] = defaultdict(list)
    failed: dict[tuple[str, str], int] = defaultdict(int)
    for t, (q, ev) in zip(traces, assessed):
        key = (t.question.dataset or "?", source_of(t))
        groups.setdefault(key, [])
        if t.error is not None:
            failed[key] += 1
        else:
            groups[key].append((t, q, ev))
    rows = []
    for (dataset, source), members in sorted(groups.items()):
        qs = [q for _, q, _ in members]
        er = [q.entity_recall for q in qs if q.entity_recall is not None]
        tr = [q.triple_recall for q in qs if q.triple_recall is not None]
        eligible = [q for q in qs if q.answer_eligible]
        steps = [q.answer_step for q in eligible if q.answer_step is not None]
        complete = [t for t, _, _ in members if "complete" in t.extra]
        rows.append({
            "dataset": dataset, "source": source, "n": len(qs), "failed": failed[(dataset, source)],
            "complete": sum(bool(t.extra["complete"]) for t in complete) if complete else None,
            "entity_recall": _mean(er), "triple_recall": _mean(tr), "triples_n": len(tr),
            "answer_in_index": round(len(steps) / len(eligible), 4) if eligible else None,
            "answer_eligible": len(eligible), "mean_answer_step": _mean(steps),
            **summarize_evidence([ev for _, _, ev in members]),
        })
    return rows


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def write_quality(report: QualityReport, out: Path) -> None:
    """quality.json (summary + per trajectory) and quality.md."""
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps({"summary": report.rows, "trajectories": report.trajectories},
                                      indent=2, ensure_ascii=False))
    atomic_write_text(out.with_suffix(".md"), quality_markdown(report.rows))


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _column(key: str, header: str) -> Column:
    return Column(header, lambda r: _cell(r[key]), "left" if key in ("dataset", "source") else "right")


COLUMNS = [_column("dataset", "dataset"), _column("source", "source"), _column("n", "n"),
           _column("failed", "failed"), _column("complete", "complete"), _column("entity_recall", "entity recall"),
           _column("triple_recall", "triple recall"), _column("answer_in_index", "answer in index"),
           _column("mean_answer_step", "answer step"), _column("evidence_n", "evidence n"),
           _column("evidence_strict_f1", "evidence F1 strict"), _column("evidence_strict_em", "evidence EM strict"),
           _column("evidence_relaxed_f1", "evidence F1 relaxed"),
           _column("evidence_relaxed_recall", "evidence recall relaxed"), _column("evidence_na", "evidence n/a"),
           _column("evidence_no_gold", "no gold evidence")]


def quality_markdown(rows: list[dict[str, Any]]) -> str:
    return "\n".join(["# Index quality", "", Table(COLUMNS, rows).markdown()]) + "\n"


def print_quality(rows: list[dict[str, Any]]) -> None:
    """The summary turned on its side (a row per measure, a column per dataset and source): the 16
    measures side by side do not fit a terminal, and rich cuts the cells of a table too wide."""
    from rich.console import Console
    from rich.table import Table as RichTable

    t = RichTable(title="index quality")
    t.add_column("measure")
    for r in rows:
        t.add_column(f"{r['dataset']}\n{r['source']}", justify="right", overflow="fold")
    for c in COLUMNS[2:]:
        t.add_row(c.header, *(c.cell(r) for r in rows))
    Console().print(t)
