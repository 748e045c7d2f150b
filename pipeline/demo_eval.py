"""The demo's evaluation: each configured EVAL_RUNS entry on each dev set through eval.run's
evaluate_one (the per-combination evaluation `kair eval` runs), traces in OUT/traces/<set>/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.demo_config import EVAL_RUNS, DemoConfig
from pipeline.demo_report import ALL, row
from pipeline.demo_sets import QuestionSet
from pipeline.demo_train import tuned_llm

MIN_CHUNK = 16  # questions appended to a traces file at a time (resume granularity), at least


def evaluate(cfg: DemoConfig, dev: list[QuestionSet], retrievers: dict[str, Any], student: Path, out: Path,
             progress, tuned_label: str | None = None) -> list[dict[str, Any]]:
    """Every cfg.eval_runs entry on every dev set (traces in OUT/traces/<set>/), one summary row per
    (run, set), then, with several sets, one per run over all their questions pooled. tuned_label
    names the tuned student's rows (default EVAL_RUNS' "tuned"; a round's student: "round 2")."""
    from eval.methods import MethodSettings, build_method
    from eval.report import summarize
    from eval.run import evaluate_one
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
            label = tuned_label if tuned and tuned_label else label
            task = progress.add_task(f"eval {name}" + (f" ({label})" if tuned and tuned_label else ""),
                                     total=sum(len(d.questions) for d in dev))
            all_traces, all_gold = [], {}
            for qs in dev:
                traces, summary = evaluate_one(
                    lambda qs=qs, method=method, tuned=tuned: build_method(method, llm_for(tuned),
                                                                           retrievers[qs.label], settings),
                    qs.questions, qs.gold, out / "traces" / qs.label / f"{name}.jsonl",
                    lambda n, task=task: progress.advance(task, n),
                    max(MIN_CHUNK, cfg.runtime.llm.batch_size))  # whole batches: the loop batches what it is given
                rows.append(row(cfg, label, method, qs.label, summary))
                all_traces += traces
                all_gold.update(qs.gold)
            pooled.append(row(cfg, label, method, ALL, summarize(all_traces, all_gold)))
    return rows + pooled if len(dev) > 1 else rows
