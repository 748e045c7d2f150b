"""`kair datagen generate`: run a teacher LLM through the KAIR loop over training questions.

    questions (eval loaders' train splits) x samples (a temperature grid) -> Trace records
    -> OUT/trajectories/shard-0000i-of-0000n.jsonl

Samples: for each temperature of `sampling.temperatures`, `samples_per_temperature` samples
(a greedy temperature, 0, gets one: more would repeat it). Sample ids number that grid. Every
sample id has its own seed, derived from (sampling.seed, sample id); the loop takes one
SamplingParams per batched call, so the questions of one sample id run together as one batch
("a wave") under that seed. vLLM and OpenAI-style servers seed each request on its own, so there
a trajectory depends only on its question and sample id, not on what it was batched with; the
hf backend seeds the whole batched generate (reproducible for the same batch).

Sharding: `--shard i --num-shards n` takes every n-th question from position i of the full
question list, so n machines cover it exactly once. Resuming: each trajectory is appended as
one complete line the moment its question is answered (kair_runtime.jsonl); a rerun drops a
torn last line, reads back the keys (question id # sample id) already there and runs only the
rest: nothing lost, nothing twice. A trajectory whose run failed (`error` set: the backend was
down, say) is kept and counted as failed; `retry_failed` (`--retry-failed`) runs those again and
replaces each in place in the file (an atomic rewrite), keeping every other line as it was.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from data_gen.store import (DataSpec, load_questions, retriever_config_for, sample_key, shard_path, trajectory_key,
                            without_context)
from kair_runtime.config import AT_LEAST_1, NON_NEGATIVE, ConfigError, RuntimeConfig, check_range, check_ranges, to_dict
from kair_runtime.jsonl import JsonlWriter, recover, replace_records
from kair_runtime.llm.base import LLM
from kair_runtime.records import Question, Trace
from kair_runtime.retrieval.base import Retriever
from kair_runtime.rundir import claim, hold
from kair_runtime.loop import KairLoop
from kair_runtime.runtime import build_loop


@dataclass
class SamplingGrid:
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.7, 1.0])
    samples_per_temperature: int = 2
    seed: int = 0  # the base every sample's seed is derived from

    def validate(self, where: str = "sampling") -> None:
        check_ranges(self, {"samples_per_temperature": AT_LEAST_1}, where)
        if not self.temperatures:
            raise ConfigError(f"{where}.temperatures is empty")
        for i, t in enumerate(self.temperatures):
            check_range(t, NON_NEGATIVE, f"{where}.temperatures[{i}]")


@dataclass
class GenerateConfig:
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    datasets: list[DataSpec] = field(default_factory=lambda: [DataSpec("hotpotqa"), DataSpec("musique")])
    corpus: str | None = None  # None: the training sets' own paragraphs, built into OUT/corpus.jsonl
    extra_corpus: list[str] = field(default_factory=list)  # more paragraph files for that corpus
    sampling: SamplingGrid = field(default_factory=SamplingGrid)
    teacher: str | None = None  # the name recorded in every trajectory; None: runtime.llm.model
    out_dir: str = "runs/datagen/teacher"
    shard: int = 0
    num_shards: int = 1


@dataclass(frozen=True)
class Sample:
    sample_id: int
    temperature: float
    seed: int


@dataclass
class GenerateResult:
    path: Path
    total: int  # trajectories this shard owns
    existing: int  # already in the file when this run started
    written: int  # written by this run (new ones and retried ones)
    retried: int = 0  # of those, failed ones run again (replaced in place)
    failed: int = 0  # trajectories in the file with an error when this run ended


def sample_grid(grid: SamplingGrid) -> list[Sample]:
    grid.validate()  # a grid built in code (the demo's rounds), not loaded
    samples: list[Sample] = []
    for t in dict.fromkeys(grid.temperatures):
        for _ in range(1 if t == 0 else grid.samples_per_temperature):
            sid = len(samples)
            samples.append(Sample(sid, float(t), derive_seed(grid.seed, sid)))
    return samples


def derive_seed(base: int, *parts: object) -> int:
    """A stable 31-bit seed from the parts (Python's hash() changes between processes)."""
    key = ":".join(str(p) for p in (base, *parts))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") & 0x7FFFFFFF


def shard_questions(questions: list[Question], shard: int, num_shards: int) -> list[Question]:
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ConfigError(f"--shard must be in [0, {num_shards}) and --num-shards >= 1; got shard {shard} of {num_shards}")
    return questions[shard::num_shards]


def teacher_name(cfg: GenerateConfig) -> str:
    return cfg.teacher or cfg.runtime.llm.model


def resolved_for_claim(cfg: GenerateConfig) -> dict:
    """The config a folder is tied to: all of it but which shard this machine runs."""
    d = to_dict(cfg)
    d.pop("shard")
    return d


def generate(cfg: GenerateConfig, llm: LLM | None = None, retriever: Retriever | None = None,
             progress: bool = True, questions: list[Question] | None = None,
             retry_failed: bool = False) -> GenerateResult:
    """Run this shard's (question, sample) pairs that are not in its file yet, and with
    retry_failed also those recorded with an error. `llm` and `retriever` default to the ones the
    config names (tests pass small real ones); `questions` replaces the ones cfg.datasets would
    load (`kair demo` passes its own)."""
    out_dir = Path(cfg.out_dir)
    samples = sample_grid(cfg.sampling)
    questions = questions if questions is not None else load_questions(cfg.datasets)
    questions = [without_context(q) for q in shard_questions(questions, cfg.shard, cfg.num_shards)]
    path = shard_path(out_dir, cfg.shard, cfg.num_shards)
    # Shards of one generation write the folder side by side: each holds its own part.
    with hold(out_dir, part=path.stem):
        return _generate_held(cfg, llm, retriever, progress, questions, retry_failed, out_dir, samples, path)


def _generate_held(cfg: GenerateConfig, llm: LLM | None, retriever: Retriever | None, progress: bool,
                   questions: list[Question], retry_failed: bool, out_dir: Path, samples: list, path: Path
                   ) -> GenerateResult:
    from kair_runtime.llm import close_llm
    from kair_runtime.runtime import build_llm, build_retriever

    # out_dir names the folder, not its records: a moved or copied folder resumes.
    claim(out_dir, resolved_for_claim(cfg), GenerateConfig, neutral=("out_dir",),
          hint="use another out_dir or delete the folder")
    existing = existing_trajectories(path, questions, samples)
    failed = {key for key, ok in existing.items() if not ok}
    total = len(questions) * len(samples)
    result = GenerateResult(path, total, len(existing), 0, failed=len(failed))
    retry = failed if retry_failed else set()
    if len(existing) == total and not retry:
        return result

    retriever = retriever or build_retriever(retriever_config_for(cfg, out_dir)[0])
    owned = llm is None  # built here, so closed here (vLLM's engine processes)
    llm = llm or build_llm(cfg.runtime.llm)
    try:
        _generate_waves(cfg, llm, retriever, questions, samples, set(existing), retry, path, result, progress)
    finally:
        if owned:
            close_llm(llm)
    return result


RETRY_FLUSH_S = 60.0


def _generate_waves(cfg: GenerateConfig, llm: LLM, retriever: Retriever, questions: list[Question],
                    samples: list[Sample], done: set[str], retry: set[str], path: Path, result: GenerateResult,
                    progress: bool) -> None:
    """One wave per sample id, each new trajectory appended the moment it is answered; then the
    retried ones, which replace their failed records in place, a loop round's worth at a time."""
    from tqdm import tqdm

    total = len(questions) * len(samples)
    with tqdm(total=total, initial=len(done) - len(retry), desc=f"teacher shard {cfg.shard}/{cfg.num_shards}",
              unit="traj", disable=not progress, dynamic_ncols=True) as bar:
        with JsonlWriter(path) as out:
            for wave in _waves(cfg, llm, retriever, questions, samples, lambda k: k not in done):
                for trace in wave:
                    out.write([trace.to_dict()])  # one complete, fsynced line per finished trajectory
                    result.written += 1
                    result.failed += trace.error is not None
                    bar.update(1)
        # With the appending writer closed: a rewrite renames a new file over the old one. Retried
        # trajectories are written a round's worth at a time, at least every RETRY_FLUSH_S, and
        # whatever is done when the run stops (Ctrl-C, a dead engine): a kill loses at most the last
        # RETRY_FLUSH_S of finished work, not a round of slow sampled trajectories.
        flush_every, pending, last = cfg.runtime.loop.round_size, {}, time.monotonic()

        def flush() -> None:
            nonlocal pending, last
            if pending:
                replace_records(path, pending, key=lambda r: trajectory_key(Trace.from_dict(r)))
            pending, last = {}, time.monotonic()

        try:
            for wave in _waves(cfg, llm, retriever, questions, samples, lambda k: k in retry):
                for trace in wave:
                    pending[trajectory_key(trace)] = trace.to_dict()
                    result.written += 1
                    result.retried += 1
                    result.failed -= trace.error is None
                    bar.update(1)
                    if len(pending) >= flush_every or time.monotonic() - last >= RETRY_FLUSH_S:
                        flush()
        finally:
            flush()


def _waves(cfg: GenerateConfig, llm: LLM, retriever: Retriever, questions: list[Question], samples: list[Sample],
           wanted: Callable[[str], bool]) -> Iterator[Iterator[Trace]]:
    """For every sample with questions whose key is wanted: their traces as they are answered
    (KairLoop.iter_run, so a kill loses only the questions in flight), each with the sample's
    extra after the loop's own keys. One loop per sample: its seed and temperature are one
    SamplingParams, and the hf backend seeds a whole batched generate."""
    for sample in samples:
        todo = [q for q in questions if wanted(sample_key(q.id, sample.sample_id))]
        if todo:
            loop_cfg = dataclasses.replace(cfg.runtime.loop, temperature=sample.temperature, seed=sample.seed)
            loop = build_loop(llm, retriever, loop_cfg)
            extra = sample_extra(cfg, sample, loop)
            yield loop.iter_run(todo, on_start=lambda s, e=extra: s.trace.extra.update(e))


def existing_trajectories(path: Path, questions: list[Question], samples: list[Sample]) -> dict[str, bool]:
    """Key -> whether it ran without error, for the trajectories already written (a torn last
    line is cut off first); a key this run would not produce means the file belongs to another
    config or shard."""
    planned = {sample_key(q.id, s.sample_id) for q in questions for s in samples}
    keys: dict[str, bool] = {}
    for i, rec in enumerate(recover(path), 1):
        key = trajectory_key(Trace.from_dict(rec))
        if key not in planned:
            raise ConfigError(f"{path}:{i}: trajectory {key} is not one this shard produces "
                              f"(another config or --num-shards?); use another out_dir")
        if key in keys:
            raise ConfigError(f"{path}:{i}: trajectory {key} appears twice")
        keys[key] = rec.get("error") is None
    return keys


def sample_extra(cfg: GenerateConfig, sample: Sample, kair: KairLoop) -> dict:
    """What each trajectory records about how it was sampled (the loop adds prompt_version). The
    token caps are the loop's own: in structured mode they are at least the grammar's longest
    output, and the filter reads a step that reached its cap as cut off."""
    loop = cfg.runtime.loop
    return {
        "teacher": teacher_name(cfg),
        "backend": cfg.runtime.llm.backend,
        "sample_id": sample.sample_id,
        "seed": sample.seed,
        "sampling": {"temperature": sample.temperature, "top_p": loop.top_p,
                     "step_max_tokens": kair.step_sampling.max_tokens,
                     "answer_max_tokens": kair.answer_sampling.max_tokens,
                     "max_steps": loop.max_steps, "top_k": loop.top_k},
        "shard": cfg.shard,
        "num_shards": cfg.num_shards,
    }
