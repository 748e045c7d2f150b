"""`kair demo`: the whole distillation on one CPU, from data to a served adapter.

    kair demo [--out runs/demo] [--train-steps N] [--max-steps 2] [--data DIR] [--config FILE]
    kair demo --config configs/demo/benchmark-cpu.yaml     # the measured benchmark (~1.5 h on 2 cores)

Data, by `data_dir`:
  - none (default): the embedded demo world (kair_runtime.demo_data: 16 train + 8 dev invented
    two/three-hop questions over a 72-passage corpus), or a folder holding files in its layout
    (demo_questions.jsonl + demo_corpus.jsonl);
  - a benchmark folder such as ../shared/data: train on `train_sets` (HotpotQA + MuSiQue train),
    evaluate on `dev_sets` (HotpotQA, MuSiQue, 2Wiki dev), each split over its own closed corpus.

Stages:
    1. index     a retriever per corpus (the configured one: MiniLM dense by default)
    2. data      silver trajectories from the train questions' gold chains (no LLM), plus teacher
                 trajectories when `teacher` names an LLM (a large model behind the openai or vllm
                 backend), filtered by answer F1, turned into SFT chats (the prompts the loop sends)
    3. train     SFT of the student (SmolLM2-135M; LoRA, or full fine-tuning) on the CPU
    4. eval      on the dev questions: the prompted student in the KAIR loop, the tuned one (same
                 loop and settings) and vanilla RAG with the prompted student, same retriever
    5. serve     how to serve the tuned student

Everything lands in one run folder:

    OUT/config.yaml  OUT/silver/  OUT/teacher/  OUT/filtered/{kept.jsonl,report.md}  OUT/sft/
    OUT/train.yaml  OUT/adapter/ (or OUT/student/ when fully fine-tuned)
    OUT/traces/<dataset>/<run>.jsonl  OUT/plots/*.png  OUT/results.md  OUT/summary.json

A rerun with the same config resumes: training is skipped when OUT/train.yaml is unchanged and
the student was saved, and each eval run continues its traces file. With the default settings
the numbers are a smoke test of the plumbing, and the output says so.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import typer
import yaml

from data_gen.chains import with_passages
from eval.specs import DatasetSpec, TrainSet
from kair_runtime.config import ConfigError, LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig, apply_overrides, \
    from_dict, read_yaml, to_dict
from kair_runtime.jsonl import atomic_write_text
from kair_runtime.records import Question, Trace
from kair_runtime.rundir import claim

QUESTIONS_FILE = "demo_questions.jsonl"
CORPUS_FILE = "demo_corpus.jsonl"


def _smoke_runtime() -> RuntimeConfig:
    # Compact prompts keep a CPU step to seconds: 3 passages of at most 40 words, short outputs.
    return RuntimeConfig(
        llm=LLMConfig(backend="hf", model="smollm2-135m", device="cpu", dtype="float32", batch_size=8),
        retriever=RetrieverConfig(kind="dense", encoder="minilm"),
        loop=LoopConfig(index_format="kr", max_steps=2, top_k=3, step_max_tokens=96, answer_max_tokens=16,
                        max_passage_words=40))


@dataclass
class TrainSettings:
    """The student's SFT run (train/sft.py keys). The default is a handful of LoRA steps at a high
    rate: enough for the adapter to pick up the output layout, not to learn the task."""

    steps: int = 12
    learning_rate: float = 1.0e-3
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    batch_size: int = 4
    use_peft: bool = True  # false: full fine-tuning (a 135M model fits in CPU memory)
    lora_r: int = 16
    lora_alpha: int = 32
    max_length: int = 1024
    save_steps: int = 0  # > 0: a checkpoint and a validation loss every N steps
    seed: int = 0
    # A checkpoint dir of an earlier run with the same data: its weights, optimizer, scheduler step
    # and data position are restored and training goes on to `steps` (the schedule is over `steps`).
    resume_from_checkpoint: str | None = None


# The runs stage 4 can compare, by name: (row label, method, tuned student?)
EVAL_RUNS: dict[str, tuple[str, str, bool]] = {"prompted-kair": ("prompted", "kair", False),
                                               "prompted-vanilla": ("prompted", "vanilla", False),
                                               "tuned-kair": ("tuned", "kair", True)}


def _dev_sets() -> list[DatasetSpec | str]:
    # A 2Wiki dev question's own paragraphs are a small corpus; the benchmark folder also ships the
    # paragraphs of a 1,000-question dev sample, which the closed corpus of 2Wiki dev includes.
    return ["hotpotqa:dev", "musique:dev",
            DatasetSpec("2wikimultihopqa", "dev", extra_corpus=["2wikimultihopqa/corpus_6119.json"])]


@dataclass
class DemoConfig:
    runtime: RuntimeConfig = field(default_factory=_smoke_runtime)  # llm.model is the student
    out_dir: str = "runs/demo"
    data_dir: str | None = None  # None: the embedded demo; else a demo-layout or benchmark folder
    # With a benchmark folder only: `name:split` strings or eval.specs mappings ({name, split, path, limit,
    # extra_corpus}); a split's file and relative extra_corpus paths are under data_dir. A string
    # naming the set of a mapping below takes its settings (2Wiki dev: its extra paragraphs).
    train_sets: list[TrainSet | str] = field(default_factory=lambda: ["hotpotqa:train", "musique:train"])
    dev_sets: list[DatasetSpec | str] = field(default_factory=_dev_sets)
    teacher: LLMConfig | None = None  # an LLM whose KAIR trajectories join the silver ones
    min_f1: float = 1.0  # answer F1 a trajectory needs to become training data
    train: TrainSettings = field(default_factory=TrainSettings)
    validation_fraction: float = 0.1  # of the train questions, held out for the SFT validation split
    dev_limit: int | None = None  # the first N questions of each dev set (None: all)
    # Which EVAL_RUNS stage 4 runs; e.g. [tuned-kair] to measure the student alone (after a change to
    # the loop settings, in a new out_dir: OUT/traces/ refuses to resume under other settings).
    eval_runs: list[str] = field(default_factory=lambda: list(EVAL_RUNS))


# ---------------------------------------------------------------- data: question sets and their corpora


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


def benchmark_specs(items: list[DatasetSpec | str], cls: type[DatasetSpec], root: Path) -> list[DatasetSpec]:
    """train_sets or dev_sets as specs of the files they read: a `name:split` string (both parts
    required; the default entry of that set, if DemoConfig has one, gives its other settings) or a
    mapping; a split is read from root's copy of the shared data layout, and relative
    extra_corpus paths are under root."""
    defaults = [d for f in ("train_sets", "dev_sets") for d in getattr(DemoConfig(), f) if isinstance(d, DatasetSpec)]
    specs = []
    for item in items:
        spec = item
        if isinstance(item, str):
            spec = cls.from_arg(item, strict=True)
            spec = next((d for d in defaults if (d.name, d.split, d.path) == (spec.name, spec.split, spec.path)), spec)
        if spec.corpus or spec.corpus_from:
            raise ConfigError(f"{spec.name}: the demo builds each set's closed corpus from its own file; corpus "
                              "and corpus_from are `kair eval` settings (add paragraph files with extra_corpus)")
        path = Path(spec.path) if spec.path else benchmark_file(root, spec.name, spec.split)
        specs.append(dataclasses.replace(spec, path=str(path), extra_corpus=[str(root / e) for e in spec.extra_corpus]))
    return specs


def benchmark_file(root: Path, name: str, split: str) -> Path:
    """root's copy of a split (eval.datasets.default_path, under root instead of the shared data dir)."""
    from eval.datasets import SPLIT_ALIASES, get_spec

    spec = get_spec(name)
    split = SPLIT_ALIASES.get(split, split)
    if split not in spec.files:
        raise ConfigError(f"{name} has no local {split!r} split (has: {sorted(spec.files)})")
    path = root / spec.files[split]
    if not path.is_file():
        raise ConfigError(f"--data {root}: {spec.files[split]} not found")
    return path


