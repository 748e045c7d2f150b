"""`kair datagen relabel`: the steps a model took, labelled by the gold chain (DAgger).

    kair datagen relabel runs/demo/round-1/teacher --datasets hotpotqa:train,musique:train \
        --corpus runs/demo/corpora/train.jsonl --out runs/datagen/relabelled

A student trained on silver trajectories only ever saw states silver reached: the gold chain's
own queries and documents. On its own trajectories it meets other states, and there it stops
too early: it judges "sufficient" on most questions whose documents do not hold the answer
(docs/results.md, "Why the search stops short"). The answer-F1 filter cannot teach that, since it
keeps only trajectories that end right. Relabelling can (Ross et al., 2011, DAgger): every step of
a model's trajectory, as the model was prompted for it (its own previous index, reasoning and
query), gets as target the step the question's gold chain implies for the documents the model
had retrieved by then (silver's ChainState.step_output: the index of the supported hops merged
onto the prompt's, the judgment "sufficient" only once every hop's paragraph has been seen, else
the next hop's query). A trajectory whose chain ends complete also gives its answer prompt with
the gold answer; one that stopped short gives no answer example (the answer is not in its prompt).

Questions whose chain cannot be built, or has a hop with no paragraph in the corpus (the oracle
could never call it complete), are skipped and counted, as are failed trajectories.

Output, in OUT: examples.jsonl (rows in to-sft's layout, `source` "relabelled: TEACHER"; give the
file to to-sft's `extra_examples`), stats.json (per dataset: trajectories, relabelled, skipped,
and the judgments, the model's against the chain's).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_gen.chains import CHAINS, GoldDocs
from data_gen.sft import example_meta, example_row
from data_gen.silver import ChainState
from data_gen.store import DataSpec, closed_corpus, load_questions, read_trajectories, source_key
from kair_runtime.config import ConfigError, RuntimeConfig
from kair_runtime.index import empty_index
from kair_runtime.jsonl import atomic_write_jsonl, atomic_write_text
from kair_runtime.prompts import PromptSet
from kair_runtime.records import Question, SFTExample, Trace

SOURCE_PREFIX = "relabelled: "


@dataclass
class RelabelConfig:
    # Only runtime.loop's prompt settings matter: the trajectories must have been made with them.
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    trajectories: str | None = None  # a teacher output folder or any trajectory path
    datasets: list[DataSpec] = field(default_factory=list)  # where the questions' gold annotations are
    corpus: str | None = None  # the passages the trajectories retrieved from; None: the datasets' closed corpus
    extra_corpus: list[str] = field(default_factory=list)
    out_dir: str = "runs/datagen/relabelled"


@dataclass
class Relabelled:
    examples: list[SFTExample]  # one per step, then the answer when the chain ended complete
    chain_judgments: list[str]  # the chain's judgment at each step


def relabel_trace(trace: Trace, question: Question, gold: GoldDocs, prompt_version: str) -> Relabelled | str:
    """The trace's steps with the chain's targets, or why the trace gives none."""
    if trace.error is not None or not trace.steps:
        return "failed trajectory"
    hops = CHAINS[question.dataset](question, gold)
    if not hops:
        return "no chain"
    if any(not h.doc_ids for h in hops):
        return "a hop with no paragraph in the corpus"
    chain = ChainState(question, hops)
    meta = example_meta(trace, prompt_version)
    source = SOURCE_PREFIX + str(trace.extra.get("teacher", ""))
    examples, judged, complete = [], [], False
    for i, st in enumerate(trace.steps):
        prev = trace.steps[i - 1].index if i else empty_index(trace.index_format)
        target, complete = chain.step_output(st.query, st.retrieved, prev, trace.index_format)
        judged.append("sufficient" if complete else "insufficient")
        examples.append(SFTExample(messages=[*st.prompt, {"role": "assistant", "content": target}],
                                   question_id=question.id, kind="init" if st.step == 1 else "update",
                                   step=st.step, source=source, extra=dict(meta)))
    if complete and trace.final_prompt and question.answers:
        examples.append(SFTExample(messages=[*trace.final_prompt, {"role": "assistant", "content": question.answers[0]}],
                                   question_id=question.id, kind="answer", step=len(trace.steps) + 1,
                                   source=source, extra=dict(meta)))
    return Relabelled(examples, judged)


def relabel_traces(traces: list[Trace], questions: dict[str, Question], gold: GoldDocs,
                   prompt_version: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every trace relabelled: the example rows, and the stats (per dataset: trajectories,
    relabelled, skipped by reason, the model's judgments against the chain's)."""
    rows: list[dict[str, Any]] = []
    stats: dict[str, Counter] = defaultdict(Counter)
    judgments: dict[str, Counter] = defaultdict(Counter)
    for t in traces:
        recorded = t.extra.get("prompt_version")
        if recorded and recorded != prompt_version:
            raise ConfigError(f"trajectory {source_key(t)} was made with prompt version {recorded}, but these "
                              f"settings give {prompt_version}: use the runtime.loop settings it was generated with")
        q = questions.get(t.question.id)
        if q is None:
            raise ConfigError(f"trajectory {source_key(t)}: question {t.question.id!r} is in none of `datasets` "
                              "(its gold annotations are needed)")
        s = stats[q.dataset]
        s["trajectories"] += 1
        got = relabel_trace(t, q, gold, prompt_version)
        if isinstance(got, str):
            s[f"skipped: {got}"] += 1
            continue
        s["relabelled"] += 1
        for st, chain in zip(t.steps, got.chain_judgments):
            judgments[q.dataset][f"model {st.judgment}, chain {chain}"] += 1
        s["answer examples"] += sum(ex.kind == "answer" for ex in got.examples)
        rows += [example_row(ex) for ex in got.examples]
    return rows, {"trajectories": len(traces), "examples": len(rows), "prompt_version": prompt_version,
                  "datasets": {name: dict(c) | {"judgments": dict(judgments[name])} for name, c in sorted(stats.items())}}


def write_relabelled(out: Path, rows: list[dict[str, Any]], stats: dict[str, Any]) -> Path:
    """OUT/examples.jsonl and OUT/stats.json, each written whole (a rerun rebuilds them)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_jsonl(out / "examples.jsonl", rows)
    atomic_write_text(out / "stats.json", json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return out / "examples.jsonl"


def relabel(cfg: RelabelConfig) -> dict[str, Any]:
    """`kair datagen relabel`: every trajectory under cfg.trajectories, written to cfg.out_dir."""
    if not cfg.trajectories:
        raise ConfigError("no trajectories: pass TRAJECTORIES or set `trajectories`")
    traces = read_trajectories(cfg.trajectories)
    if not traces:
        raise ConfigError(f"{cfg.trajectories}: no trajectories to relabel")
    out = Path(cfg.out_dir)
    questions = {q.id: q for q in load_questions(cfg.datasets)}
    corpus = cfg.corpus or closed_corpus(cfg.datasets, cfg.extra_corpus, out / "corpus.jsonl")
    rows, stats = relabel_traces(traces, questions, GoldDocs(corpus), PromptSet.for_loop(cfg.runtime.loop).version)
    write_relabelled(out, rows, stats)
    return stats
