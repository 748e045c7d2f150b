"""kair demo [--out runs/demo] [--train-steps N] [--max-steps 2] [--data DIR] [--config FILE]

    kair demo --config configs/demo/benchmark-cpu.yaml     # the measured benchmark (~1.5 h on 2 cores)

The whole distillation on one CPU, from data to a served adapter: a recipe over the stages a user
can also run by hand (`kair datagen silver|generate|filter|to-sft`, `python -m train.sft`, `kair eval`,
`kair serve`), calling the same functions.

Data, by `data_dir` (pipeline/demo_sets.py):
  - none (default): the embedded demo world (kair_runtime.demo_data: 16 train + 8 dev invented
    two/three-hop questions over a 72-passage corpus), or a folder holding files in its layout
    (demo_questions.jsonl + demo_corpus.jsonl);
  - a benchmark folder such as ../shared/data: train on `train_sets` (HotpotQA, MuSiQue, 2Wiki train),
    evaluate on `dev_sets` (HotpotQA, MuSiQue, 2Wiki dev), each split over its own closed corpus.

Stages:
    1. index     a retriever per corpus (the configured one: MiniLM dense by default)
    2. data      silver trajectories from the train questions' gold chains (no LLM), plus teacher
                 trajectories when `teacher` names an LLM (a large model behind the openai or vllm
                 backend), filtered by answer F1, turned into SFT chats (the prompts the loop sends)
                 (pipeline/demo_train.py: data_gen.silver, data_gen.teacher, data_gen.filter, data_gen.sft)
    3. train     SFT of the student (SmolLM2-135M; LoRA, or full fine-tuning) on the CPU
                 (pipeline/demo_train.py: train.sft from OUT/train.yaml)
    4. eval      on the dev questions: the prompted student in the KAIR loop, the tuned one (same
                 loop and settings) and vanilla RAG with the prompted student, same retriever
                 (pipeline/demo_eval.py: eval.run.evaluate_one per run and dev set)
    -  rounds    with `rounds.count` > 0 only: rounds of expert iteration, each student teaching the
                 next from its own filtered trajectories (pipeline/demo_rounds.py, OUT/round-r/)
    5. serve     how to serve the tuned student, the last round's if any (OUT/serve.yaml, for `kair serve`)

Everything lands in one run folder:

    OUT/config.yaml  OUT/silver/  OUT/teacher/  OUT/filtered/{kept.jsonl,report.md}  OUT/sft/
    OUT/train.yaml  OUT/adapter/ (or OUT/student/ when fully fine-tuned)
    OUT/traces/<dataset>/<run>.jsonl  OUT/plots/*.png  OUT/results.md  OUT/summary.json

A rerun with the same config resumes: training is skipped when OUT/train.yaml is unchanged and
the student was saved (and goes on from its last checkpoint when it was not), the teacher's and
each eval run's traces files continue, and so does every round. With the default settings
the numbers are a smoke test of the plumbing, and the output says so (pipeline/demo_report.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer
import yaml

from kair_runtime.config import to_dict
from kair_runtime.jsonl import atomic_write_text
from kair_runtime.rundir import hold
from pipeline.demo_config import CORPUS_FILE, QUESTIONS_FILE, DemoConfig, check_config, claim_traces, load_demo_config
from pipeline.demo_eval import evaluate
from pipeline.demo_report import ALL, results_markdown, rich_table, scale_note
from pipeline.demo_rounds import run_rounds
from pipeline.demo_sets import QuestionSet, benchmark_sets, demo_sets, is_benchmark_dir
from pipeline.demo_train import make_sft_data, train_student, training_seconds, tuned_llm

STAGES = ("index", "data", "train", "eval", "rounds", "serve")
TITLES = {"index": "retrievers over the corpora", "data": "trajectories -> filter -> SFT examples",
          "train": "SFT of the student", "eval": "evaluation on the dev questions",
          "rounds": "rounds of expert iteration", "serve": "serving"}


def write_serve_config(cfg: DemoConfig, student: Path, corpus: Path, out: Path) -> Path:
    """OUT/serve.yaml: the tuned student behind the loop settings it was trained with."""
    from kair_runtime.runtime import retriever_config_over
    from kair_runtime.serve.config import ServeConfig

    retriever, _ = retriever_config_over(cfg.runtime.retriever, corpus)
    serve = ServeConfig(llm=tuned_llm(cfg, student), retriever=retriever, loop=cfg.runtime.loop)
    path = out / "serve.yaml"
    atomic_write_text(path, f"# kair serve --config {path} --port 8000\n"
                      + yaml.safe_dump(to_dict(serve), sort_keys=False))
    return path



def run_demo(cfg: DemoConfig, console=None) -> dict[str, Any]:
    """Run the stages into cfg.out_dir; returns {"rows", "student", "data", "train_log", "wall_s", ...}."""
    from rich.console import Console

    check_config(cfg)
    with hold(cfg.out_dir):  # one demo writes a folder at a time
        return _run_held(cfg, console or Console())


def _run_held(cfg: DemoConfig, console) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from eval.report import write_plots
    from kair_runtime.runtime import retrievers_over

    out = Path(cfg.out_dir)
    claim_traces(cfg, out)
    atomic_write_text(out / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    wall: dict[str, float] = {}
    started = last = time.perf_counter()
    stages = [s for s in STAGES if s != "rounds" or cfg.rounds.count]

    def stage(key: str) -> None:
        nonlocal last
        now = time.perf_counter()
        i = stages.index(key)
        if i:
            wall[stages[i - 1]] = round(now - last, 1)
        last = now
        console.rule(f"[bold][{i + 1}/{len(stages)}] {TITLES[key]}")

    stage("index")
    benchmark = is_benchmark_dir(cfg.data_dir)
    train, dev = benchmark_sets(cfg, out) if benchmark else demo_sets(cfg)
    source = f"benchmark files in {cfg.data_dir}" if benchmark else (cfg.data_dir or "the embedded demo world")
    rc = cfg.runtime.retriever
    sets = [train, *dev]
    by_set = {}
    for qs, (retriever, passages) in zip(sets, retrievers_over(rc, [qs.corpus for qs in sets])):
        by_set[qs.label] = retriever
        console.print(f"{qs.label}: {len(qs.questions)} questions, {rc.kind} retriever over {rc.index_dir or passages}")

    stage("data")
    data = make_sft_data(cfg, train, by_set[train.label], out)
    console.print(f"trajectories {data['sources']}, {data['kept']} kept, SFT examples {data['examples']}")

    stage("train")
    kind = "LoRA" if cfg.train.use_peft else "full fine-tuning"
    console.print(f"{kind} of {cfg.runtime.llm.model}: {cfg.train.steps} steps on the CPU (config {out / 'train.yaml'})")
    student, log, trained = train_student(cfg, out, console)
    losses = [r["loss"] for r in log if "loss" in r]
    console.print(f"student: {student}; training loss " + " -> ".join(f"{x:.3f}" for x in losses[:1] + losses[-1:]))

    stage("eval")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        rows = evaluate(cfg, dev, by_set, student, out, progress)
    rounds, served = [], student
    if cfg.rounds.count:
        stage("rounds")
        with Progress(*columns, console=console) as progress:
            served, round_rows, rounds = run_rounds(cfg, train, dev, by_set, student, out, console, progress)
        rows += round_rows
    plots = write_plots([r for r in rows if r["dataset"] != ALL], [d.label for d in dev], out / "plots")

    stage("serve")
    serve_config = write_serve_config(cfg, served, dev[0].corpus, out)
    wall["serve"] = round(time.perf_counter() - last, 1)
    wall["total"] = round(time.perf_counter() - started, 1)
    note = scale_note(cfg, sum(len(d.questions) for d in dev))
    info = {"rows": rows, "student": str(student), "trained_this_run": trained, "data": data, "data_source": source,
            "train_log": log, "training_s": training_seconds(student), "wall_s": wall, "out_dir": str(out),
            "serve_config": str(serve_config), "plots": [str(p) for p in plots]}
    if rounds:
        info.update(rounds=rounds, served_student=str(served))
    atomic_write_text(out / "summary.json", json.dumps(info, indent=2, default=str))
    atomic_write_text(out / "results.md", results_markdown(cfg, rows, info, note))
    console.print(rich_table(rows, cfg.runtime.llm.model))
    console.print(f"serve the tuned student:\n  kair serve --config {serve_config} --port 8000")
    console.print(f"plots: {out / 'plots'}  run folder: {out} (results.md, summary.json, traces/)  "
                  f"total {wall['total']:.0f} s")
    if note:
        console.print(f"[bold yellow]{note}")
    return info


def demo_command(
    out: Optional[str] = typer.Option(None, "--out", help="Run folder (default runs/demo)."),
    train_steps: Optional[int] = typer.Option(None, "--train-steps", help="Training steps (default 12)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Retrieval steps per question (default 2)."),
    data: Optional[str] = typer.Option(None, "--data", help=f"A benchmark folder (../shared/data) or one with "
                                                            f"{QUESTIONS_FILE} + {CORPUS_FILE}."),
    model: Optional[str] = typer.Option(None, "--model", help="The student (default smollm2-135m)."),
    dev_limit: Optional[int] = typer.Option(None, "--dev-limit", help="Only the first N questions of each dev set."),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="A configs/demo/*.yaml file."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set train.learning_rate=5e-4"),
) -> None:
    """The whole distillation on the CPU: index, trajectories, SFT of the student, eval, serve."""
    from kair_runtime.errors import USER_ERRORS

    try:
        cfg = load_demo_config(config, set_, out=out, train_steps=train_steps, max_steps=max_steps, data=data,
                               model=model, dev_limit=dev_limit)
        run_demo(cfg)
    except USER_ERRORS as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


if __name__ == "__main__":
    typer.run(demo_command)
