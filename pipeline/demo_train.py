"""The demo's student: its SFT data (silver + teacher trajectories -> answer-F1 filter -> chats,
data_gen's stages) and its training (train/sft.py from OUT/train.yaml, skipped when a student saved
with the same settings is there)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from kair_runtime.config import ConfigError, LLMConfig
from kair_runtime.jsonl import atomic_write, atomic_write_text
from kair_runtime.records import Question, Trace
from pipeline.demo_config import DemoConfig
from pipeline.demo_sets import QuestionSet

# ---------------------------------------------------------------- stage 2: trajectories -> SFT data


def teacher_trajectories(cfg: DemoConfig, llm: LLMConfig, questions: list[Question], corpus: Path, retriever,
                         out_dir: Path, sampling=None, name: str | None = None) -> list[Trace]:
    """A teacher's KAIR trajectories over train questions, same loop and retriever as the student
    gets (greedy unless `sampling` says otherwise; resumable: out_dir keeps what finished)."""
    from data_gen.store import read_trajectories
    from data_gen.teacher import GenerateConfig, SamplingGrid, generate

    gen = GenerateConfig(runtime=dataclasses.replace(cfg.runtime, llm=llm), datasets=[], corpus=str(corpus),
                         sampling=sampling or SamplingGrid(temperatures=[0.0], samples_per_temperature=1),
                         out_dir=str(out_dir),
                         # the scripted backend ignores `model`: don't record a model that never ran
                         teacher=name or ("scripted" if llm.backend == "scripted" else None))
    result = generate(gen, retriever=retriever, questions=questions)
    return read_trajectories(result.path)


def silver_trajectories(cfg: DemoConfig, train: QuestionSet, retriever, out: Path) -> list[Trace]:
    """The train questions' gold chains replayed through the loop (no LLM), into OUT/silver/ (whole:
    deterministic and seconds long, so a rerun rewrites it rather than resuming it)."""
    from data_gen.silver import run_silver

    traces = run_silver(train.questions, retriever, cfg.runtime, train.corpus, cfg.silver_outcomes)
    with atomic_write(out / "silver" / "trajectories.jsonl") as f:
        f.writelines(json.dumps(t.to_dict(), ensure_ascii=False) + "\n" for t in traces)
    return traces


def make_sft_data(cfg: DemoConfig, train: QuestionSet, retriever, out: Path) -> dict[str, Any]:
    """Silver (+ teacher) trajectories -> filter by answer F1 -> SFT chats, each in its own folder."""
    from data_gen.silver import silver_counts

    silver = silver_trajectories(cfg, train, retriever, out)
    sources, taught = {"silver": len(silver)}, []
    if cfg.teacher is not None:
        taught = teacher_trajectories(cfg, cfg.teacher, train.questions, train.corpus, retriever, out / "teacher")
        sources["teacher"] = len(taught)
    data = sft_data(cfg, silver + taught, sources, out)
    return {"sources": sources, "silver": silver_counts(silver), **data}


def sft_data(cfg: DemoConfig, traces: list[Trace], sources: dict[str, int], out: Path,
             dedupe_paths: bool = False, extra_examples: list[str] = ()) -> dict[str, Any]:
    """Trajectories -> the answer-F1 filter (OUT/filtered/) -> SFT chats (OUT/sft/), with
    `extra_examples` (example files, to-sft's layout) beside them; the counts."""
    from data_gen.filter import FilterConfig, run_filter
    from data_gen.sft import SFTDataConfig, build_sft

    report = run_filter(FilterConfig(out_dir=str(out / "filtered"), min_f1=cfg.min_f1, dedupe_paths=dedupe_paths),
                        traces)
    if report["kept"] == 0:
        raise ConfigError(f"no trajectory passed the filter (see {out / 'filtered' / 'report.md'}); "
                          "raise max_steps or top_k, or lower min_f1")
    stats = build_sft(SFTDataConfig(runtime=cfg.runtime, trajectories=str(out / "filtered"), out_dir=str(out / "sft"),
                                    validation_fraction=cfg.validation_fraction, seed=cfg.train.seed,
                                    extra_examples=list(extra_examples)))
    return {"sources": sources, "kept": report["kept"], "kept_by_dataset": report["by_dataset"],
            "reasons": report["reasons"],
            "examples": {k: v["examples"] for k, v in stats["splits"].items()}}


# ---------------------------------------------------------------- stage 3: SFT of the student


def train_yaml(cfg: DemoConfig, model_dir: str, out: Path, chat_template: str = "auto",
               init: Path | None = None) -> dict[str, Any]:
    """The train/sft.py config of the student's run (written to OUT/train.yaml, rerunnable);
    `init`: a trained student to go on from (its adapter, or its weights in full fine-tuning)."""
    t = cfg.train
    if init is not None and not t.use_peft:
        model_dir = str(init)
    bf16 = t.precision == "bfloat16"
    # A LoRA base is frozen, so it can be stored in bf16; the trained weights stay float32 (PEFT keeps
    # the adapter in float32, and full fine-tuning needs float32 master weights for AdamW's small updates).
    base_dtype = "bfloat16" if bf16 and t.use_peft else "float32"
    settings: dict[str, Any] = {"model_name_or_path": model_dir, "dtype": base_dtype, "use_peft": t.use_peft}
    if init is not None and t.use_peft:
        settings["init_adapter"] = str(init)
    if t.use_peft:
        settings.update(lora_r=t.lora_r, lora_alpha=t.lora_alpha, lora_dropout=0.0,
                        lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"])
    settings.update({
        "dataset_path": str(out / "sft" / "dataset"), "training_chat_template": chat_template,
        "output_dir": str(student_dir(cfg, out)), "use_cpu": True, "bf16": bf16, "seed": t.seed,
        "max_steps": t.steps, "per_device_train_batch_size": t.batch_size, "gradient_accumulation_steps": 1,
        "learning_rate": t.learning_rate, "lr_scheduler_type": t.lr_scheduler_type, "warmup_steps": t.warmup_steps,
        "max_length": t.max_length, "assistant_only_loss": True, "packing": False,
        "logging_steps": max(1, min(5, t.steps // 6)), "gradient_checkpointing": False,
        "eval_strategy": "steps" if t.save_steps else "no", "save_strategy": "steps" if t.save_steps else "no",
        "report_to": "none", "dataloader_num_workers": 0, "disable_tqdm": False,
    })
    if t.save_steps:
        settings.update(save_steps=t.save_steps, eval_steps=t.save_steps)
    # last: the newest complete checkpoint of an interrupted run, or step 0 (train.sft.resume_point),
    # so this file both starts the run and resumes it.
    settings["resume_from_checkpoint"] = t.resume_from_checkpoint or "last"
    settings.update(t.sft)  # train/sft.py keys of the config's own, as they are
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
    """Whether training finished saving the student: its trainer_state.json, written after the
    weights, is whole (train.sft.complete_checkpoint's mark, for the final save too)."""
    from train.sft import complete_checkpoint

    weights = (path / "adapter_config.json").is_file() or (path / "model.safetensors").is_file()
    return weights and complete_checkpoint(path)


def loss_log(student: Path) -> list[dict[str, float]]:
    """The logged training and validation losses, from the trainer_state.json saved with the student."""
    state = json.loads((student / "trainer_state.json").read_text(encoding="utf-8"))
    return [{k: r[k] for k in ("step", "loss", "eval_loss") if k in r} for r in state["log_history"]
            if "loss" in r or "eval_loss" in r]


def training_seconds(student: Path) -> float | None:
    """How long the saved student's training took (the trainer's own train_runtime)."""
    state = json.loads((student / "trainer_state.json").read_text(encoding="utf-8"))
    return next((r["train_runtime"] for r in reversed(state["log_history"]) if "train_runtime" in r), None)


def train_student(cfg: DemoConfig, out: Path, console, init: Path | None = None
                  ) -> tuple[Path, list[dict[str, float]], bool]:
    """SFT in this process (from the base, or going on from the student `init`); returns the
    student dir, the logged losses, and whether this run trained (False: a student saved by the
    same train.yaml settings is reused)."""
    from kair_runtime.llm.hf import resolve_model
    from train.sft import last_checkpoint, run

    model = cfg.runtime.llm.model
    path = out / "train.yaml"
    settings = train_yaml(cfg, resolve_model(model), out, training_template(model, out), init)
    student = student_dir(cfg, out)
    old = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    # A train.yaml of before resume_from_checkpoint was written (always "last" now) is the same run.
    same = isinstance(old, dict) and ({"resume_from_checkpoint": "last"} | old) == settings
    if same and saved_student(student):
        console.print(f"reusing {student}: {path} has the same settings and the student was saved")
        return student, loss_log(student), False
    if not same and any(student.glob("checkpoint-*")):  # `last` would resume another training's
        raise ConfigError(f"{student} holds checkpoints of a training with other settings than these (see {path}); "
                          "delete that folder to train again, or use another --out")
    if old != settings:
        atomic_write_text(path, f"# python -m train.sft --config {path}\n" + yaml.safe_dump(settings, sort_keys=False))
    checkpoint = last_checkpoint(student) if same and settings["resume_from_checkpoint"] == "last" else None
    if checkpoint is not None:
        console.print(f"resuming the interrupted training from {checkpoint}")
    run(["--config", str(path)])  # resume_from_checkpoint last: from that checkpoint, else from step 0
    return student, loss_log(student), True


def tuned_llm(cfg: DemoConfig, student: Path) -> LLMConfig:
    if cfg.train.use_peft:
        return dataclasses.replace(cfg.runtime.llm, adapter=str(student))
    return dataclasses.replace(cfg.runtime.llm, model=str(student), adapter=None)
