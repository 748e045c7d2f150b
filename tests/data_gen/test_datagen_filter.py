"""`filter`: correctness, format validity, completion budget, best-k, and the report."""

from __future__ import annotations

import copy
import json

import pytest

from data_gen.filter import FilterConfig, run_filter
from data_gen.store import read_trajectories, trajectory_key
from data_gen.teacher import GenerateConfig, SamplingGrid, generate
from kair_runtime.config import LLMConfig, LoopConfig, RuntimeConfig


@pytest.fixture
def defective_run(tmp_path, specs, questions, bm25, oracle):
    """30 trajectories: q0 answers wrong, q1 breaks the format, q2 overruns the step budget."""
    wrong, broken, verbose = {questions[0].id}, {questions[1].id}, {questions[2].id}
    cfg = GenerateConfig(runtime=RuntimeConfig(llm=LLMConfig(backend="scripted"),
                                               loop=LoopConfig(max_steps=3, top_k=3, step_max_tokens=60)),
                         datasets=specs, sampling=SamplingGrid([0.0, 1.0], samples_per_temperature=2),
                         out_dir=str(tmp_path / "teacher"))
    generate(cfg, llm=oracle(wrong=wrong, broken=broken, verbose=verbose), retriever=bm25, progress=False)
    return tmp_path / "teacher", wrong | broken | verbose


def test_filter_keeps_correct_well_formed_trajectories_and_reports_why(tmp_path, defective_run, questions):
    traj_dir, bad = defective_run
    report = run_filter(FilterConfig(trajectories=str(traj_dir), out_dir=str(tmp_path / "f")))
    kept = read_trajectories(tmp_path / "f")
    assert (report["total"], report["kept"], len(kept)) == (30, 21, 21)
    assert {t.question.id for t in kept} == {q.id for q in questions} - bad
    assert all(t.answer == t.question.answers[0] and all(s.parsed_ok for s in t.steps) for t in kept)
    r = report["reasons"]
    assert r["low_f1"] == 3  # the wrong answers
    assert r["format:judgment_missing"] == r["format:query_missing"] == 3  # the broken outputs
    assert r["step_over_budget"] == 3  # 60 completion tokens of a 60-token budget: cut off
    assert sum(report["f1_histogram"].values()) == 30 and report["f1_histogram"]["0.9-1.0"] >= 27
    assert report["steps_kept"] == {"2": 21} and sum(report["steps_all"].values()) == 30
    step1 = report["index_size_per_step"]["1"]
    assert step1["n"] == 21 and step1["keywords"] == round(sum(len(t.steps[0].index.keywords) for t in kept) / 21, 2)
    assert report["index_size_per_step"]["2"]["relations"] >= step1["relations"] > 0  # the index grows
    assert report["by_dataset"]["hotpotqa"]["total"] == 15
    md = (tmp_path / "f" / "report.md").read_text()
    assert "Kept **21 / 30**" in md and "| low_f1 | 3 |" in md
    assert json.loads((tmp_path / "f" / "report.json").read_text())["kept"] == 21


def test_a_larger_budget_and_lower_min_f1_keep_more(tmp_path, defective_run):
    traj_dir, _ = defective_run
    report = run_filter(FilterConfig(trajectories=str(traj_dir), out_dir=str(tmp_path / "f"), min_f1=0.0,
                                     max_step_tokens=1000))
    assert report["kept"] == 27 and "low_f1" not in report["reasons"] and "step_over_budget" not in report["reasons"]


def test_best_k_prefers_fewer_steps_among_equally_correct(tmp_path, defective_run, questions):
    traj_dir, bad = defective_run
    traces = read_trajectories(traj_dir)
    q = next(q for q in questions if q.id not in bad)
    # Sample 0 of this question takes a detour: one more step (the same step repeated).
    for t in traces:
        if t.question.id == q.id and t.extra["sample_id"] == 0:
            extra = copy.deepcopy(t.steps[0])
            extra.step = 3
            t.steps.append(extra)
    report = run_filter(FilterConfig(out_dir=str(tmp_path / "f"), best_k=1), traces=traces)
    kept = read_trajectories(tmp_path / "f")
    assert report["kept"] == len(kept) == 7 and report["reasons"]["best_k"] == 14
    ids = {t.question.id: t for t in kept}
    assert len(ids) == 7
    assert ids[q.id].extra["sample_id"] == 1  # fewer steps wins
    assert all(t.extra["sample_id"] == 0 for qid, t in ids.items() if qid != q.id)  # ties: lower sample id


def test_silver_marked_incomplete_is_dropped(tmp_path, defective_run):
    traj_dir, _ = defective_run
    traces = read_trajectories(traj_dir)
    traces[5].extra["complete"] = False
    report = run_filter(FilterConfig(out_dir=str(tmp_path / "f"), min_f1=0.0, max_step_tokens=1000), traces=traces)
    assert report["reasons"]["incomplete_evidence"] == 1
    assert trajectory_key(traces[5]) not in {trajectory_key(t) for t in read_trajectories(tmp_path / "f")}


def test_merged_with_silver_one_trajectory_per_question_and_path_through_the_cli(tmp_path, defective_run):
    """`kair datagen filter TEACHER --merge-with SILVER --dedupe-paths`: the oracle's greedy and
    sampled trajectories read the same passages, so each question keeps the first given (the
    "silver" copy here), and the repeats are counted as same_path."""
    from typer.testing import CliRunner

    from data_gen.cli import datagen_app
    from data_gen.filter import retrieval_path

    traj_dir, _ = defective_run
    res = CliRunner().invoke(datagen_app, ["filter", str(traj_dir), "--merge-with", str(traj_dir), "--dedupe-paths",
                                           "--out", str(tmp_path / "f")])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "f" / "report.json").read_text())
    kept = read_trajectories(tmp_path / "f")
    keys = [(t.question.id, retrieval_path(t)) for t in kept]
    assert report["total"] == 60 and len(keys) == len(set(keys)) == report["kept"] < 21
    assert report["reasons"]["same_path"] == 42 - report["kept"]  # 21 valid twice, less the ones kept
    assert report["settings"]["merge_with"] == [str(traj_dir)] and report["settings"]["dedupe_paths"] is True
