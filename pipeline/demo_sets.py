"""The demo's question sets, each with the corpus it retrieves from: the embedded demo world (or a
folder in its layout), or benchmark files with a closed corpus per set (eval.corpus.corpus_for)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from data_gen.chains import with_passages
from eval.specs import DatasetSpec, TrainSet
from kair_runtime.config import ConfigError
from kair_runtime.records import Question
from pipeline.demo_config import CORPUS_FILE, QUESTIONS_FILE, DemoConfig

@dataclass
class QuestionSet:
    """Questions with the corpus they are retrieved from, and their gold passage ids (recall)."""

    label: str
    questions: list[Question]
    corpus: Path
    gold: dict[str, set[str]]


def is_benchmark_dir(data_dir: str | None) -> bool:
    return data_dir is not None and not (Path(data_dir) / QUESTIONS_FILE).exists()


def demo_sets(cfg: DemoConfig) -> tuple[QuestionSet, list[QuestionSet]]:
    """The embedded demo (or a folder in its layout): one corpus for train and dev."""
    from kair_runtime.demo_data import demo_corpus_path, demo_questions_path, load_demo_questions
    from kair_runtime.retrieval import load_corpus

    if cfg.data_dir is None:
        questions_file, corpus = demo_questions_path(), demo_corpus_path()
    else:
        questions_file, corpus = Path(cfg.data_dir) / QUESTIONS_FILE, Path(cfg.data_dir) / CORPUS_FILE
        if not corpus.is_file():
            raise ConfigError(f"--data {cfg.data_dir}: {CORPUS_FILE} not found beside {QUESTIONS_FILE}")
    passages = {p.id: p for p in load_corpus(corpus)}
    train = with_passages(load_demo_questions("train", questions_file), passages)
    dev = load_demo_questions("dev", questions_file)[:cfg.dev_limit]
    if not train or not dev:
        raise ConfigError(f"{questions_file}: needs train and dev questions (has {len(train)} / {len(dev)})")

    def gold(qs):
        return {q.id: set(q.metadata.get("supporting_ids", [])) for q in qs}

    return (QuestionSet("demo-train", train, corpus, gold(train)),
            [QuestionSet("demo-dev", dev, corpus, gold(dev))])


def benchmark_specs(items: list[DatasetSpec | str], cls: type[DatasetSpec], root: Path) -> list[list[DatasetSpec]]:
    """train_sets or dev_sets as specs of the files they read, one list per item: a `name:split`
    string (both parts required; the default entry of that set, if DemoConfig has one, gives its
    other settings) or a mapping. A split is read from root's copy of the shared data layout, one
    spec per file of the split (HotpotQA's train split is two files); the item's `limit` is left
    to the caller, who applies it to the split as a whole. Relative extra_corpus paths are under root."""
    from eval.datasets import DatasetError, split_files

    defaults = [d for f in ("train_sets", "dev_sets") for d in getattr(DemoConfig(), f) if isinstance(d, DatasetSpec)]
    groups = []
    for item in items:
        spec = item
        if isinstance(item, str):
            spec = cls.from_arg(item, strict=True)
            spec = next((d for d in defaults if (d.name, d.split, d.path) == (spec.name, spec.split, spec.path)), spec)
        if spec.corpus or spec.corpus_from:
            raise ConfigError(f"{spec.name}: the demo builds each set's closed corpus from its own file; corpus "
                              "and corpus_from are `kair eval` settings (add paragraph files with extra_corpus)")
        try:
            paths = [Path(spec.path)] if spec.path else split_files(spec.name, spec.split, root)
        except DatasetError as e:
            raise ConfigError(f"--data {root}: {e}") from None
        extra = [str(root / e) for e in spec.extra_corpus]
        # The extra corpus rides on the first file's spec only: the set's corpus is the union anyway.
        groups.append([dataclasses.replace(spec, path=str(p), extra_corpus=extra if i == 0 else [])
                       for i, p in enumerate(paths)])
    return groups


def benchmark_sets(cfg: DemoConfig, out: Path) -> tuple[QuestionSet, list[QuestionSet]]:
    """Benchmark files: the train sets share the closed corpus of their own paragraphs; each dev
    set gets the closed corpus of its split (every question's paragraphs, not only dev_limit's).
    With `runtime.retriever.index_dir` every set retrieves from that prebuilt index instead, and
    its passages are the corpus gold ids map into."""
    from data_gen.store import distinct_questions, load_questions
    from eval.corpus import corpus_for
    from eval.run import gold_ids_for
    from kair_runtime.retrieval.store import PASSAGES

    root = Path(cfg.data_dir)
    index = cfg.runtime.retriever.index_dir

    def corpus_of(label: str, specs: list[DatasetSpec]) -> Path:
        if index:
            return Path(index) / PASSAGES
        # Built once and reused only while its sources are unchanged: a resumed run must
        # retrieve from the same passages. The specs read files, so the sources are named by file.
        missing = [e for s in specs for e in s.extra_corpus if not Path(e).is_file()]
        if missing:
            raise ConfigError(f"--data {root}: {', '.join(missing)} not found (the extra_corpus of {label}; "
                              "give that set as a mapping without it to leave it out)")
        return corpus_for(specs, out / "corpora" / f"{label}.jsonl")

    def questions(group: list[DatasetSpec], limit: int | None) -> list[Question]:
        qs = load_questions([dataclasses.replace(s, extra_corpus=[], limit=None) for s in group])
        return qs[:limit] if limit is not None else qs

    train_groups = benchmark_specs(cfg.train_sets, TrainSet, root)
    train_qs = distinct_questions((f"train_sets[{i}]", q) for i, group in enumerate(train_groups)
                                  for q in questions(group, group[0].limit))
    train_corpus = corpus_of("train", [s for group in train_groups for s in group])
    train = QuestionSet("train", train_qs, train_corpus, {})
    dev = []
    for group in benchmark_specs(cfg.dev_sets, DatasetSpec, root):
        spec = group[0]
        corpus = corpus_of(f"{spec.name}-{spec.split}", group)
        qs = questions(group, spec.capped(cfg.dev_limit))
        dev.append(QuestionSet(spec.name, qs, corpus, gold_ids_for(qs, corpus)))
    if not train_qs or not any(d.questions for d in dev):
        raise ConfigError(f"--data {root}: no train or no dev questions")
    return train, dev

