"""Gold chains: each question's annotations as a chain of hops, for `kair datagen silver` and
`kair demo` (data_gen.silver replays them through the loop).

A hop is one piece of gold evidence: the paragraph that holds it, the query that looks for it,
and the anchors it adds to the index (triples, entities, supporting sentences):

    2Wiki     one hop per supporting paragraph; its `evidences` triples (subject, relation,
              object) are the K&R relations; query "<relation> of <subject>"
    MuSiQue   one hop per `question_decomposition` step; "#1"-style references are replaced by
              the earlier answers; the sub-question is the query; (head, relation, answer)
    HotpotQA  one hop per supporting paragraph, the one the question names first; later hops
              are searched for by their title's entity (the bridge entity, or the second
              compared entity); relations come from the supporting sentences
    demo      one hop per `decomposition` step of the embedded demo world (kair_runtime.demo_data)
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from eval.metrics import normalize_answer
from kair_runtime.config import ConfigError
from kair_runtime.index import norm_key
from kair_runtime.records import Question


@dataclass
class Hop:
    """One piece of gold evidence and what it adds to the index once its paragraph is retrieved."""

    title: str
    doc_ids: list[str]  # corpus ids of its paragraph (supported when any is retrieved)
    queries: list[str]  # the queries that look for it, tried in order
    triples: list[list[str]] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    entities: list[str] = field(default_factory=list)


ChainBuilder = Callable[[Question, "GoldDocs"], list[Hop]]
CHAINS: dict[str, ChainBuilder] = {}


def chain(name: str) -> Callable[[ChainBuilder], ChainBuilder]:
    def add(fn: ChainBuilder) -> ChainBuilder:
        CHAINS[name] = fn
        return fn
    return add


class GoldDocs:
    """Gold paragraphs -> corpus ids: the content hash build_corpus assigns, else by title when
    exactly one corpus paragraph has that title (a corpus built some other way)."""

    def __init__(self, corpus: str | Path):
        from eval.corpus import CorpusLookup

        self.lookup = CorpusLookup.from_file(corpus)

    def ids(self, title: str, text: str | None) -> list[str]:
        from eval.corpus import paragraph_id

        if text is not None and paragraph_id(title, text) in self.lookup.ids:
            return [paragraph_id(title, text)]
        pid = self.lookup.unique_title(title)
        return [pid] if pid else []


# ---------------------------------------------------------------- text helpers

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"“(])")
_REF = re.compile(r"#(\d+)")
_WH = re.compile(r"^(?:(?:in|on|at|for|from|by|to|of|with|during|besides)\s+)?(?:what|who|whom|whose|which|when|where|why|"
                 r"how(?:\s+(?:many|much|long|old|far|big))?)\b\s*(?:(?:is|was|are|were|did|does|do|has|had|have|"
                 r"will|can|could)\b\s*)?(?:the\b\s*)?", re.IGNORECASE)
_TRAILING_PREP = re.compile(r"\s+(?:of|by|in|for|to|at|from|with|on|the|a|an|is|was)$", re.IGNORECASE)


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def entity_of(title: str) -> str:
    """A title as an entity name: without its disambiguation, "Lilu (mythology)" -> "Lilu"."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip() or title


def mentions(text: str, entity: str) -> bool:
    e = normalize_answer(entity)
    return bool(e) and f" {e} " in f" {normalize_answer(text)} "


def _find(text: str, entity: str) -> tuple[int, int] | None:
    """The character span of `entity` (or its name before a comma) in `text`, case-insensitive."""
    for form in (entity, entity_of(entity), entity.split(",")[0]):
        m = re.search(re.escape(form.strip()), text, re.IGNORECASE) if form.strip() else None
        if m:
            return m.span()
    return None


def relation_between(sentence: str, head: str, tail: str) -> str:
    """The words linking two mentions in a sentence: all of them when short, else the last three
    before the later mention; "related to" when the sentence does not name both."""
    a, b = _find(sentence, head), _find(sentence, tail)
    if not a or not b or a == b:
        return "related to"
    lo, hi = (a[1], b[0]) if a[0] < b[0] else (b[1], a[0])
    words = [w.strip("\"'“”()[],;:.") for w in sentence[lo:hi].split()]
    words = [w for w in words if w]
    if not words:
        return "related to"
    return " ".join(words if len(words) <= 5 else words[-3:])


def question_relation(question: str, head: str) -> str:
    """A sub-question as a relation phrase: "Who was the first president of X?" -> "first president"."""
    text = question.replace("?", " ")
    span = _find(text, head) if head else None
    if span:
        text = text[:span[0]] + " " + text[span[1]:]
    text = _WH.sub("", " ".join(text.split())).strip(" ,.'\"")
    while True:
        shorter = _TRAILING_PREP.sub("", text)
        if shorter == text:
            break
        text = shorter
    return text or "related to"


