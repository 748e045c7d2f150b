"""`kair datagen silver`: KAIR trajectories built from gold annotations instead of a teacher LLM.

Each question's annotations become a chain of hops (data_gen.chains: one piece of gold evidence
per hop, with the queries that look for it and the anchors it adds to the index).

The chain is then replayed through KairLoop itself, with REAL retrieval, by an oracle LLM
(GoldOracle) that writes the step the chain implies: step 1 retrieves with the question; at
every step the index holds the anchors of the hops whose paragraph has been retrieved so far
(only what the retrieved documents support), the judgment is sufficient once every hop's
paragraph has been retrieved, else insufficient with the query of the first hop still missing.
The oracle renders that step with render_step_output; the loop does everything else (prompts,
parsing, fallbacks, stopping, the answer prompt), so a silver trajectory is by construction what
the loop records. The final answer is the gold answer; tokens and times are 0. A chain whose
evidence is not all retrieved within max_steps is kept and marked `extra.complete = false`
(filter drops it). Every index format is supported.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from data_gen.chains import CHAINS, GoldDocs, Hop, clean_part, entity_of, fact_with, mentions, outcome
from data_gen.store import DataSpec, load_questions, retriever_config_for, shard_path, without_context
from kair_runtime.config import ConfigError, RuntimeConfig
from kair_runtime.index import get_format, norm_key
from kair_runtime.jsonl import atomic_write_jsonl, atomic_write_text
from kair_runtime.llm.base import Completion, SamplingParams
from kair_runtime.loop import STEP, KairLoop, QuestionState
from kair_runtime.output_format import render_step_output
from kair_runtime.prompts import PromptSet
from kair_runtime.records import Index, Message, Question, ScoredPassage, Trace
from kair_runtime.retrieval.base import Retriever
from kair_runtime.rundir import hold

SOURCE = "annotations"


@dataclass
class SilverConfig:
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)  # retriever + loop (format, steps, top_k)
    datasets: list[DataSpec] = field(default_factory=lambda: [
        DataSpec("hotpotqa"), DataSpec("musique"), DataSpec("2wikimultihopqa")])
    corpus: str | None = None  # None: the datasets' own paragraphs, built into OUT/corpus.jsonl
    extra_corpus: list[str] = field(default_factory=list)
    out_dir: str = "runs/datagen/silver"
    # An A-or-B question's outcome as one more relation of the final index ("B -> is older rather
    # than -> A"), so that the answer reads a name instead of ordering two dates; measured on the
    # 135M CPU student, it did not help (docs/results.md, "The outcome in the index, measured").
    outcomes: bool = False


# ---------------------------------------------------------------- the index per format


@dataclass
class Anchors:
    """What the supported hops contribute, before it takes the shape of an index format."""

    keywords: list[str]
    triples: list[list[str]]
    facts: list[str]
    keyword_facts: list[list]


IndexBuilder = Callable[[Anchors], Index]
INDEX_BUILDERS: dict[str, IndexBuilder] = {
    "kr": lambda a: Index("kr", keywords=a.keywords, relations=a.triples),
    "keywords": lambda a: Index("keywords", keywords=a.keywords),
    "facts": lambda a: Index("facts", facts=a.facts),
    "kf": lambda a: Index("kf", keyword_facts=a.keyword_facts),
    "text": lambda a: Index("text", summary=" ".join(a.facts)),
    "none": lambda a: Index("none"),
}


def anchors(hops: list[Hop], docs: list[ScoredPassage], chain_hops: list[Hop], question: str) -> Anchors:
    """The supported hops' anchors. With none yet, the index still records what the documents
    say about the question: the chain's entities that both the question and a retrieved document
    name (else the top document's title), with a sentence naming each."""
    if not hops:
        names = [e for h in chain_hops for e in [entity_of(h.title), *h.entities]]
        found = [e for e in dict.fromkeys(names) if mentions(question, e) and any(mentions(p.text, e) for p in docs)]
        if found:
            pairs = [(e, next(fact_with(p.text, e) for p in docs if mentions(p.text, e))) for e in found]
        else:
            pairs = [(p.title, fact_with(p.text)) for p in docs[:1]]
        return Anchors(keywords=[clean_part(e) for e, _ in pairs], triples=[],
                       facts=[clean_part(f) for _, f in pairs if f],
                       keyword_facts=[[clean_part(e).replace(":", " "), [clean_part(f)] if f else []] for e, f in pairs])
    keywords = [x for h in hops for x in [entity_of(h.title), *h.entities]]
    triples = [[clean_part(x) for x in t] for h in hops for t in h.triples]
    facts = [clean_part(f) for h in hops for f in h.facts if f]
    kf = [[clean_part(entity_of(h.title)).replace(":", " "), [clean_part(f) for f in h.facts if f]] for h in hops]
    return Anchors(keywords=list(dict.fromkeys(clean_part(k) for k in keywords if k.strip())), triples=triples,
                   facts=list(dict.fromkeys(facts)), keyword_facts=kf)


def reasoning_for(supported: list[Hop], complete: bool, next_query: str | None) -> str:
    said = []
    for h in supported:
        said += [f"{s} {r} {o}" for s, r, o in h.triples[:2]] or [entity_of(h.title)]
    found = "; ".join(said)
    if complete:
        return f"The documents give {found}, which is enough to answer the question."
    if found:
        return f"The documents give {found}, but the next piece is still missing: {next_query}."
    return f"The documents retrieved so far do not yet answer the question; next: {next_query}."


# ---------------------------------------------------------------- running chains


@dataclass
class ChainState:
    """One chain's progress: which queries it has searched with and which documents it has seen."""

    question: Question  # with its gold metadata (MuSiQue's chain reads the context paragraphs)
    hops: list[Hop]
    outcome: list[str] | None = None  # added to the index once every hop is supported (chains.outcome)
    tried: set[str] = field(default_factory=set)
    seen: dict[str, ScoredPassage] = field(default_factory=dict)

    def supported(self) -> list[Hop]:
        return [h for h in self.hops if any(d in self.seen for d in h.doc_ids)]

    def next_query(self) -> str:
        """The first not-yet-tried query of the first hops still missing; all tried: repeat the
        first missing hop's (the chain will end incomplete)."""
        pending = [h for h in self.hops if not any(d in self.seen for d in h.doc_ids)]
        for h in pending:
            for qy in h.queries:
                if norm_key(qy) not in self.tried:
                    return qy
        return pending[0].queries[0] if pending and pending[0].queries else self.question.question

    def step_output(self, query: str, docs: list[ScoredPassage], prev: Index, fmt_name: str) -> tuple[str, bool]:
        """The step the chain implies after searching `query` and reading `docs`, on top of the
        index `prev` the prompt showed, and whether the chain is now complete. Always a merge
        with `prev`, whatever loop.index_update says: the loop's parser then applies index_update
        to this output as it would to a model's."""
        self.tried.add(norm_key(query))
        for p in docs:
            self.seen.setdefault(p.id, p)
        supported = self.supported()
        complete = len(supported) == len(self.hops)
        fmt = get_format(fmt_name)
        found = anchors(supported, docs, self.hops, self.question.question)
        if complete and self.outcome:
            found.triples.append([clean_part(x) for x in self.outcome])
            found.facts.append(clean_part(" ".join(self.outcome)) + ".")
        index = fmt.merge(prev, INDEX_BUILDERS[fmt.name](found))
        next_query = None if complete else self.next_query()
        return render_step_output(index, reasoning_for(supported, complete, next_query),
                                  "sufficient" if complete else "insufficient", next_query), complete


class GoldOracle:
    """The LLM a silver trajectory replays through KairLoop: at each step it writes the output the
    chain implies for the documents the loop actually retrieved (by id, from the question's state),
    at the answer the gold answer. No tokens: nothing was generated. Its first error is kept and
    raised after the run (the loop would only record it on the trace)."""

    name = SOURCE

    def __init__(self, format_name: str):
        self.fmt = get_format(format_name)
        self.chains: dict[int, ChainState] = {}  # by id(trace): questions may share an id or a text
        self.error: Exception | None = None

    def follow(self, state: QuestionState, chain_state: ChainState) -> None:
        self.chains[id(state.trace)] = chain_state

    def generate_for(self, kind: str, states: list[QuestionState], prompts: list[list[Message]],
                     sampling: SamplingParams) -> list[Completion]:
        try:
            return [Completion(self._step(s) if kind == STEP else self._answer(s), 0, 0) for s in states]
        except Exception as e:
            self.error = self.error or e
            raise

    def _step(self, state: QuestionState) -> str:
        steps = state.trace.steps
        prev = steps[-1].index if steps else Index(format=self.fmt.name)
        return self.chains[id(state.trace)].step_output(state.query, state.retrieved, prev, self.fmt.name)[0]

    def _answer(self, state: QuestionState) -> str:
        q = self.chains[id(state.trace)].question
        return q.answers[0] if q.answers else ""


def run_silver(questions: list[Question], retriever: Retriever, runtime: RuntimeConfig,
               corpus: str | Path, outcomes: bool = False) -> list[Trace]:
    """Silver trajectories for `questions` (with their gold metadata): the gold chains replayed
    through KairLoop with GoldOracle, one batched retrieval call per round over every chain still
    running. A question with no chain gets an error trace, outside the loop. `outcomes`: see
    SilverConfig."""
    prompts = PromptSet.for_loop(runtime.loop)
    gold = GoldDocs(corpus)
    chains = []
    for q in questions:
        if q.dataset not in CHAINS:
            raise ConfigError(f"silver has no chain builder for dataset {q.dataset!r} (question {q.id}); "
                              f"supported: {sorted(CHAINS)}")
        hops = CHAINS[q.dataset](q, gold)
        chains.append(ChainState(q, hops, outcome=outcome(q, hops) if outcomes else None))
    oracle = GoldOracle(prompts.format)
    todo = [c for c in chains if c.hops]
    following = iter(todo)

    def begin(state: QuestionState) -> None:  # called per question, in input order
        c = next(following)
        state.trace.extra = silver_extra(c, prompts, retriever)
        oracle.follow(state, c)

    replayed: list[Trace] = []
    if todo:
        # Every chain in one round, as dense retrieval encodes a round's queries together; the
        # oracle decodes nothing: its steps are written in the layout, so the decoding settings
        # (no_repeat_ngram, structured) are off for it, and silver data is the same either way.
        cfg = dataclasses.replace(runtime.loop, round_size=len(todo), no_repeat_ngram=0, structured=False)
        replayed = KairLoop(oracle, retriever, cfg, prompts).run([without_context(c.question) for c in todo],
                                                                 on_start=begin)
    if oracle.error is not None:
        raise oracle.error
    failed = [t for t in replayed if t.error is not None]
    if failed:
        raise RuntimeError(f"silver replay of question {failed[0].question.id} failed: {failed[0].error}")
    by_chain = dict(zip(map(id, todo), replayed))
    traces = []
    for c in chains:
        tr = by_chain[id(c)] if c.hops else no_chain_trace(c, prompts, retriever)
        tr.extra["complete"] = bool(c.hops) and len(c.supported()) == len(c.hops)
        tr.extra["supported_hops"] = len(c.supported())
        tr.wall_time_s = 0.0  # a replay, not a run: nothing was timed
        for step in tr.steps:
            step.wall_time_s = 0.0
        traces.append(tr)
    return traces


def silver_extra(c: ChainState, prompts: PromptSet, retriever: Retriever) -> dict:
    """What a silver trajectory records about its source (run_silver adds complete/supported_hops)."""
    extra = {"teacher": SOURCE, "sample_id": 0, "prompt_version": prompts.version,
             "retriever": getattr(retriever, "name", ""), "hops": len(c.hops),
             "unmapped_hops": sum(not h.doc_ids for h in c.hops)}
    if not c.hops:
        extra["note"] = "no gold annotations to build a chain from"
    if c.outcome:
        extra["outcome"] = c.outcome
    return extra


def no_chain_trace(c: ChainState, prompts: PromptSet, retriever: Retriever) -> Trace:
    """A question whose annotations give no hop: an error trace with no steps (filter drops it)."""
    extra = silver_extra(c, prompts, retriever)
    return Trace(question=without_context(c.question), method="kair", index_format=prompts.format,
                 stop_reason="error", error=extra["note"], extra=extra)


def silver(cfg: SilverConfig, retriever: Retriever | None = None) -> tuple[Path, list[Trace]]:
    """Build every dataset's silver trajectories into OUT/trajectories/shard-00000-of-00001.jsonl
    (written whole, then renamed: a rerun rebuilds it), and their counts per dataset (complete
    chains / questions) into OUT/stats.json."""
    from kair_runtime.runtime import build_retriever

    out = Path(cfg.out_dir)
    questions = load_questions(cfg.datasets)
    with hold(out):
        rc, passages = retriever_config_for(cfg, out)  # gold paragraphs map into these passages
        traces = run_silver(questions, retriever or build_retriever(rc), cfg.runtime, passages, cfg.outcomes)
        path = shard_path(out, 0, 1)
        atomic_write_jsonl(path, (t.to_dict() for t in traces))
        atomic_write_text(out / "stats.json", json.dumps({"datasets": silver_counts(traces),
                                                          "trajectories": len(traces)}, indent=2) + "\n")
    return path, traces


def silver_counts(traces: list[Trace]) -> dict[str, dict[str, int]]:
    """complete / total per dataset, and with SilverConfig.outcomes how many carry an outcome."""
    out: dict[str, dict[str, int]] = {}
    for t in traces:
        c = out.setdefault(t.question.dataset, {"complete": 0, "total": 0})
        c["total"] += 1
        c["complete"] += int(bool(t.extra.get("complete")))
        if "outcome" in t.extra:
            c["outcomes"] = c.get("outcomes", 0) + 1
    return out
