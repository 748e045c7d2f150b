"""Summaries, tables and plots from trace records.

`summarize(traces)` turns one (model, dataset, method) run into the figures the paper reports,
and a few of ours: F1/EM (Table 1; every question in the denominator, failures score 0) and our
Acc (cover accuracy, which the paper does not report), the reached-step distribution (Table 6),
mean prompt/completion tokens per step (Table 7), wall time per question (Table 3), index size
per step (Fig 4c), our format validity, and retrieval recall of the gold paragraphs (Fig 4a)
when gold passage ids are known.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from operator import itemgetter
from statistics import mean
from typing import Any, Callable

from eval.metrics import aggregate, format_validity, score_trace
from eval.table import Column, Table
from kair_runtime.index import index_size
from kair_runtime.records import Trace


def _avg(xs) -> float:
    xs = list(xs)
    return mean(xs) if xs else 0.0


def summarize(traces: list[Trace], gold_ids: dict[str, set[str]] | None = None) -> dict[str, Any]:
    n = len(traces)
    scores = aggregate(score_trace(t) for t in traces)  # x100, failures scored 0
    failed = [t for t in traces if t.error is not None]
    steps = [len(t.steps) for t in traces]
    all_steps = [s for t in traces for s in t.steps]
    uses_index = any(t.index_format and t.index_format != "none" for t in traces)
    summary: dict[str, Any] = {
        "n": n,
        "failed": len(failed),
        "failure_reasons": dict(Counter(t.error.split(":")[0] for t in failed)),
        "em": scores["em"],
        "f1": scores["f1"],
        "acc": scores["acc"],
        "mean_steps": _avg(steps),
        "step_distribution": {str(k): v / n for k, v in sorted(Counter(steps).items())} if n else {},
        "stop_reasons": dict(Counter(t.stop_reason for t in traces)),
        "format_validity": format_validity(traces),  # failures before step 1 count as an invalid step
        "fallbacks": dict(Counter(f for s in all_steps for f in s.fallbacks)),
        "prompt_tokens_per_question": _avg(t.usage.prompt_tokens for t in traces),
        "completion_tokens_per_question": _avg(t.usage.completion_tokens for t in traces),
        "tokens_per_step": _tokens_per_step(traces),
        "wall_time_s_per_question": _avg(t.wall_time_s for t in traces),
        "index_size_per_step": _index_size_per_step(traces) if uses_index else {},
    }
    if gold_ids is not None:
        summary["recall"] = retrieval_recall(traces, gold_ids)
    return summary


def _tokens_per_step(traces: list[Trace]) -> dict[str, dict[str, float]]:
    by_step: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for t in traces:
        for s in t.steps:
            if s.prompt or s.raw_output:  # steps with an LLM call (vanilla's retrieval step has none)
                by_step[f"step {s.step}"].append((s.prompt_tokens, s.completion_tokens))
        if t.final_prompt:
            by_step["final"].append((t.final_prompt_tokens, t.final_completion_tokens))
    return {k: {"prompt": _avg(p for p, _ in v), "completion": _avg(c for _, c in v), "n": len(v)}
            for k, v in by_step.items()}


def _index_size_per_step(traces: list[Trace]) -> dict[str, dict[str, float]]:
    by_step: dict[int, list[dict[str, int]]] = defaultdict(list)
    for t in traces:
        for s in t.steps:
            by_step[s.step].append(index_size(s.index))
    return {str(k): {key: _avg(d[key] for d in v) for key in ("keywords", "relations", "facts")}
            for k, v in sorted(by_step.items())}


def retrieval_recall(traces: list[Trace], gold_ids: dict[str, set[str]]) -> dict[str, Any]:
    """Recall of gold supporting passages: of the first query's top-k, and cumulatively after each
    step (a question that stopped earlier keeps its final recall in later steps). Questions with
    no known gold passages are left out of the mean and counted."""
    have = [t for t in traces if gold_ids.get(t.question.id)]
    max_steps = max((len(t.steps) for t in have), default=0)
    cumulative = defaultdict(list)
    first = []
    for t in have:
        gold = gold_ids[t.question.id]
        seen: set[str] = set()
        for i in range(max_steps):
            if i < len(t.steps):
                seen |= {p.id for p in t.steps[i].retrieved}
            r = len(gold & seen) / len(gold)
            cumulative[str(i + 1)].append(r)
            if i == 0:
                first.append(r)
    return {"questions_with_gold": len(have), "questions_without_gold": len(traces) - len(have),
            "first_query": 100 * _avg(first),
            "cumulative_by_step": {k: 100 * _avg(v) for k, v in cumulative.items()}}


# ---------------------------------------------------------------- tables

# Every run row starts with these: {"model": ..., "method": ..., "dataset": ..., "summary": {...}}.
RUN_COLUMNS = [Column("model", itemgetter("model")), Column("method", itemgetter("method")),
               Column("dataset", itemgetter("dataset"))]


def summary_cell(key: str, spec: str = "") -> Callable[[dict[str, Any]], str]:
    """The formatter of a run row's summary figure `key`, with format spec `spec`."""
    return lambda r: format(r["summary"][key], spec)