def tidy(text: str) -> str:
    """One-line text without the space MuSiQue puts before punctuation ("#1 ?" -> "X?")."""
    return re.sub(r"\s+([?.,!;:])", r"\1", " ".join(text.split()))


def clean_part(text: str) -> str:
    """An index item the parser reads back whole: no list or relation separators inside."""
    return " ".join(text.replace(";", ",").replace("|", "/").replace("->", "-").split())


def fact_with(paragraph: str, *entities: str) -> str:
    """The paragraph's first sentence that names the first entity found, else its first sentence."""
    sents = sentences(paragraph)
    for e in entities:
        for s in sents:
            if mentions(s, e):
                return s
    return sents[0] if sents else ""


def _same_entity(a: str, b: str) -> bool:
    ka, kb = norm_key(a), norm_key(b)
    return ka == kb or norm_key(entity_of(a)) == kb or norm_key(entity_of(b)) == ka


def _is_yes_no(answer: str) -> bool:
    return normalize_answer(answer) in ("yes", "no")


def _supporting(q: Question) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The gold paragraphs by title, and each title's supporting sentences (2Wiki and HotpotQA)."""
    paras = {p["title"]: p["text"] for p in q.metadata.get("supporting_paragraphs", [])}
    sents: dict[str, list[str]] = {}
    for s in q.metadata.get("supporting_sentences", []):
        sents.setdefault(s["title"], []).append(s["text"])
    return paras, sents


_ASKS = re.compile(r"^(?:(?:which|what)\s+\w+|who|whom|was|were|is|are|did|does|do)(?:\s+|$)", re.IGNORECASE)
_JOINS = re.compile(r"(?:[\s,:]+|\b(?:the|a|an|out of|between|of|from|among))$", re.IGNORECASE)
_NOT_A_PREDICATE = re.compile(r",|^(?:in|of|between|among|from)\b|^\S*$", re.IGNORECASE)


def _compared(text: str) -> str:
    """What a question compares, from its words outside the options: "Who is older," -> "is older"."""
    text = _ASKS.sub("", text.strip(" ,?")).strip()
    while (shorter := _JOINS.sub("", text)) != text:
        text = shorter
    # a clause around the options ("In A or B, ...", "founded first, Hole, the band that") is no relation
    return "" if _NOT_A_PREDICATE.search(text) else text


def outcome(q: Question, hops: list[Hop]) -> list[str] | None:
    """An A-or-B question's outcome as a relation the index can hold once both sides are known:
    "Who is older, A or B?" answered B -> [B, "is older rather than", A]. The options are the
    chain's entities the question names; None unless the gold answer is one of exactly two, or when
    the question leaves no words to say what was compared."""
    answer = q.answers[0] if q.answers else ""
    if not answer or _is_yes_no(answer) or not mentions(q.question, answer):
        return None
    names = dict.fromkeys(entity_of(h.title) for h in hops)
    others = [n for n in names if mentions(q.question, n) and not (mentions(n, answer) or mentions(answer, n))]
    spans = [_find(q.question, x) for x in (answer, *others)]
    if len(others) != 1 or None in spans:
        return None
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    # the words before the options, else the last sentence after them ("Was A or B born first?")
    said = _compared(q.question[:first]) or _compared(re.split(r"(?<=\.)\s+", q.question[last:])[-1])
    return [answer, f"{said} rather than", others[0]] if said else None


# ---------------------------------------------------------------- chains per benchmark


@chain("2wikimultihopqa")
def twowiki_chain(q: Question, gold: GoldDocs) -> list[Hop]:
    paras, sents = _supporting(q)
    hops = [Hop(title=t, doc_ids=gold.ids(t, paras.get(t)), queries=[], facts=sents.get(t, []))
            for t in q.metadata.get("supporting_titles", [])]
    if not hops:
        return []
    for triple in q.metadata.get("evidences", []):
        s, r, o = triple
        owner = (next((h for h in hops if _same_entity(h.title, s)), None)
                 or next((h for h in hops if mentions(paras.get(h.title, ""), s)
                          and mentions(paras.get(h.title, ""), o)), None)
                 or next((h for h in hops if mentions(paras.get(h.title, ""), o)), None) or hops[0])
        owner.triples.append([s, r, o])
    for h in hops:
        h.queries = list(dict.fromkeys([f"{r} of {s}" for s, r, _ in h.triples] + [entity_of(h.title)]))
        h.entities = [x for s, _, o in h.triples for x in (s, o)]
    # What the question names is looked up first; the rest is reached through it.
    return sorted(hops, key=lambda h: 0 if mentions(q.question, entity_of(h.title)) else 1)


