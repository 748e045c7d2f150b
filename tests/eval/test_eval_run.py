"""`kair eval` end to end: run folder, tables, plots, resume, compare (scripted LLM, BM25)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eval.datasets import shared_data_dir
from eval.cli import eval_app
from eval.run import DatasetSpec, EvalConfig, run_eval
from kair_runtime.config import ConfigError, LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig, save_config
from kair_runtime.jsonl import recover

pytestmark = pytest.mark.skipif(not (shared_data_dir() / "musique").exists(),
                                reason=f"benchmark samples not found at {shared_data_dir()}")

METHODS = ["kair", "vanilla", "iter-retgen", "ircot", "qa-docs", "qa-index", "no-index", "no-evolving"]


def config(**kw) -> EvalConfig:
    runtime = RuntimeConfig(llm=LLMConfig(backend="scripted"), retriever=RetrieverConfig(kind="bm25"),
                            loop=LoopConfig(max_steps=3, top_k=3))
    base = dict(runtime=runtime, limit=4, methods=METHODS,
                datasets=[DatasetSpec("musique"), DatasetSpec("bamboogle", split="test", corpus_from=["hotpotqa:dev"])])
    base.update(kw)
    return EvalConfig(**base)


def test_every_method_writes_the_run_folder(tmp_path):
    rows = run_eval(config(), tmp_path / "run", progress=False)
    run = tmp_path / "run"
    assert len(rows) == 2 * len(METHODS)
    for r in rows:
        s = r["summary"]
        assert s["n"] == 4 and s["failed"] == 0
        assert 0 <= s["f1"] <= 100 and s["step_distribution"]
        traces = recover(run / r["model"] / r["dataset"] / r["method"] / "traces.jsonl")
        assert len(traces) == 4
    musique_kair = next(r for r in rows if r["dataset"] == "musique" and r["method"] == "kair")["summary"]
    assert musique_kair["format_validity"] == 100.0  # the scripted model always follows the format
    assert musique_kair["recall"]["questions_with_gold"] == 4
    assert set(musique_kair["tokens_per_step"]) >= {"step 1", "final"}
    assert (run / "config.yaml").exists() and json.loads((run / "summary.json").read_text())
    md = (run / "results.md").read_text()
    assert "| musique F1 | musique EM |" in md and "Reached retrieval step" in md and "Recall of gold" in md
    for plot in ("f1.png", "steps.png", "index_size.png"):
        assert (run / "plots" / plot).stat().st_size > 1000


def test_a_killed_run_resumes_without_redoing_or_losing_questions(tmp_path):
    run = tmp_path / "run"
    cfg = config(methods=["kair"], datasets=[DatasetSpec("musique")], limit=6, chunk_size=2)
    run_eval(cfg, run, progress=False)
    path = next(run.rglob("traces.jsonl"))
    lines = path.read_text().splitlines(keepends=True)
    # As if killed mid-write: two complete records and half of the third.
    path.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])
    kept = "".join(lines[:2])
    rows = run_eval(cfg, run, progress=False)
    text = path.read_text()
    assert text.startswith(kept)  # finished questions were not redone
    ids = [r["question"]["id"] for r in recover(path)]
    assert len(ids) == 6 and len(set(ids)) == 6
    assert rows[0]["summary"]["n"] == 6


def test_a_run_folder_refuses_a_different_config(tmp_path):
    run_eval(config(methods=["vanilla"], datasets=[DatasetSpec("musique")], limit=2), tmp_path / "r", progress=False)
    with pytest.raises(ConfigError, match="different config"):
        run_eval(config(methods=["vanilla"], datasets=[DatasetSpec("musique")], limit=3), tmp_path / "r", progress=False)


def test_a_moved_run_folder_resumes(tmp_path):
    """The folder's place (out_dir, run_name) is not part of its config: a renamed run resumes."""
    cfg = config(methods=["vanilla"], datasets=[DatasetSpec("musique")], limit=2)
    cfg.out_dir, cfg.run_name = str(tmp_path), "r"
    run_eval(cfg, tmp_path / "r", progress=False)
    (tmp_path / "r").rename(tmp_path / "moved")
    cfg.out_dir, cfg.run_name = str(tmp_path / "elsewhere"), "moved"
    assert run_eval(cfg, tmp_path / "moved", progress=False)[0]["summary"]["n"] == 2