def validity_cell(r: dict[str, Any]) -> str:
    fv = r["summary"]["format_validity"]
    return "-" if fv is None else f"{fv:.1f}"  # None: no step to judge


def _tokens_cell(r: dict[str, Any]) -> str:
    return f"{r['summary']['prompt_tokens_per_question'] + r['summary']['completion_tokens_per_question']:.0f}"


# The headline: one row per run, F1/EM with one decimal, tokens/q = prompt + completion (the demo's table).
HEADLINE_COLUMNS = [Column("dataset", itemgetter("dataset")), Column("model", itemgetter("model")),
                    Column("method", itemgetter("method")), Column("n", summary_cell("n"), "right"),
                    Column("F1", summary_cell("f1", ".1f"), "right"), Column("EM", summary_cell("em", ".1f"), "right"),
                    Column("format valid %", validity_cell, "right"),
                    Column("mean steps", summary_cell("mean_steps", ".2f"), "right"),
                    Column("tokens/q", _tokens_cell, "right")]


def results_table(rows: list[dict[str, Any]], datasets: list[str]) -> str:
    """Markdown laid out like the paper's Table 1: F1 and EM per dataset, then their average
    (only over a complete row). One table row per (model, method)."""
    by_key: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by_key[(r["model"], r["method"])][r["dataset"]] = r["summary"]

    def figure(d: str, key: str) -> Column:
        return Column(f"{d} {key.upper()}", lambda p: "-" if d not in p[2] else f"{p[2][d][key]:.2f}", "right")

    def average(key: str) -> Column:
        return Column(f"Avg {key.upper()}", lambda p: f"{_avg(p[2][d][key] for d in datasets):.2f}"
                      if all(d in p[2] for d in datasets) else "-", "right")

    columns = [Column("model", itemgetter(0)), Column("method", itemgetter(1)),
               *(c for d in datasets for c in (figure(d, "f1"), figure(d, "em"))), average("f1"), average("em")]
    return Table(columns, [(model, method, per) for (model, method), per in by_key.items()]).markdown()


def stats_table(rows: list[dict[str, Any]]) -> str:
    """One line per run: failures, format validity, steps, tokens, time."""
    return Table(RUN_COLUMNS + [
        Column("n", summary_cell("n"), "right"), Column("failed", summary_cell("failed"), "right"),
        Column("format valid %", validity_cell, "right"),
        Column("mean steps", summary_cell("mean_steps", ".2f"), "right"),
        Column("prompt tok/q", summary_cell("prompt_tokens_per_question", ".0f"), "right"),
        Column("completion tok/q", summary_cell("completion_tokens_per_question", ".0f"), "right"),
        Column("s/q", summary_cell("wall_time_s_per_question", ".2f"), "right")], rows).markdown()


