"""`kair datagen filter`: keep the trajectories a student should learn from.

A trajectory is kept when its answer is right (token F1 >= min_f1 against every gold string,
max taken; EM reported alongside) and its format is valid: it has steps, no error, every step
parsed without a format repair (Step.parsed_ok: index, judgment, and a query when insufficient
all came from the model), and no step used up its completion budget (completion_tokens >=
budget means generation was cut off). Silver trajectories whose evidence was never retrieved
(extra.complete = false) are dropped too. `dedupe_paths` keeps one trajectory per question and
retrieval path (the passage ids each step retrieved): two that read the same passages teach the
same search, so the first one given is kept (silver before teacher, in the order they come).
`best_k` then keeps at most k per question: highest F1 first, then fewer steps, then the lower
sample id.

Writes OUT/kept.jsonl (the kept Trace records) and OUT/report.json + OUT/report.md: kept/total,
rejection reasons with counts (a trajectory counts under every reason it has), the F1
histogram, the distribution of steps, and the mean index size per step of the kept ones.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from data_gen.store import read_trajectories
from eval.metrics import score
from eval.table import Column, Table, counts_table
from kair_runtime.config import AT_LEAST_1, ConfigError, Range, check_ranges
from kair_runtime.index import index_size
from kair_runtime.jsonl import atomic_write_jsonl, atomic_write_text
from kair_runtime.rundir import replaced_folder
from kair_runtime.records import FORMAT_FALLBACKS, Trace

F1_BINS = 10


@dataclass
class FilterConfig:
    trajectories: str | None = None  # a trajectory folder or jsonl file (the CLI argument wins)
    # Trajectory paths read before `trajectories`, in order: silver beside a student's samples in a
    # round of expert iteration (with dedupe_paths, a path silver already has adds nothing).
    merge_with: list[str] = field(default_factory=list)
    out_dir: str = "runs/datagen/filtered"
    min_f1: float = 1.0
    best_k: int | None = None  # at most k trajectories per question
    dedupe_paths: bool = False  # one trajectory per question and retrieval path (see the docstring)
    # A step whose completion_tokens reach this was cut off. None: each trajectory's own
    # recorded budget (extra.sampling.step_max_tokens); a trajectory without one is not checked.
    max_step_tokens: int | None = None
    require_sufficient: bool = False  # also drop trajectories that ran out of steps

    def validate(self, where: str = "") -> None:
        # min_f1 outside [0, 1] (or NaN, which no F1 is >=) would keep all or nothing without a word.
        check_ranges(self, {"min_f1": Range(low=0, high=1), "best_k": AT_LEAST_1, "max_step_tokens": AT_LEAST_1},
                     where)


@dataclass
class Verdict:
    trace: Trace
    f1: float
    em: float
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons


def step_budget(trace: Trace, cfg: FilterConfig) -> int | None:
    if cfg.max_step_tokens is not None:
        return cfg.max_step_tokens
    sampling = trace.extra.get("sampling") or {}
    return sampling.get("step_max_tokens")


def judge(trace: Trace, cfg: FilterConfig) -> Verdict:
    """Score one trajectory and list every reason to reject it (none: keep)."""
    s = score(trace.answer, trace.question.answers, ["f1", "em"]) if trace.question.answers else {"f1": 0.0, "em": 0.0}
    v = Verdict(trace, s["f1"], s["em"])
    if not trace.question.answers:
        v.reasons.append("no_gold_answer")
    if trace.error is not None:
        v.reasons.append("error")
    if not trace.steps:
        v.reasons.append("no_steps")
    if not trace.answer.strip():
        v.reasons.append("empty_answer")
    if v.f1 < cfg.min_f1:
        v.reasons.append("low_f1")
    if trace.extra.get("complete") is False:
        v.reasons.append("incomplete_evidence")
    if cfg.require_sufficient and trace.stop_reason != "sufficient":
        v.reasons.append("not_sufficient")
    # Each format repair once per trajectory, however many steps needed it.
    repairs = sorted({f.split(":")[0] for st in trace.steps for f in st.fallbacks
                      if f in FORMAT_FALLBACKS or f.startswith("parser_error")})
    v.reasons += [f"format:{r}" for r in repairs]
    budget = step_budget(trace, cfg)
    if budget is not None and any(st.completion_tokens >= budget for st in trace.steps):
        v.reasons.append("step_over_budget")
    return v


def retrieval_path(trace: Trace) -> tuple:
    """The passages each step retrieved, in order: what a trajectory searched and read."""
    return tuple(tuple(p.id for p in st.retrieved) for st in trace.steps)


def dedupe_paths(verdicts: list[Verdict]) -> tuple[list[Verdict], list[Verdict]]:
    """(kept, repeats): the first trajectory of each (question, retrieval path), in the given order."""
    seen: set[tuple] = set()
    kept, repeats = [], []
    for v in verdicts:
        key = (v.trace.question.id, retrieval_path(v.trace))
        (repeats if key in seen else kept).append(v)
        seen.add(key)
    return kept, repeats


def best_k(verdicts: list[Verdict], k: int) -> tuple[list[Verdict], list[Verdict]]:
    """(kept, dropped) among the valid ones: at most k per question, best first."""
    by_q: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        by_q[v.trace.question.id].append(v)
    keep_ids: set[int] = set()
    for group in by_q.values():
        group.sort(key=lambda v: (-v.f1, -v.em, len(v.trace.steps), int(v.trace.extra.get("sample_id", 0))))
        keep_ids.update(id(v) for v in group[:k])
    return [v for v in verdicts if id(v) in keep_ids], [v for v in verdicts if id(v) not in keep_ids]


def run_filter(cfg: FilterConfig, traces: list[Trace] | None = None) -> dict[str, Any]:
    """Filter, write kept.jsonl and the report; return the report dict."""
    if traces is None:
        if not cfg.trajectories:
            raise ConfigError("no trajectories to filter: pass TRAJ_DIR or set `trajectories`")
        traces = [t for path in (*cfg.merge_with, cfg.trajectories) for t in read_trajectories(path)]
    cfg.validate()  # also a config built in code (the demo's), which from_dict did not check
    verdicts = [judge(t, cfg) for t in traces]
    kept = [v for v in verdicts if v.ok]
    if cfg.dedupe_paths:
        kept, repeats = dedupe_paths(kept)
        for v in repeats:
            v.reasons.append("same_path")
    if cfg.best_k is not None:
        kept, surplus = best_k(kept, cfg.best_k)
        for v in surplus:
            v.reasons.append("best_k")
    report = build_report(verdicts, kept, cfg)
    # kept.jsonl and its report agree after a kill at any point: the folder is replaced whole.
    with replaced_folder(cfg.out_dir, "report.json") as out:
        atomic_write_jsonl(out / "kept.jsonl", (v.trace.to_dict() for v in kept))
        atomic_write_text(out / "report.json", json.dumps(report, indent=2, ensure_ascii=False))
        atomic_write_text(out / "report.md", report_markdown(report))
    return report


# ---------------------------------------------------------------- the report


def f1_histogram(values: list[float]) -> dict[str, int]:
    """Ten bins of width 0.1; the last, [0.9, 1.0], includes 1.0."""
    counts = [0] * F1_BINS
    for f in values:
        counts[min(int(f * F1_BINS), F1_BINS - 1)] += 1
    return {f"{i / F1_BINS:.1f}-{(i + 1) / F1_BINS:.1f}": c for i, c in enumerate(counts)}


def index_size_per_step(traces: list[Trace]) -> dict[str, dict[str, float]]:
    """Mean index size after step t, over the trajectories that reached step t."""
    sums: dict[int, Counter] = defaultdict(Counter)
    n: Counter = Counter()
    for t in traces:
        for st in t.steps:
            sums[st.step].update(index_size(st.index))
            n[st.step] += 1
    return {str(step): {k: round(v / n[step], 2) for k, v in sorted(sums[step].items())} | {"n": n[step]}
            for step in sorted(sums)}


def build_report(verdicts: list[Verdict], kept: list[Verdict], cfg: FilterConfig) -> dict[str, Any]:
    reasons: Counter = Counter(r for v in verdicts for r in v.reasons)
    kept_ids = {id(v) for v in kept}
    by_dataset: dict[str, Counter] = defaultdict(Counter)
    for v in verdicts:
        by_dataset[v.trace.question.dataset or "?"]["total"] += 1
        by_dataset[v.trace.question.dataset or "?"]["kept"] += int(id(v) in kept_ids)
    kept_traces = [v.trace for v in kept]
    return {
        "settings": asdict(cfg),
        "total": len(verdicts),
        "kept": len(kept),
        "questions": len({v.trace.question.id for v in verdicts}),
        "questions_kept": len({v.trace.question.id for v in kept}),
        "reasons": dict(reasons.most_common()),
        "by_dataset": {d: dict(c) for d, c in sorted(by_dataset.items())},
        "sources": dict(Counter(str(v.trace.extra.get("teacher", "?")) for v in kept)),
        "f1_histogram": f1_histogram([v.f1 for v in verdicts]),
        "mean_f1": round(sum(v.f1 for v in verdicts) / len(verdicts), 4) if verdicts else 0.0,
        "mean_em": round(sum(v.em for v in verdicts) / len(verdicts), 4) if verdicts else 0.0,
        "steps_all": _steps(v.trace for v in verdicts),
        "steps_kept": _steps(kept_traces),
        "index_size_per_step": index_size_per_step(kept_traces),
    }


def _steps(traces) -> dict[str, int]:
    c = Counter(len(t.steps) for t in traces)
    return {str(k): c[k] for k in sorted(c)}


def report_markdown(r: dict[str, Any]) -> str:
    pct = 100 * r["kept"] / r["total"] if r["total"] else 0.0
    s = r["settings"]

    def size(key: str) -> Column:
        return Column(key.replace("_", " "), lambda sm: str(sm[1].get(key, 0)), "right")

    by_dataset = Table([Column("dataset", itemgetter(0)),
                        Column("kept", lambda dc: str(dc[1].get("kept", 0)), "right"),
                        Column("total", lambda dc: str(dc[1].get("total", 0)), "right")], list(r["by_dataset"].items()))
    steps = Table([Column("steps", str), Column("all", lambda k: str(r["steps_all"].get(k, 0)), "right"),
                   Column("kept", lambda k: str(r["steps_kept"].get(k, 0)), "right")],
                  sorted(set(r["steps_all"]) | set(r["steps_kept"]), key=int))
    sizes = Table([Column("step", itemgetter(0)), Column("n", lambda sm: str(sm[1]["n"]), "right"),
                   *map(size, ("keywords", "relations", "facts", "summary_words"))],
                  list(r["index_size_per_step"].items()))
    return "\n".join([
        "# Trajectory filter report", "",
        f"Kept **{r['kept']} / {r['total']}** trajectories ({pct:.1f}%), covering {r['questions_kept']} / "
        f"{r['questions']} questions.", "",
        f"Settings: min_f1 = {s['min_f1']}, best_k = {s['best_k']}, max_step_tokens = "
        f"{s['max_step_tokens'] if s['max_step_tokens'] is not None else 'recorded budget'}, "
        f"require_sufficient = {s['require_sufficient']}. Mean F1 {r['mean_f1']:.3f}, EM {r['mean_em']:.3f}.", "",
        "## Rejection reasons", "", counts_table("reason", r["reasons"].items() or [("(none)", 0)]).markdown(), "",
        "## By dataset", "", by_dataset.markdown(), "",
        "## F1 histogram (all trajectories)", "", counts_table("F1", r["f1_histogram"].items()).markdown(), "",
        "## Steps", "", steps.markdown(), "",
        "## Index size per step (kept, means)", "", sizes.markdown()]) + "\n"


def print_report(r: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    console.print(f"kept [bold]{r['kept']}[/] / {r['total']} trajectories "
                  f"({r['questions_kept']} / {r['questions']} questions)")
    console.print(counts_table("reason", r["reasons"].items()).rich(title="rejection reasons"))
    # The histogram and the step counts side by side, the shorter padded with blanks.
    bins = list(r["f1_histogram"].items())
    steps = sorted(set(r["steps_all"]) | set(r["steps_kept"]), key=int)
    n = max(len(bins), len(steps))
    rows = list(zip(bins + [("", "")] * (n - len(bins)), steps + [""] * (n - len(steps))))
    console.print(Table([Column("F1", lambda bs: bs[0][0]), Column("n", lambda bs: str(bs[0][1]), "right"),
                         Column("steps", itemgetter(1)),
                         Column("all", lambda bs: str(r["steps_all"].get(bs[1], "")) if bs[1] else "", "right"),
                         Column("kept", lambda bs: str(r["steps_kept"].get(bs[1], "")) if bs[1] else "", "right")],
                        rows).rich(title="F1 histogram / steps"))