def test_a_run_folder_claimed_before_datasets_had_a_limit_resumes(tmp_path):
    """RUN/config.yaml written when a dataset entry had no `limit`: it holds its default (None)
    now, so the folder is still this config's; a limit set now is a difference."""
    import yaml

    cfg = config(methods=["vanilla"], datasets=[DatasetSpec("musique")], limit=2)
    run_eval(cfg, tmp_path / "r", progress=False)
    path = tmp_path / "r" / "config.yaml"
    old = yaml.safe_load(path.read_text())
    del old["datasets"][0]["limit"]
    path.write_text(yaml.safe_dump(old, sort_keys=False))
    assert run_eval(cfg, tmp_path / "r", progress=False)[0]["summary"]["n"] == 2
    with pytest.raises(ConfigError, match=r"differs in: datasets\)"):
        run_eval(config(methods=["vanilla"], datasets=[DatasetSpec("musique", limit=1)], limit=2), tmp_path / "r",
                 progress=False)


def test_an_empty_config_file_in_a_run_folder_is_refused_not_a_crash(tmp_path):
    """An empty RUN/config.yaml records no config: the claim names every setting (it was a
    TypeError from comparing with None)."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"different config \(differs in: baselines, checkpoints, .*, runtime, sample"):
        run_eval(config(methods=["vanilla"], datasets=[DatasetSpec("musique")], limit=2), tmp_path / "r", progress=False)


def test_shuffle_seeds_report_mean_and_sigma(tmp_path):
    cfg = config(methods=["kair"], datasets=[DatasetSpec("musique")], limit=3)
    cfg.robustness.shuffle_seeds = [1, 2]
    rows = run_eval(cfg, tmp_path / "r", progress=False)
    assert [r["method"] for r in rows] == ["kair", "kair@shuffle1", "kair@shuffle2"]
    assert "Shuffled final documents" in (tmp_path / "r" / "results.md").read_text()


def test_cli_eval_and_compare(tmp_path):
    cfg_path = tmp_path / "smoke.yaml"
    save_config(config(methods=["kair", "vanilla"], datasets=[DatasetSpec("musique")], limit=2,
                       out_dir=str(tmp_path / "runs")), cfg_path)
    runner = CliRunner()
    res = runner.invoke(eval_app, ["--config", str(cfg_path), "--run-name", "a"])
    assert res.exit_code == 0, res.output
    assert "| musique F1 |" in res.output
    res = runner.invoke(eval_app, ["--config", str(cfg_path), "--run-name", "b", "--methods", "vanilla"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(eval_app, ["compare", str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b")])
    assert res.exit_code == 0 and "a: " in res.output and "b: " in res.output
    bad = runner.invoke(eval_app, ["--config", str(cfg_path), "--methods", "nope"])
    assert bad.exit_code == 2 and "unknown method" in bad.output


def test_a_second_eval_into_a_run_folder_in_use_is_refused_naming_the_holder(tmp_path):
    from processes import holder_process

    cfg_path = tmp_path / "smoke.yaml"
    save_config(config(methods=["vanilla"], datasets=[DatasetSpec("musique")], limit=2,
                       out_dir=str(tmp_path / "runs")), cfg_path)
    holder = holder_process(tmp_path / "runs" / "r")  # as a first `kair eval --run-name r` still running
    try:
        res = CliRunner().invoke(eval_app, ["--config", str(cfg_path), "--run-name", "r"])
    finally:
        holder.kill()
        holder.wait()
    assert res.exit_code == 2 and f"is being written by another run (pid {holder.pid}" in res.output
    assert not (tmp_path / "runs" / "r" / "config.yaml").exists()  # nothing written
    assert CliRunner().invoke(eval_app, ["--config", str(cfg_path), "--run-name", "r"]).exit_code == 0