def step_distribution_table(rows: list[dict[str, Any]]) -> str:
    """Table 6: share of questions stopping at each step."""
    steps = sorted({k for r in rows for k in r["summary"]["step_distribution"]}, key=int)

    def share(k: str) -> Column:
        return Column(f"step {k}", lambda r: f"{100 * r['summary']['step_distribution'].get(k, 0):.1f}%", "right")

    return Table(RUN_COLUMNS + [share(k) for k in steps], rows).markdown()


def recall_table(rows: list[dict[str, Any]]) -> str:
    """Fig 4a as figures: recall of the gold paragraphs by the first query and after each step."""
    def first(r: dict[str, Any]) -> str:
        return f"{r['summary']['recall']['first_query']:.1f}"

    def by_step(r: dict[str, Any]) -> str:
        return ", ".join(f"{k}: {v:.1f}" for k, v in r["summary"]["recall"]["cumulative_by_step"].items())

    return Table(RUN_COLUMNS + [Column("first query", first, "right"), Column("by step", by_step)], rows).markdown()


def markdown_report(rows: list[dict[str, Any]], datasets: list[str]) -> str:
    failed = sum(r["summary"]["failed"] for r in rows)
    parts = ["# Results", "", f"F1 / EM (x100; every question in the denominator, failures score 0: {failed} failed "
             "over all runs, see `failed` below)", "",
             results_table(rows, datasets), "", "## Run statistics", "", stats_table(rows), "",
             "## Reached retrieval step (Table 6)", "", step_distribution_table(rows), ""]
    recall_rows = [r for r in rows if "recall" in r["summary"]]
    if recall_rows:
        parts += ["## Recall of gold paragraphs (%)", "", recall_table(recall_rows), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------- plots

def write_plots(rows: list[dict[str, Any]], datasets: list[str], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(name: str, fig) -> Path:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=120)
        plt.close(fig)  # pyplot keeps every open figure alive otherwise
        return out_dir / name

    labels = list(dict.fromkeys(f"{r['model']} / {r['method']}" for r in rows))
    f1 = {(f"{r['model']} / {r['method']}", r["dataset"]): r["summary"]["f1"] for r in rows}

    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(datasets) * max(1, len(labels)) / 2), 4))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        xs = [j + i * width for j in range(len(datasets))]
        ax.bar(xs, [f1.get((label, d), 0.0) for d in datasets], width, label=label)
    ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(datasets))], datasets)
    ax.set_ylabel("F1")
    ax.set_title("F1 per dataset and method")
    ax.legend(fontsize=8)
    paths.append(save("f1.png", fig))

    fig, ax = plt.subplots(figsize=(8, 4))
    names = [f"{r['method']}\n{r['dataset']}" for r in rows]
    steps = sorted({k for r in rows for k in r["summary"]["step_distribution"]}, key=int)
    bottom = [0.0] * len(rows)
    for k in steps:
        vals = [100 * r["summary"]["step_distribution"].get(k, 0) for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=f"step {k}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)), names, fontsize=7)
    ax.set_ylabel("% of questions")
    ax.set_title("Reached retrieval step")
    ax.legend(fontsize=8)
    paths.append(save("steps.png", fig))

    sized = [r for r in rows if r["summary"]["index_size_per_step"]]
    if sized:
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in sized:
            per = r["summary"]["index_size_per_step"]
            xs = [int(k) for k in per]
            ax.plot(xs, [per[k]["keywords"] for k in per], marker="o", label=f"{r['method']} {r['dataset']} keywords")
            ax.plot(xs, [per[k]["relations"] for k in per], marker="s", linestyle="--",
                    label=f"{r['method']} {r['dataset']} relations")
        ax.set_xlabel("step")
        ax.set_ylabel("mean count")
        ax.set_title("Index size per step")
        ax.legend(fontsize=7)
        paths.append(save("index_size.png", fig))
    return paths