def benchmark_sets(cfg: DemoConfig, out: Path) -> tuple[QuestionSet, list[QuestionSet]]:
    """Benchmark files: the train sets share the closed corpus of their own paragraphs; each dev
    set gets the closed corpus of its split (every question's paragraphs, not only dev_limit's).
    With `runtime.retriever.index_dir` every set retrieves from that prebuilt index instead, and
    its passages are the corpus gold ids map into."""
    from data_gen.store import load_questions
    from eval.corpus import corpus_for
    from eval.datasets import load_dataset
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

    train_specs = benchmark_specs(cfg.train_sets, TrainSet, root)
    train_qs = load_questions([dataclasses.replace(s, extra_corpus=[]) for s in train_specs])
    train_corpus = corpus_of("train", train_specs)
    train = QuestionSet("train", train_qs, train_corpus, {})
    dev = []
    for spec in benchmark_specs(cfg.dev_sets, DatasetSpec, root):
        corpus = corpus_of(f"{spec.name}-{spec.split}", [spec])
        qs = list(load_dataset(spec.name, path=spec.path, limit=spec.capped(cfg.dev_limit)))
        dev.append(QuestionSet(spec.name, qs, corpus, gold_ids_for(qs, corpus)))
    if not train_qs or not any(d.questions for d in dev):
        raise ConfigError(f"--data {root}: no train or no dev questions")
    return train, dev


