"""What every data_gen command shares: training-set specs, the closed corpus, and trajectory files.

A trajectory folder looks like

    OUT/config.yaml                                  the resolved config (a rerun must match it)
    OUT/corpus.jsonl                                 the closed corpus, when none was given
    OUT/trajectories/shard-00000-of-00004.jsonl      one Trace per line

and every trajectory is keyed by `question id # sample id` (`trajectory_key`), so resuming,
filtering and splitting never count one twice. Readers accept that folder, one jsonl file, or a
folder of jsonl files (a filter output's `kept.jsonl`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Iterable

from eval.specs import TrainSet
from kair_runtime.config import ConfigError, RetrieverConfig
from kair_runtime.jsonl import JsonlError, complete_records
from kair_runtime.records import Question, Trace

TRAJECTORY_DIR = "trajectories"


# The training-set spec of every data_gen config (eval.specs.TrainSet: the one dataset-spec type,
# train split by default), under the name data_gen's callers use.
DataSpec = TrainSet


def load_questions(specs: list[TrainSet]) -> list[Question]:
    """Every spec's questions, in order; one id in two specs is an error (keys would collide)."""
    from eval.datasets import load_dataset

    if not specs:
        raise ConfigError("no datasets: set `datasets` (e.g. [{name: hotpotqa, split: train}])")
    for i, spec in enumerate(specs):
        if spec.corpus or spec.corpus_from or spec.extra_corpus:
            # One corpus serves every training set here; a per-set one would be silently unused.
            raise ConfigError(f"datasets[{i}] ({spec.name}) sets corpus, corpus_from or extra_corpus, which only "
                              "`kair eval` reads per dataset; set the top-level `corpus` or `extra_corpus`")
    return distinct_questions((f"{spec.name}:{spec.source}", q) for spec in specs
                              for q in load_dataset(spec.name, path=spec.path, split=spec.split, limit=spec.limit))


def distinct_questions(labelled: Iterable[tuple[str, Question]]) -> list[Question]:
    """The questions of (where from, question) pairs, in order; one id in two places is an
    error (their trajectories would share a key)."""
    out: list[Question] = []
    where: dict[str, str] = {}
    for label, q in labelled:
        if q.id in where:
            raise ConfigError(f"question id {q.id!r} is in both {where[q.id]} and {label}")
        where[q.id] = label
        out.append(q)
    return out


def retriever_config_for(cfg: Any, out_dir: Path) -> tuple[RetrieverConfig, Path]:
    """The retriever config of a datagen command (generate, silver) and the passages file its ids
    come from: runtime.retriever_config_over's rule, with the command's own `corpus` key, when set,
    in place of `retriever.corpus`: the index dir, else that corpus, else the closed corpus of the
    training sets built into OUT/corpus.jsonl (only then)."""
    from kair_runtime.runtime import retriever_config_over

    rc = cfg.runtime.retriever
    rc = dataclasses.replace(rc, corpus=cfg.corpus) if cfg.corpus else rc
    return retriever_config_over(rc, lambda: closed_corpus(cfg.datasets, cfg.extra_corpus, out_dir / "corpus.jsonl"))


def closed_corpus(specs: list[TrainSet], extra: list[str], out: Path) -> Path:
    """The union of the specs' own paragraphs (every question of each split, not only the
    `limit` ones, so shards and reruns retrieve from the same corpus), built once (atomically,
    so machines sharing OUT never read a half-written file) and reused while its sources are
    unchanged (eval.corpus.corpus_for)."""
    from eval.corpus import corpus_for

    return corpus_for(specs, out, extra)


def without_context(q: Question) -> Question:
    """The question as stored in a trajectory: its 10-20 context paragraphs are in the corpus
    already, so they are left out (the gold annotations stay)."""
    meta = {k: v for k, v in q.metadata.items() if k != "context"}
    return dataclasses.replace(q, metadata=meta)


# ---------------------------------------------------------------- trajectory files


def trajectory_key(trace: Trace) -> str:
    """question#sample: unique within one source's files (a teacher run resumes by it)."""
    return sample_key(trace.question.id, trace.extra.get("sample_id", 0))


def sample_key(question_id: str, sample_id: int) -> str:
    """The trajectory_key of question `question_id`'s sample `sample_id`, before it is run."""
    return f"{question_id}#{sample_id}"


def source_key(trace: Trace) -> str:
    """source/question#sample: unique across sources, so silver and teacher trajectories of the
    same question (both sample 0) can be filtered and converted together."""
    return f"{trace.extra.get('teacher', 'unknown')}/{trajectory_key(trace)}"


def shard_path(out_dir: Path, shard: int, num_shards: int) -> Path:
    return out_dir / TRAJECTORY_DIR / f"shard-{shard:05d}-of-{num_shards:05d}.jsonl"


def trajectory_files(path: str | Path) -> list[Path]:
    """A jsonl file; a folder's `trajectories/*.jsonl`; else its `kept.jsonl`; else its *.jsonl."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such trajectory file or folder")
    for candidates in (sorted((path / TRAJECTORY_DIR).glob("*.jsonl")), [path / "kept.jsonl"],
                       sorted(path.glob("*.jsonl"))):
        found = [p for p in candidates if p.is_file()]
        if found:
            return found
    raise FileNotFoundError(f"{path}: no trajectories (looked for {TRAJECTORY_DIR}/*.jsonl, kept.jsonl, *.jsonl)")


def read_trajectories(path: str | Path) -> list[Trace]:
    """Every trajectory under `path`, in file order. A torn last line (a generate still running,
    or killed) is skipped with a warning on stderr; any other bad line is an error naming it;
    a (source, key) seen twice is an error."""
    traces: list[Trace] = []
    seen: dict[str, str] = {}
    for file in trajectory_files(path):
        for where, rec in _records(file):
            try:
                trace = Trace.from_dict(rec)
            except (KeyError, TypeError, ValueError) as e:
                raise JsonlError(f"{where}: not a trajectory record ({type(e).__name__}: {e})") from None
            key = source_key(trace)
            if key in seen:
                raise JsonlError(f"{where}: trajectory {key} also at {seen[key]}")
            seen[key] = where
            traces.append(trace)
    return traces


def _records(file: Path) -> Iterable[tuple[str, dict[str, Any]]]:
    """The finished records of a trajectory file, read without changing it (a generate may still
    be appending): a torn last line is skipped with a warning."""
    records, _, torn = complete_records(file)
    if torn is not None:
        print(f"warning: {file}:{torn}: skipping a torn last line (a write cut short)", file=sys.stderr)
    for i, rec in records:
        if not isinstance(rec, dict):
            raise JsonlError(f"{file}:{i}: expected a JSON object, got {type(rec).__name__}")
        yield f"{file}:{i}", rec

