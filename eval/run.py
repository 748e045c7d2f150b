"""kair eval --config configs/eval/smoke-cpu.yaml [--adapter PATH | --checkpoints DIR] [--datasets a,b] [--methods kair,vanilla]

Evaluate every (model, dataset, method) combination and write a run folder:

    RUN/config.yaml                              the resolved config
    RUN/corpora/*.jsonl (+ .sources.json)        closed corpora, and the files each was built from
    RUN/<model>/<dataset>/<method>/traces.jsonl  one trace per question (resumable)
    RUN/summary.json                             every figure of every combination
    RUN/results.md                               Table 1 layout + run statistics
    RUN/plots/*.png                              F1, step distribution, index size per step

Retrieval is over each dataset's closed corpus (the paragraphs of the file evaluated, unless
`corpus`/`corpus_from` say otherwise), or over the prebuilt index of `runtime.retriever.index_dir`,
or over the one corpus `runtime.retriever.corpus` names (kair_runtime/runtime.py's rule).
A rerun of the same command continues where it stopped: finished questions are read back from
traces.jsonl (a torn last line from a kill is dropped) and only the rest are run. A question whose
run failed (its trace has `error` set, e.g. the backend was down) is kept as a failure, scored 0;
`--retry-failed` runs those again and replaces their records in place, keeping the others.
`kair eval compare RUN [RUN ...]` prints one table over several runs. The command line of both is
eval/cli.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from eval.methods import METHODS, BaselineConfig, MethodSettings, build_method
from eval.report import markdown_report, summarize, write_plots
from eval.specs import DatasetSpec
from eval.table import Column, Table
from kair_runtime.config import AT_LEAST_1, ConfigError, RuntimeConfig, check_ranges, to_dict
from kair_runtime.jsonl import JsonlError, JsonlWriter, atomic_write_text, read_json, recover, replace_records
from kair_runtime.llm import AdapterSwitcher
from kair_runtime.records import Question, ScoredPassage, Trace
from kair_runtime.retrieval import Retriever
from kair_runtime.rundir import claim, hold
from kair_runtime.runtime import retrievers_over


@dataclass
class RobustnessConfig:
    shuffle_seeds: list[int] = field(default_factory=list)  # one extra run per seed, final docs shuffled
    gold_position: int | None = None  # put the gold documents at this 1-based position


@dataclass
class EvalConfig:
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    datasets: list[DatasetSpec] = field(default_factory=list)
    methods: list[str] = field(default_factory=lambda: ["kair"])
    limit: int | None = None  # the first N questions
    sample: int | None = None  # or a reproducible random sample of N
    seed: int = 0
    out_dir: str = "runs/eval"
    run_name: str | None = None  # default: the config file's name
    checkpoints: str | None = None  # evaluate every checkpoint-* adapter under this dir
    include_base: bool = False  # with checkpoints: also the base model without adapter
    chunk_size: int = 16  # questions appended to traces.jsonl at a time (resume granularity)
    skip_malformed: bool = False  # count and report malformed dataset records instead of failing
    baselines: BaselineConfig = field(default_factory=BaselineConfig)
    robustness: RobustnessConfig = field(default_factory=RobustnessConfig)

    def validate(self, where: str = "") -> None:
        check_ranges(self, {"limit": AT_LEAST_1, "sample": AT_LEAST_1, "chunk_size": AT_LEAST_1}, where)
        if self.run_name is not None:
            check_run_name(self.run_name, f"{where}.run_name" if where else "run_name")


def check_run_name(name: str, key: str = "run_name") -> None:
    """A run name is one folder directly under out_dir: `../x` or `/tmp/x` would write the run
    somewhere the user did not point --out-dir at, and `a/b` would nest runs in one another."""
    if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ConfigError(f"{key}={name!r} must be a single folder name inside out_dir "
                          "(no '/', no '..', not empty or absolute)")


# ---------------------------------------------------------------- models, data, retrievers

def model_variants(cfg: EvalConfig) -> list[tuple[str, str | None]]:
    """(tag, adapter) pairs: the configured model/adapter, or every checkpoint of a training run."""
    llm = cfg.runtime.llm
    # The scripted backend ignores `model`; don't label its runs with a model that never ran.
    base = "scripted" if llm.backend == "scripted" else (Path(llm.model).name or llm.model)
    if not cfg.checkpoints:
        adapter = cfg.runtime.llm.adapter
        return [(f"{base}+{Path(adapter).name}" if adapter else base, adapter)]
    root = Path(cfg.checkpoints)
    ckpts = sorted((p for p in root.glob("checkpoint-*") if (p / "adapter_config.json").exists()),
                   key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    if (root / "adapter_config.json").exists():
        ckpts.append(root)  # the final adapter saved at the top of the output dir
    if not ckpts:
        raise ConfigError(f"no checkpoint-*/adapter_config.json under {root}")
    variants = [(base, None)] if cfg.include_base else []
    return variants + [(f"{base}+{p.name}", str(p)) for p in ckpts]


def run_questions(spec: DatasetSpec, cfg: EvalConfig) -> tuple[list[Question], list[str]]:
    """The dataset's questions as the run takes them (its limit, sample and seed), and the malformed
    records skipped (only with skip_malformed; reported)."""
    from eval.datasets import load_dataset

    # A dataset's own limit and the run's both cap it (check_eval_config keeps it apart from sample).
    loaded = load_dataset(spec.name, path=spec.path, split=spec.split, limit=spec.capped(cfg.limit), sample=cfg.sample,
                          seed=cfg.seed, skip_malformed=cfg.skip_malformed)
    return list(loaded.questions), list(loaded.skipped)


def run_corpus(spec: DatasetSpec, cache: Path) -> Path:
    """The dataset's retrieval corpus: given, or the closed corpus of its sources (by default the
    file evaluated: `path`, else the split's), built once into RUN/corpora/ (named by its sources)
    and reused while they are unchanged."""
    from eval.corpus import corpus_for

    return corpus_for([spec], lambda pairs: cache / corpus_file_name(pairs))


def corpus_file_name(pairs: list[tuple[str, str]]) -> str:
    """`musique-dev+hotpotqa-dev.jsonl`; a source given as a file is named by its stem and a hash
    of its path, so two files with one stem get two corpora."""
    from eval.datasets import SPLIT_ALIASES, get_spec

    parts = []
    for name, where in pairs:
        spec = get_spec(name)
        if SPLIT_ALIASES.get(where, where) in spec.files:
            parts.append(f"{spec.name}-{where}")
        else:
            digest = hashlib.sha1(str(Path(where).resolve()).encode("utf-8")).hexdigest()[:8]
            parts.append(f"{spec.name}-{Path(where).stem}-{digest}")
    return "+".join(parts) + ".jsonl"


def retrievers_for(specs: list[DatasetSpec], cfg: EvalConfig, run_dir: Path) -> list[tuple[Retriever, Path]]:
    """The retriever each dataset is evaluated with, and the passages file its gold ids map into,
    by runtime.retriever_over's rule: `retriever.index_dir`, else `retriever.corpus`, else the
    dataset's own corpus (built into RUN/corpora/ only then). Datasets on one passages file (a
    prebuilt index) share one retriever."""
    corpora = [lambda spec=spec: run_corpus(spec, run_dir / "corpora") for spec in specs]
    return retrievers_over(cfg.runtime.retriever, corpora)


def check_eval_config(cfg: EvalConfig) -> None:
    """Settings that would otherwise fail halfway through a run (or run over nothing)."""
    from eval.datasets import get_spec

    unknown = [m for m in cfg.methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method(s) {unknown}; choose from {sorted(METHODS)}")
    if not cfg.datasets:
        raise ConfigError("no datasets to evaluate: set `datasets` or pass --datasets")
    cfg.validate()  # a config built in code, not loaded (from_dict validates what it loads)
    cfg.baselines.validate()
    if cfg.limit is not None and cfg.sample is not None:
        raise ConfigError("set either limit or sample, not both")
    for i, spec in enumerate(cfg.datasets):
        get_spec(spec.name)  # an unknown name fails here, before anything is written
        if spec.limit is not None and (spec.limit < 1 or cfg.sample is not None):
            raise ConfigError(f"datasets[{i}] ({spec.name}): limit must be >= 1 and cannot go with sample, "
                              f"got limit {spec.limit}, sample {cfg.sample}")
        rc = cfg.runtime.retriever  # either one wins over a dataset's corpus (runtime.retriever_over)
        key = "index_dir" if rc.index_dir else "corpus" if rc.corpus else None
        if key and (spec.corpus or spec.corpus_from or spec.extra_corpus):
            what = "an index" if rc.index_dir else "a corpus"
            raise ConfigError(f"datasets[{i}] ({spec.name}) sets a corpus, and runtime.retriever.{key} "
                              f"names {what} to retrieve from; set one of the two")


def final_docs_fn(robust: RobustnessConfig, shuffle_seed: int | None, gold_ids: dict[str, set[str]]):
    """The document order of the robustness studies (None: retrieval order). Every method applies
    it to the calls whose output can be the answer, never to search-only steps (eval/methods.py
    `_Baseline.docs`, KairLoop's answer prompt)."""
    if shuffle_seed is None and robust.gold_position is None:
        return None

    def order(q: Question, docs: list[ScoredPassage]) -> list[ScoredPassage]:
        docs = list(docs)
        if shuffle_seed is not None:
            random.Random(f"{shuffle_seed}:{q.id}").shuffle(docs)
        if robust.gold_position is not None:
            gold = gold_ids.get(q.id, set())
            golds = [d for d in docs if d.id in gold]
            rest = [d for d in docs if d.id not in gold]
            at = max(0, min(robust.gold_position - 1, len(rest)))
            docs = rest[:at] + golds + rest[at:]
        return docs

    return order


# ---------------------------------------------------------------- the run

def run_eval(cfg: EvalConfig, run_dir: Path, progress: bool = True, retry_failed: bool = False) -> list[dict]:
    """Run (or resume) every combination and write the reports; retry_failed also reruns the
    questions a previous run recorded as failed."""
    from tqdm import tqdm

    check_eval_config(cfg)
    # Every dataset is read before the run folder is claimed: a bad file leaves nothing behind.
    loaded = [(spec, *run_questions(spec, cfg)) for spec in cfg.datasets]
    with hold(run_dir):  # one writer per run folder
        _claim_run_dir(run_dir, cfg)
        return _run_claimed(cfg, run_dir, loaded, progress, retry_failed)


def _run_claimed(cfg: EvalConfig, run_dir: Path, loaded: list, progress: bool, retry_failed: bool) -> list[dict]:
    from tqdm import tqdm

    data = []
    built = retrievers_for([spec for spec, _, _ in loaded], cfg, run_dir)
    for (spec, questions, skipped), (retriever, passages) in zip(loaded, built):
        data.append((spec, questions, skipped, retriever, gold_ids_for(questions, passages)))

    settings = MethodSettings(loop=cfg.runtime.loop, **dataclasses.asdict(cfg.baselines))
    runs = [(m, None) for m in cfg.methods] + [(m, s) for m in cfg.methods for s in cfg.robustness.shuffle_seeds]
    rows = []
    variants = model_variants(cfg)
    # One engine for every checkpoint where the backend swaps adapters (vllm: a LoRARequest each).
    with AdapterSwitcher(cfg.runtime.llm, [adapter for _, adapter in variants]) as models:
        for tag, adapter in variants:
            for spec, questions, skipped, retriever, gold in data:
                for method, shuffle in runs:
                    label = method if shuffle is None else f"{method}@shuffle{shuffle}"
                    path = run_dir / tag / spec.label / label / "traces.jsonl"

                    # The model is loaded only if some combination still has questions to run.
                    def make_method(method=method, shuffle=shuffle, retriever=retriever, gold=gold, adapter=adapter):
                        return build_method(method, models.get(adapter), retriever, settings,
                                            final_docs_fn(cfg.robustness, shuffle, gold))

                    with tqdm(total=len(questions), desc=f"{tag} {spec.label} {label}", disable=not progress,
                              unit="q") as bar:
                        _, summary = evaluate_one(make_method, questions, gold, path, bar.update, cfg.chunk_size,
                                                  retry_failed)
                    summary["skipped_malformed"] = len(skipped)  # not in n: they never became questions
                    rows.append({"model": tag, "dataset": spec.label, "method": label, "summary": summary})
    write_reports(rows, run_dir)
    return rows


def evaluate_one(make_method, questions: list[Question], gold: dict[str, set[str]], path: Path, advance,
                 chunk_size: int = 16, retry_failed: bool = False) -> tuple[list[Trace], dict]:
    """One (model, dataset, method) combination, as `kair eval` and `kair demo` run it: every
    question's trace (resumed from `path`, see resume_traces) and their summary scored against
    `gold` (question id -> gold passage ids)."""
    traces = resume_traces(make_method, questions, path, advance, chunk_size, retry_failed)
    return traces, summarize(traces, gold)


def resume_traces(make_method, questions: list[Question], path: Path, advance,
                  chunk_size: int = 16, retry_failed: bool = False) -> list[Trace]:
    """Every question's trace, in order: those already in `path` (a torn last line is cut off),
    the rest run through make_method() (called only if some are left) and appended chunk by
    chunk, so an interrupted run loses at most one chunk. advance(n) reports progress.

    retry_failed: questions whose recorded trace has an error run again too; each chunk's new
    traces replace the failed records in place (an atomic rewrite), so a kill mid-retry keeps
    every success and leaves the not yet retried failures to the next --retry-failed."""
    done = {r["question"]["id"]: Trace.from_dict(r) for r in recover(path)}
    retry = [q for q in questions if q.id in done and done[q.id].error is not None] if retry_failed else []
    todo = [q for q in questions if q.id not in done]
    advance(sum(q.id in done for q in questions) - len(retry))
    if not todo and not retry:
        return [done[q.id] for q in questions]
    method = make_method()
    path.parent.mkdir(parents=True, exist_ok=True)
    if todo:
        with JsonlWriter(path) as out:
            for i in range(0, len(todo), chunk_size):
                chunk = method.run(todo[i:i + chunk_size])
                out.write(t.to_dict() for t in chunk)
                done.update((t.question.id, t) for t in chunk)
                advance(len(chunk))
    # After the appends, with no writer open: a rewrite renames a new file over the old one.
    for i in range(0, len(retry), chunk_size):
        chunk = method.run(retry[i:i + chunk_size])
        replace_records(path, {t.question.id: t.to_dict() for t in chunk}, key=lambda r: r["question"]["id"])
        done.update((t.question.id, t) for t in chunk)
        advance(len(chunk))
    return [done[q.id] for q in questions]


def gold_ids_for(questions: list[Question], corpus: Path) -> dict[str, set[str]]:
    """Gold passage ids in `corpus` (a corpus jsonl, or an index dir's passages.jsonl)."""
    from eval.corpus import gold_passage_ids

    return gold_passage_ids(questions, corpus)


def _claim_run_dir(run_dir: Path, cfg: EvalConfig) -> None:
    """A run dir belongs to one config: resuming with a different one would mix results. Where
    the folder lives (out_dir, run_name) is not part of its records: a moved run resumes."""
    claim(run_dir, to_dict(cfg), EvalConfig, neutral=("out_dir", "run_name"),
          hint="use another --run-name or delete the folder")


def write_reports(rows: list[dict], run_dir: Path) -> None:
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    atomic_write_text(run_dir / "summary.json", json.dumps(rows, indent=2))
    atomic_write_text(run_dir / "results.md", markdown_report(rows, datasets) + _robustness(rows))
    write_plots(rows, datasets, run_dir / "plots")


def _robustness(rows: list[dict]) -> str:
    """Mean and sigma of F1 over the shuffle seeds, per (model, dataset, method)."""
    from statistics import mean, pstdev

    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if "@shuffle" in r["method"]:
            key = (r["model"], r["dataset"], r["method"].split("@")[0])
            groups.setdefault(key, []).append(r["summary"]["f1"])
    if not groups:
        return ""
    table = Table([Column("model", lambda g: g[0][0]), Column("dataset", lambda g: g[0][1]),
                   Column("method", lambda g: g[0][2]), Column("seeds", lambda g: str(len(g[1])), "right"),
                   Column("mean", lambda g: f"{mean(g[1]):.2f}", "right"),
                   Column("sigma", lambda g: f"{pstdev(g[1]):.2f}", "right")], list(groups.items()))
    return "\n".join(["", "## Shuffled final documents (F1 over seeds)", "", table.markdown()]) + "\n"


def read_summary(path: Path) -> list[dict]:
    """A run's summary.json as write_reports wrote it; anything else (a torn or hand-edited file)
    is a JsonlError naming the file."""
    rows = read_json(path)
    keys = ("model", "dataset", "method", "summary")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and all(k in r for k in keys) for r in rows):
        raise JsonlError(f"{path}: not a kair eval summary (a list of {{{', '.join(keys)}}} rows)")
    return rows