# ---------------------------------------------------------------- stage 2: trajectories -> SFT data


def teacher_trajectories(cfg: DemoConfig, train: QuestionSet, retriever, out: Path) -> list[Trace]:
    """The configured teacher's greedy KAIR trajectories over the train questions, same loop and
    retriever as the student gets (resumable: OUT/teacher keeps what finished)."""
    from data_gen.store import read_trajectories
    from data_gen.teacher import GenerateConfig, SamplingGrid, generate

    gen = GenerateConfig(runtime=dataclasses.replace(cfg.runtime, llm=cfg.teacher), datasets=[],
                         corpus=str(train.corpus), sampling=SamplingGrid(temperatures=[0.0], samples_per_temperature=1),
                         out_dir=str(out / "teacher"),
                         # the scripted backend ignores `model`: don't record a model that never ran
                         teacher="scripted" if cfg.teacher.backend == "scripted" else None)
    result = generate(gen, retriever=retriever, questions=train.questions)
    return read_trajectories(result.path)


def make_sft_data(cfg: DemoConfig, train: QuestionSet, retriever, out: Path) -> dict[str, Any]:
    """Silver (+ teacher) trajectories -> filter by answer F1 -> SFT chats, each in its own folder."""
    from data_gen.filter import FilterConfig, run_filter
    from data_gen.sft import SFTDataConfig, build_sft
    from data_gen.silver import run_silver
    from kair_runtime.jsonl import JsonlWriter

    traces = run_silver(train.questions, retriever, cfg.runtime, train.corpus)
    (out / "silver").mkdir(parents=True, exist_ok=True)
    with JsonlWriter(out / "silver" / "trajectories.jsonl") as w:
        w.write(t.to_dict() for t in traces)
    sources = {"silver": len(traces)}
    if cfg.teacher is not None:
        taught = teacher_trajectories(cfg, train, retriever, out)
        sources["teacher"] = len(taught)
        traces = traces + taught
    report = run_filter(FilterConfig(out_dir=str(out / "filtered"), min_f1=cfg.min_f1), traces)
    if report["kept"] == 0:
        raise ConfigError(f"no trajectory passed the filter (see {out / 'filtered' / 'report.md'}); "
                          "raise max_steps or top_k, or lower min_f1")
    stats = build_sft(SFTDataConfig(runtime=cfg.runtime, trajectories=str(out / "filtered"), out_dir=str(out / "sft"),
                                    validation_fraction=cfg.validation_fraction, seed=cfg.train.seed))
    return {"sources": sources, "kept": report["kept"], "reasons": report["reasons"],
            "examples": {k: v["examples"] for k, v in stats["splits"].items()}}


