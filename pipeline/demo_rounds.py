"""Rounds of expert iteration (DemoConfig.rounds), after the silver student:

    round r (1..count), in OUT/round-r/:
        teacher/     round r-1's student in the same loop over the train questions (or a sample of
                     `rounds.questions` of them): one greedy + `rounds.samples` sampled trajectories each
                     (rounds.focus unchained: drawn from the questions silver could not chain)
        relabelled/  (rounds.relabel) every step of those trajectories with the step the question's gold
                     chain implies there (data_gen/relabel.py), trained on beside the filtered ones
        filtered/    silver + those, through the same answer-F1 filter as any teacher, one trajectory
                     per question and retrieval path (silver first, so a path silver already has adds nothing)
        sft/ train.yaml adapter/   a new student trained on that data: from the base, or (rounds.init
                     continue) going on from round r-1's student
        traces/      the new student on the dev questions (the tuned run only)

Each round resumes like the stages before it: the teacher's file keeps what finished, training
is skipped when the student was saved with the same settings, traces continue. OUT/round-r/
settings.yaml ties a round folder to the settings that made it.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from kair_runtime.config import LLMConfig, to_dict
from kair_runtime.records import Question, Trace
from kair_runtime.rundir import claim
from pipeline.demo_config import DemoConfig, trace_neutral
from pipeline.demo_eval import evaluate
from pipeline.demo_sets import QuestionSet
from pipeline.demo_train import sft_data, teacher_trajectories, train_student, tuned_llm

SILVER = "annotations"  # the teacher name silver trajectories carry


def round_dir(out: Path, r: int) -> Path:
    return out / f"round-{r}"


def round_questions(cfg: DemoConfig, train: QuestionSet, r: int, silver_kept: set[str]) -> list[Question]:
    """The train questions round r's teacher runs on: all of the pool, or `rounds.questions` of
    them drawn with seed train.seed + r (another draw each round), kept in file order. The pool is
    every train question, or (rounds.focus unchained) those without a kept silver trajectory
    (`silver_kept`: their ids)."""
    from eval.datasets import subset

    pool = train.questions
    if cfg.rounds.focus == "unchained":
        pool = [q for q in pool if q.id not in silver_kept]
    n = cfg.rounds.questions
    if n is None or n >= len(pool):
        return pool
    return subset(pool, sample=n, seed=cfg.train.seed + r)


def teacher_llm(cfg: DemoConfig, student: Path, rdir: Path) -> LLMConfig:
    """Round r-1's student as round r's teacher, on rounds.backend (default: the student's own).
    vllm gets the adapter merged into the base (OUT/round-r/teacher-model): on a CPU a merged
    model decodes faster than base + LoRA."""
    llm = tuned_llm(cfg, student)
    backend = cfg.rounds.backend or llm.backend
    if backend != "vllm" or llm.adapter is None:
        return dataclasses.replace(llm, backend=backend)
    from train.merge import merge_adapter

    merged = rdir / "teacher-model"
    if not (merged / "config.json").is_file():
        tmp = rdir / ".teacher-model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # a merge killed half-way
        merge_adapter(llm.model, llm.adapter, tmp)
        tmp.replace(merged)
    return dataclasses.replace(llm, backend="vllm", model=str(merged), adapter=None)


def teacher_yield(taught: list[Trace], kept: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per dataset: the teacher's trajectories, and how many of them the filter kept."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for t in taught:
        counts[t.question.dataset]["total"] += 1
    for k in kept:
        if k["extra"].get("teacher") != SILVER:
            counts[k["question"]["dataset"]]["kept"] += 1
    return {name: {"kept": c["kept"], "total": c["total"]} for name, c in counts.items()}


def relabelled_examples(cfg: DemoConfig, taught: list[Trace], train: QuestionSet,
                        out: Path) -> tuple[list[str], dict[str, Any]]:
    """The teacher's trajectories relabelled by their gold chains into OUT/examples.jsonl (rebuilt
    each run: it takes seconds); the file for sft_data and the stats."""
    from data_gen.chains import GoldDocs
    from data_gen.relabel import relabel_traces, write_relabelled
    from kair_runtime.prompts import PromptSet

    rows, stats = relabel_traces(taught, {q.id: q for q in train.questions}, GoldDocs(train.corpus),
                                 PromptSet.for_loop(cfg.runtime.loop).version)
    return [str(write_relabelled(out, rows, stats))], stats


def run_rounds(cfg: DemoConfig, train: QuestionSet, dev: list[QuestionSet], retrievers: dict[str, Any],
               student: Path, out: Path, console, progress) -> tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]:
    """Every round in turn; returns the last student, the rounds' dev rows, and one record per
    round (sizes, yields, training losses)."""
    from data_gen.store import read_trajectories
    from data_gen.teacher import SamplingGrid
    from kair_runtime.jsonl import recover
    from pipeline.demo_train import loss_log, training_seconds

    rc = cfg.rounds
    silver = read_trajectories(out / "silver" / "trajectories.jsonl")
    silver_kept: set[str] = set()
    if rc.focus == "unchained":  # only then: kept.jsonl is tens of MB at the benchmark's scale
        silver_kept = {rec["question"]["id"] for rec in recover(out / "filtered" / "kept.jsonl")
                       if rec["extra"].get("teacher") == SILVER}
    rows, records = [], []
    for r in range(1, rc.count + 1):
        rdir = round_dir(out, r)
        # A round's traces hold what every round up to it was made with; later rounds do not matter.
        claim(rdir, to_dict(cfg), DemoConfig, file="settings.yaml",
              neutral=tuple(n for n in trace_neutral(cfg) if n != "rounds") + ("rounds.count",),
              holds="a round made with other settings", hint="use another --out, or delete that folder")
        questions = round_questions(cfg, train, r, silver_kept)
        llm = teacher_llm(cfg, student, rdir)
        temperatures = [0.0, rc.temperature] if rc.samples else [0.0]
        console.print(f"round {r}: {student} teaches on {llm.backend}, {len(questions)} questions x "
                      f"{1 + rc.samples} trajectories")
        taught = teacher_trajectories(cfg, llm, questions, train.corpus, retrievers[train.label], rdir / "teacher",
                                      SamplingGrid(temperatures, max(1, rc.samples), seed=cfg.train.seed + r),
                                      name=f"round-{r - 1} student")
        extra, relabelled = [], None
        if rc.relabel:
            extra, relabelled = relabelled_examples(cfg, taught, train, rdir / "relabelled")
            console.print(f"round {r}: relabelled {relabelled['examples']} steps and answers of the teacher's "
                          "trajectories by their gold chains")
        data = sft_data(cfg, silver + taught, {"silver": len(silver), "teacher": len(taught)}, rdir,
                        dedupe_paths=True, extra_examples=extra)
        if relabelled is not None:
            data["relabelled"] = relabelled
        data["teacher_kept"] = teacher_yield(taught, recover(rdir / "filtered" / "kept.jsonl"))
        console.print(f"round {r}: teacher kept {data['teacher_kept']}; SFT examples {data['examples']}")
        previous = student
        steps = rc.steps or cfg.train.steps
        student, log, trained = train_student(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps)),
                                              rdir, console, init=previous if rc.init == "continue" else None)
        round_rows = evaluate(dataclasses.replace(cfg, eval_runs=["tuned-kair"]), dev, retrievers, student, rdir,
                              progress, tuned_label=f"round {r}")
        rows += round_rows
        records.append({"round": r, "init": rc.init, "steps": steps, "questions": len(questions),
                        "teacher": str(llm.adapter or llm.model),
                        "backend": llm.backend, "data": data, "student": str(student), "trained_this_run": trained,
                        "train_log": loss_log(student), "training_s": training_seconds(student)})
    return student, rows, records