@chain("musique")
def musique_chain(q: Question, gold: GoldDocs) -> list[Hop]:
    context = q.metadata.get("context", [])
    supporting = {p["title"]: p["text"] for p in q.metadata.get("supporting_paragraphs", [])}
    answers: list[str] = []
    hops = []
    for step in q.metadata.get("decomposition", []):
        text = _REF.sub(lambda m: _ref(answers, m), step["question"])
        refs = [answers[int(i) - 1] for i in _REF.findall(step["question"]) if 0 < int(i) <= len(answers)]
        title = step.get("title") or ""
        idx = step.get("paragraph_support_idx")
        para = (context[idx]["text"] if isinstance(idx, int) and 0 <= idx < len(context)
                and context[idx]["title"] == title else supporting.get(title, ""))
        answer = step["answer"]
        if ">>" in text:  # the KB form "Hello Love >> performer"
            head, _, rel = (x.strip() for x in text.rpartition(">>"))
            queries = [f"{rel} of {head}"]
        else:
            head = refs[-1] if refs else (entity_of(title) if mentions(text, entity_of(title)) else title)
            rel = question_relation(text, head)
            queries = [tidy(text), f"{head} {rel}"]  # the sub-question; then its entity and relation
        hops.append(Hop(title=title, doc_ids=gold.ids(title, para) if title else [], queries=queries,
                        triples=[[head, rel, answer]], facts=[fact_with(para, answer, head)] if para else [],
                        entities=[head, answer]))
        answers.append(answer)
    return hops


def _ref(answers: list[str], m: re.Match) -> str:
    i = int(m.group(1))
    return answers[i - 1] if 0 < i <= len(answers) else m.group(0)


@chain("hotpotqa")
def hotpot_chain(q: Question, gold: GoldDocs) -> list[Hop]:
    paras, sents = _supporting(q)
    titles = list(q.metadata.get("supporting_titles", []))
    # The paragraph the question names comes first; the other is reached through its entity.
    titles.sort(key=lambda t: 0 if mentions(q.question, entity_of(t)) else 1)
    answer = q.answers[0] if q.answers else ""
    hops = []
    for i, t in enumerate(titles):
        name = entity_of(t)
        others = [entity_of(o) for o in titles if o != t] + ([answer] if answer and not _is_yes_no(answer) else [])
        triples = []
        for s in sents.get(t, []):
            for o in others:
                if mentions(s, o) and not (mentions(o, name) or mentions(name, o)):
                    triples.append([name, relation_between(s, name, o), o])
        queries = ([q.question] if i == 0 else []) + [name, t]
        hops.append(Hop(title=t, doc_ids=gold.ids(t, paras.get(t)), queries=queries,
                        triples=triples, facts=sents.get(t, []), entities=[name] + [o for _, _, o in triples]))
    return hops


# ---------------------------------------------------------------- the demo world's chain


@chain("demo")
def demo_chain(q: Question, gold) -> list[Hop]:
    """One hop per `decomposition` step: its passage, its sub-question as the query, and the
    evidence triples whose object is that hop's answer (else the hop's own triple by position)."""
    steps = q.metadata.get("decomposition", [])
    texts = {p["id"]: p["text"] for p in q.metadata.get("supporting_paragraphs", [])}
    hops = []
    for s in steps:
        pid, text = s["passage_id"], texts.get(s["passage_id"], "")
        hops.append(Hop(title=s.get("title", pid), doc_ids=[pid], queries=[s["question"]],
                        facts=[fact_with(text, s["answer"])] if text else []))
    for i, (head, rel, tail) in enumerate(q.metadata.get("evidences", [])):
        owner = (next((h for h, s in zip(hops, steps) if mentions(s["answer"], tail) or mentions(tail, s["answer"])),
                      None)
                 or next((h for h in hops if h.facts and mentions(h.facts[0], head) and mentions(h.facts[0], tail)),
                         None)
                 or hops[min(i, len(hops) - 1)])
        owner.triples.append([head, rel, tail])
    for h in hops:
        h.entities = list(dict.fromkeys(x for s, _, o in h.triples for x in (s, o)))
        h.queries += [f"{r} of {s}" for s, r, _ in h.triples]
    return hops


def with_passages(questions: list[Question], corpus: dict[str, Any]) -> list[Question]:
    """The demo metadata names its passages by id; the silver chain also wants their text and
    title, so they are attached here (as `supporting_paragraphs`, the benchmarks' key)."""
    out = []
    for q in questions:
        steps = q.metadata.get("decomposition", [])
        missing = [s["passage_id"] for s in steps if s["passage_id"] not in corpus]
        if missing:
            raise ConfigError(f"demo question {q.id}: passage(s) {missing} are not in the demo corpus")
        paras = [{"id": p.id, "title": p.title, "text": p.text} for p in (corpus[s["passage_id"]] for s in steps)]
        meta = dict(q.metadata, supporting_paragraphs=paras,
                    decomposition=[dict(s, title=corpus[s["passage_id"]].title) for s in steps])
        out.append(dataclasses.replace(q, metadata=meta))
    return out