# ---------------------------------------------------------------- stage 3: SFT of the student


def train_yaml(cfg: DemoConfig, model_dir: str, out: Path, chat_template: str = "auto") -> dict[str, Any]:
    """The train/sft.py config of the student's run (written to OUT/train.yaml, rerunnable)."""
    t = cfg.train
    settings: dict[str, Any] = {"model_name_or_path": model_dir, "dtype": "float32", "use_peft": t.use_peft}
    if t.use_peft:
        settings.update(lora_r=t.lora_r, lora_alpha=t.lora_alpha, lora_dropout=0.0,
                        lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"])
    settings.update({
        "dataset_path": str(out / "sft" / "dataset"), "training_chat_template": chat_template,
        "output_dir": str(student_dir(cfg, out)), "use_cpu": True, "bf16": False, "seed": t.seed,
        "max_steps": t.steps, "per_device_train_batch_size": t.batch_size, "gradient_accumulation_steps": 1,
        "learning_rate": t.learning_rate, "lr_scheduler_type": t.lr_scheduler_type, "warmup_steps": t.warmup_steps,
        "max_length": t.max_length, "assistant_only_loss": True, "packing": False,
        "logging_steps": max(1, min(5, t.steps // 6)), "gradient_checkpointing": False,
        "eval_strategy": "steps" if t.save_steps else "no", "save_strategy": "steps" if t.save_steps else "no",
        "report_to": "none", "dataloader_num_workers": 0, "disable_tqdm": False,
    })
    if t.save_steps:
        settings.update(save_steps=t.save_steps, eval_steps=t.save_steps)
    if t.resume_from_checkpoint:
        settings["resume_from_checkpoint"] = t.resume_from_checkpoint
    return settings


def student_dir(cfg: DemoConfig, out: Path) -> Path:
    return out / ("adapter" if cfg.train.use_peft else "student")


def training_template(model: str, out: Path) -> str:
    """training_chat_template for this student: SmolLM2's registered template, copied into the run
    folder so the run is self-contained; any other student uses train.templates' "auto"."""
    from train.templates import TRAINING_TEMPLATES

    if model != "smollm2-135m":
        return "auto"
    path = out / "training_chat_template.jinja"
    shutil.copyfile(TRAINING_TEMPLATES["smollm2"], path)
    return str(path)


def saved_student(path: Path) -> bool:
    weights = (path / "adapter_config.json").is_file() or (path / "model.safetensors").is_file()
    return weights and (path / "trainer_state.json").is_file()


def loss_log(student: Path) -> list[dict[str, float]]:
    """The logged training and validation losses, from the trainer_state.json saved with the student."""
    state = json.loads((student / "trainer_state.json").read_text(encoding="utf-8"))
    return [{k: r[k] for k in ("step", "loss", "eval_loss") if k in r} for r in state["log_history"]
            if "loss" in r or "eval_loss" in r]


def training_seconds(student: Path) -> float | None:
    """How long the saved student's training took (the trainer's own train_runtime)."""
    state = json.loads((student / "trainer_state.json").read_text(encoding="utf-8"))
    return next((r["train_runtime"] for r in reversed(state["log_history"]) if "train_runtime" in r), None)


def train_student(cfg: DemoConfig, out: Path, console) -> tuple[Path, list[dict[str, float]], bool]:
    """SFT in this process; returns the student dir, the logged losses, and whether this run
    trained (False: a student saved by the same train.yaml settings is reused)."""
    from kair_runtime.llm.hf import resolve_model
    from train.sft import run

    model = cfg.runtime.llm.model
    path = out / "train.yaml"
    settings = train_yaml(cfg, resolve_model(model), out, training_template(model, out))
    student = student_dir(cfg, out)
    if path.exists() and yaml.safe_load(path.read_text(encoding="utf-8")) == settings and saved_student(student):
        console.print(f"reusing {student}: {path} has the same settings and the student was saved")
        return student, loss_log(student), False
    atomic_write_text(path, f"# python -m train.sft --config {path}\n" + yaml.safe_dump(settings, sort_keys=False))
    run(["--config", str(path)])
    return student, loss_log(student), True


def tuned_llm(cfg: DemoConfig, student: Path) -> LLMConfig:
    if cfg.train.use_peft:
        return dataclasses.replace(cfg.runtime.llm, adapter=str(student))
    return dataclasses.replace(cfg.runtime.llm, model=str(student), adapter=None)


# ---------------------------------------------------------------- stage 4: evaluation


ALL = "all"  # the label of the rows pooling every dev set's questions
MIN_CHUNK = 16  # questions appended to a traces file at a time (resume granularity), at least


def evaluate(cfg: DemoConfig, dev: list[QuestionSet], retrievers: dict[str, Any], student: Path, out: Path,
             progress) -> list[dict[str, Any]]:
    """Every cfg.eval_runs entry on every dev set (traces in OUT/traces/<set>/), one summary row per
    (run, set), then, with several sets, one per run over all their questions pooled."""
    from eval.methods import MethodSettings, build_method
    from eval.report import summarize
    from eval.run import resume_traces
    from kair_runtime.llm import AdapterSwitcher

    settings = MethodSettings(loop=cfg.runtime.loop, vanilla_top_k=cfg.runtime.loop.top_k)
    # One model in memory at a time (EVAL_RUNS lists the prompted runs together); on vllm the
    # prompted and the LoRA-tuned student share one engine.
    models = AdapterSwitcher(cfg.runtime.llm, [None, str(student)] if cfg.train.use_peft else [None])

    tuned_cfg = tuned_llm(cfg, student)

    def llm_for(tuned: bool):
        return models.get(tuned_cfg.adapter, model=tuned_cfg.model) if tuned else models.get(None)

    rows, pooled = [], []
    with models:
        for label, method, tuned in (EVAL_RUNS[name] for name in EVAL_RUNS if name in cfg.eval_runs):
            name = f"{label}-{method}"
            task = progress.add_task(f"eval {name}", total=sum(len(d.questions) for d in dev))
            all_traces, all_gold = [], {}
            for qs in dev:
                traces = resume_traces(
                    lambda qs=qs, method=method, tuned=tuned: build_method(method, llm_for(tuned),
                                                                           retrievers[qs.label], settings),
                    qs.questions, out / "traces" / qs.label / f"{name}.jsonl",
                    lambda n, task=task: progress.advance(task, n),
                    max(MIN_CHUNK, cfg.runtime.llm.batch_size))  # whole batches: the loop batches what it is given
                rows.append(row(cfg, label, method, qs.label, summarize(traces, qs.gold)))
                all_traces += traces
                all_gold.update(qs.gold)
            pooled.append(row(cfg, label, method, ALL, summarize(all_traces, all_gold)))
    return rows + pooled if len(dev) > 1 else rows


def row(cfg: DemoConfig, label: str, method: str, dataset: str, summary: dict[str, Any]) -> dict[str, Any]:
    return {"model": f"{cfg.runtime.llm.model} ({label})", "method": method, "dataset": dataset, "summary": summary}


# ---------------------------------------------------------------- the table


def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pooled rows first (the headline), then each dev set's."""
    return [r for r in rows if r["dataset"] == ALL] + [r for r in rows if r["dataset"] != ALL]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    from eval.report import HEADLINE_COLUMNS
    from eval.table import Table

    return Table(HEADLINE_COLUMNS, ordered(rows)).markdown()


# The terminal's headers, shorter than the file's, so that the table fits 80 columns.
TERMINAL_HEADERS = ("dataset", "student", "method", "n", "F1", "EM", "valid %", "steps", "tok/q")


def rich_table(rows: list[dict[str, Any]], student: str):
    """The terminal version: the student named once in the title, each row saying "prompted" or
    "tuned", and a rule under the pooled rows."""
    from rich import box

    from eval.report import HEADLINE_COLUMNS
    from eval.table import Table

    columns = [dataclasses.replace(c, header=h) for c, h in zip(HEADLINE_COLUMNS, TERMINAL_HEADERS)]
    columns[1] = dataclasses.replace(columns[1], cell=lambda r: r["model"].removeprefix(student).strip(" ()"))
    rows = ordered(rows)
    pooled = sum(r["dataset"] == ALL for r in rows)
    return Table(columns, rows).rich(
        fit=True, rule_after=pooled if pooled < len(rows) else None, box=box.SIMPLE_HEAD, pad_edge=False,
        collapse_padding=True, title=f"{student} on the dev questions (F1/EM x100)",
        caption="valid %: steps whose index, judgment and query parsed; tok/q: prompt + completion tokens")


SMOKE_NOTE = ("This is a SMOKE-SCALE run ({steps} training steps, {n_dev} dev questions): it checks that every "
              "stage works end to end, and its numbers say little about the method. The measured benchmark is "
              "`kair demo --config configs/demo/benchmark-cpu.yaml` (docs/results.md).")
# At or above this many training steps and dev questions the run is a measurement, not a smoke test.
SMOKE_LIMITS = (60, 100)


def scale_note(cfg: DemoConfig, n_dev: int) -> str | None:
    if cfg.train.steps >= SMOKE_LIMITS[0] and n_dev >= SMOKE_LIMITS[1]:
        return None
    return SMOKE_NOTE.format(steps=cfg.train.steps, n_dev=n_dev)


def write_serve_config(cfg: DemoConfig, student: Path, corpus: Path, out: Path) -> Path:
    """OUT/serve.yaml: the tuned student behind the loop settings it was trained with."""
    from kair_runtime.serve.config import ServeConfig

    rc = cfg.runtime.retriever
    serve = ServeConfig(llm=tuned_llm(cfg, student),
                        retriever=rc if rc.index_dir else dataclasses.replace(rc, corpus=str(corpus)),
                        loop=cfg.runtime.loop)
    path = out / "serve.yaml"
    atomic_write_text(path, f"# kair serve --config {path} --port 8000\n"
                      + yaml.safe_dump(to_dict(serve), sort_keys=False))
    return path


def loss_line(log: list[dict[str, float]], key: str) -> str:
    """`1.406 (5) -> ... -> 0.345 (90)`: at most 8 points, first and last included."""
    points = [(int(r["step"]), r[key]) for r in log if key in r]
    if not points:
        return "not logged"
    if len(points) > 8:
        stride = (len(points) - 1) / 7
        points = [points[round(i * stride)] for i in range(8)]
    return " -> ".join(f"{v:.3f} ({step})" for step, v in points)


def results_markdown(cfg: DemoConfig, rows: list[dict[str, Any]], info: dict[str, Any], note: str | None) -> str:
    from eval.report import results_table, stats_table, step_distribution_table
    from eval.table import Column, Table

    loop, t, d = cfg.runtime.loop, cfg.train, info["data"]
    kind = "LoRA" if t.use_peft else "full fine-tuning"
    per_set = [r for r in rows if r["dataset"] != ALL]
    datasets = list(dict.fromkeys(r["dataset"] for r in per_set))
    stage_times = Table([Column("stage", lambda kv: kv[0]), Column("s", lambda kv: f"{kv[1]:.1f}", "right")],
                        list(info["wall_s"].items()))
    return "\n".join([
        "# kair demo", "", *([f"> {note}", ""] if note else []),
        f"Student `{cfg.runtime.llm.model}`, retriever {cfg.runtime.retriever.kind}"
        f"{f' ({cfg.runtime.retriever.encoder})' if cfg.runtime.retriever.kind == 'dense' else ''}; "
        f"loop: format {loop.index_format}, max_steps {loop.max_steps}, top_k {loop.top_k}, "
        f"max_passage_words {loop.max_passage_words}, step tokens {loop.step_max_tokens}, "
        f"answer tokens {loop.answer_max_tokens}. Data: {info['data_source']}.", "",
        "## Dev results", "", markdown_table(rows), "",
        "F1/EM x100, every question in the denominator. Format valid %: share of loop steps whose index, "
        "judgment and query all parsed from the model's output. tokens/q: prompt + completion tokens per "
        f"question.{' The `all` rows pool every dev set' + chr(39) + 's questions.' if len(datasets) > 1 else ''}", "",
        "## Per dataset", "", results_table(per_set, datasets), "",
        "## Training data and run", "",
        f"- trajectories: {d['sources']}; kept (answer F1 >= {cfg.min_f1}): {d['kept']} "
        f"(rejections: {d['reasons'] or 'none'})",
        f"- SFT examples: {d['examples']} (`sft/README.md`)",
        f"- {kind}: {t.steps} steps, batch {t.batch_size}, learning rate {t.learning_rate} ({t.lr_scheduler_type})",
        f"- training loss by step: {loss_line(info['train_log'], 'loss')}",
        f"- validation loss by step: {loss_line(info['train_log'], 'eval_loss')}", "",
        "## Run statistics", "", stats_table(per_set), "",
        "s/q is each question's latency inside its batch, not throughput.", "",
        "## Reached step", "", step_distribution_table(per_set), "",
        "## Stage wall times (s)", "", stage_times.markdown(), "",
        *([] if info["trained_this_run"] else [
            "This run reused the saved student (same train.yaml); its training took "
            + (f"{info['training_s']:.0f} s (trainer_state.json)." if info["training_s"] is not None
               else "a time trainer_state.json does not record."), ""]),
        "## Files", "",
        "`silver/` (gold-chain trajectories), `teacher/` (when a teacher is set), `filtered/` (kept.jsonl, "
        "report.md), `sft/` (train/validation jsonl, dataset/, README.md), `train.yaml` + the student dir, "
        "`traces/<dataset>/` (one jsonl per eval run), `plots/`, `serve.yaml`, `summary.json` (every figure).", "",
        "## Serve the tuned student", "", f"    kair serve --config {info['serve_config']} --port 8000", ""])


# ---------------------------------------------------------------- the pipeline


STAGES = ("index", "data", "train", "eval", "serve")
TITLES = {"index": "retrievers over the corpora", "data": "trajectories -> filter -> SFT examples",
          "train": "SFT of the student", "eval": "evaluation on the dev questions", "serve": "serving"}


def check_config(cfg: DemoConfig) -> None:
    """The settings that would otherwise fail only at the training stage, after the index and data stages."""
    unknown = [name for name in cfg.eval_runs if name not in EVAL_RUNS]
    if unknown or not cfg.eval_runs:
        raise ConfigError(f"eval_runs: {unknown or 'empty'}; choose among {', '.join(EVAL_RUNS)}")
    t = cfg.train
    if t.steps < 1:
        raise ConfigError(f"train.steps must be >= 1, got {t.steps}")
    if t.resume_from_checkpoint and not (Path(t.resume_from_checkpoint) / "trainer_state.json").is_file():
        raise ConfigError(f"train.resume_from_checkpoint: {t.resume_from_checkpoint} is not a trainer "
                          "checkpoint (no trainer_state.json)")


# Settings that may change between runs into one out_dir without invalidating its traces
# (greedy batched decoding equals one at a time, tests/kair_runtime/llm).
TRACE_NEUTRAL = ("out_dir", "dev_limit", "dev_sets", "eval_runs", "runtime.llm.batch_size", "runtime.loop.round_size")


def claim_traces(cfg: DemoConfig, out: Path) -> None:
    """OUT/traces/ belongs to the settings that made it: resuming them under another loop, model or
    training setting would mix two runs in one table, so that is an error, not a resume."""
    claim(out / "traces", to_dict(cfg), DemoConfig, file="settings.yaml", neutral=TRACE_NEUTRAL,
          holds="traces made with other settings", hint="use another --out, or delete that folder to regenerate them")


def run_demo(cfg: DemoConfig, console=None) -> dict[str, Any]:
    """Run the five stages into cfg.out_dir; returns {"rows", "student", "data", "train_log", "wall_s", ...}."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from eval.report import write_plots
    from kair_runtime.retrieval import build_retriever

    check_config(cfg)
    console = console or Console()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    claim_traces(cfg, out)
    atomic_write_text(out / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    wall: dict[str, float] = {}
    started = last = time.perf_counter()

    def stage(key: str) -> None:
        nonlocal last
        now = time.perf_counter()
        i = STAGES.index(key)
        if i:
            wall[STAGES[i - 1]] = round(now - last, 1)
        last = now
        console.rule(f"[bold][{i + 1}/{len(STAGES)}] {TITLES[key]}")

    stage("index")
    benchmark = is_benchmark_dir(cfg.data_dir)
    train, dev = benchmark_sets(cfg, out) if benchmark else demo_sets(cfg)
    source = f"benchmark files in {cfg.data_dir}" if benchmark else (cfg.data_dir or "the embedded demo world")
    rc = cfg.runtime.retriever
    retrievers = {}

    def over(qs: QuestionSet) -> str:  # a prebuilt index serves every set; else each its own corpus
        return rc.index_dir or str(qs.corpus)

    for qs in [train, *dev]:
        if over(qs) not in retrievers:
            retrievers[over(qs)] = build_retriever(rc if rc.index_dir else dataclasses.replace(rc, corpus=str(qs.corpus)))
        console.print(f"{qs.label}: {len(qs.questions)} questions, {rc.kind} retriever over {over(qs)}")
    by_set = {qs.label: retrievers[over(qs)] for qs in [train, *dev]}

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
    plots = write_plots([r for r in rows if r["dataset"] != ALL], [d.label for d in dev], out / "plots")

    stage("serve")
    serve_config = write_serve_config(cfg, student, dev[0].corpus, out)
    wall["serve"] = round(time.perf_counter() - last, 1)
    wall["total"] = round(time.perf_counter() - started, 1)
    note = scale_note(cfg, sum(len(d.questions) for d in dev))
    info = {"rows": rows, "student": str(student), "trained_this_run": trained, "data": data, "data_source": source,
            "train_log": log, "training_s": training_seconds(student), "wall_s": wall, "out_dir": str(out),
            "serve_config": str(serve_config), "plots": [str(p) for p in plots]}
    atomic_write_text(out / "summary.json", json.dumps(info, indent=2, default=str))
    atomic_write_text(out / "results.md", results_markdown(cfg, rows, info, note))
    console.print(rich_table(rows, cfg.runtime.llm.model))
    console.print(f"serve the tuned student:\n  kair serve --config {serve_config} --port 8000")
    console.print(f"plots: {out / 'plots'}  run folder: {out} (results.md, summary.json, traces/)  "
                  f"total {wall['total']:.0f} s")
    if note:
        console.print(f"[bold yellow]{note}")
    return info


# ---------------------------------------------------------------- CLI


def load_demo_config(config: str | None, overrides: list[str], **flags) -> DemoConfig:
    """YAML (optional), then `--set a.b=v`, then the explicit flags that were given."""
    data = read_yaml(config) if config else {}
    apply_overrides(data, overrides)
    keys = {"out": "out_dir", "data": "data_dir", "train_steps": "train.steps", "max_steps": "runtime.loop.max_steps",
            "model": "runtime.llm.model", "dev_limit": "dev_limit"}
    apply_overrides(data, [f"{keys[k]}={v}" for k, v in flags.items() if v is not None])
    cfg = from_dict(DemoConfig, data)
    check_config(cfg)
    return cfg


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
