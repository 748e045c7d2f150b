"""The demo's report: one summary row per (run, dev set) plus the pooled `all` rows, as a markdown
table (eval/report.py's headline columns), a terminal table, OUT/results.md, and the note that
says when a run is too small to measure anything."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.demo_config import DemoConfig

ALL = "all"  # the label of the rows pooling every dev set's questions


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


def loss_line(log: list[dict[str, float]], key: str) -> str:
    """`1.406 (5) -> ... -> 0.345 (90)`: at most 8 points, first and last included."""
    points = [(int(r["step"]), r[key]) for r in log if key in r]
    if not points:
        return "not logged"
    if len(points) > 8:
        stride = (len(points) - 1) / 7
        points = [points[round(i * stride)] for i in range(8)]
    return " -> ".join(f"{v:.3f} ({step})" for step, v in points)


def per_dataset(counts: dict[str, dict[str, int]], key: str) -> str:
    """`hotpotqa 587/599, musique 246/400`: counts[dataset][key] of counts[dataset]['total']."""
    return ", ".join(f"{name} {c[key]}/{c['total']}" for name, c in counts.items()) or "none"


def rounds_section(cfg: DemoConfig, rounds: list[dict[str, Any]]) -> list[str]:
    """One line per round of expert iteration: its teacher, what it generated and kept, the training."""
    rc = cfg.rounds
    lines = ["## Rounds of expert iteration", "",
             f"Each round's teacher is the previous round's student (round 1's: the silver student), "
             f"1 greedy + {rc.samples} sampled (temperature {rc.temperature}) trajectories per question, the same "
             f"answer-F1 filter, one trajectory per question and retrieval path with silver; each student "
             f"trained {'from the base' if rc.init == 'base' else 'on from the previous one'} for "
             f"{rc.steps or cfg.train.steps} steps. Its dev rows are `(round r)` above.", ""]
    for r in rounds:
        d = r["data"]
        lines.append(f"- round {r['round']} ({r['backend']}, {r['questions']} questions): teacher trajectories kept "
                     f"{per_dataset(d['teacher_kept'], 'kept')}; rejections {d['reasons'] or 'none'}; "
                     f"SFT examples {d['examples']}; training loss {loss_line(r['train_log'], 'loss')}; "
                     f"validation loss {loss_line(r['train_log'], 'eval_loss')}"
                     + (f"; relabelled by gold chains: {d['relabelled']['examples']} examples" if "relabelled" in d else ""))
    return lines + [""]


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
        f"- per dataset: silver chains complete {per_dataset(d['silver'], 'complete')}; "
        f"trajectories kept {per_dataset(d['kept_by_dataset'], 'kept')}",
        f"- SFT examples: {d['examples']} (`sft/README.md`)",
        f"- {kind}: {t.steps} steps, batch {t.batch_size}, learning rate {t.learning_rate} ({t.lr_scheduler_type}), "
        f"{t.precision}",
        f"- training loss by step: {loss_line(info['train_log'], 'loss')}",
        f"- validation loss by step: {loss_line(info['train_log'], 'eval_loss')}", "",
        *(rounds_section(cfg, info["rounds"]) if info.get("rounds") else []),
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

