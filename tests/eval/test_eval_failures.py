"""Failed questions (a backend outage): counted in every summary, in format validity's denominator,
and rerun in place by `kair eval --retry-failed` (scripted LLM down for some questions, BM25)."""

from __future__ import annotations

import json

import pytest
from outage import OUTAGE, is_down, respond
from typer.testing import CliRunner

from eval.datasets import shared_data_dir
from eval.metrics import format_validity
from eval.report import summarize
from eval.cli import eval_app
from eval.run import DatasetSpec, EvalConfig
from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig, save_config
from kair_runtime.jsonl import recover
from kair_runtime.llm import LLM_BACKENDS
from kair_runtime.llm.scripted import ScriptedLLM
from kair_runtime.loop import KairLoop
from kair_runtime.records import Question


def test_a_question_that_failed_before_its_first_step_counts_as_an_invalid_step(word_overlap):
    questions = [Question(id=f"q{i}", question=q, answers=["Coldplay"]) for i, q in enumerate([
        "Which band recorded Lost!?", "Where was Coldplay formed?", "Who recorded Wonderwall?",
        "When was Blur formed?", "Which city is Oasis from?", "What album has Viva la Vida?"])]
    down = {q.id for q in questions if is_down(q.question)}
    assert 0 < len(down) < len(questions)
    traces = KairLoop(ScriptedLLM(respond), word_overlap, LoopConfig(max_steps=2, top_k=2)).run(questions)
    assert {t.question.id for t in traces if t.error} == down
    assert all(not t.steps for t in traces if t.error)  # the outage hit the very first call
    ok_steps = sum(len(t.steps) for t in traces if not t.error)
    assert all(s.parsed_ok for t in traces for s in t.steps)
    # Each failed question expected at least one step and got no valid one.
    expected = 100.0 * ok_steps / (ok_steps + len(down))
    assert expected < 100
    assert format_validity(traces) == pytest.approx(expected)
    assert summarize(traces)["format_validity"] == pytest.approx(expected)
    assert summarize([t for t in traces if t.error])["format_validity"] == 0.0
    assert format_validity([]) is None


@pytest.mark.skipif(not (shared_data_dir() / "musique").exists(),
                    reason=f"benchmark samples not found at {shared_data_dir()}")
def test_retry_failed_reruns_only_the_failed_questions_in_place(tmp_path, monkeypatch):
    runtime = RuntimeConfig(llm=LLMConfig(backend="scripted"), retriever=RetrieverConfig(kind="bm25"),
                            loop=LoopConfig(max_steps=2, top_k=3))
    cfg_path = tmp_path / "eval.yaml"
    save_config(EvalConfig(runtime=runtime, datasets=[DatasetSpec("musique")], methods=["kair"], limit=8,
                           chunk_size=3, out_dir=str(tmp_path / "runs")), cfg_path)
    args = ["--config", str(cfg_path), "--run-name", "r"]
    run = tmp_path / "runs" / "r"

    with monkeypatch.context() as m:  # the backend is down for some questions
        m.setitem(LLM_BACKENDS, "scripted", OUTAGE)
        res = CliRunner().invoke(eval_app, args)
    assert res.exit_code == 0, res.output
    path = next(run.rglob("traces.jsonl"))
    before = recover(path)
    failed = {r["question"]["id"] for r in before if r["error"]}
    assert failed == {r["question"]["id"] for r in before if is_down(r["question"]["question"])}
    assert 0 < len(failed) < 8
    summary = json.loads((run / "summary.json").read_text())[0]["summary"]
    assert summary["failed"] == len(failed) and summary["format_validity"] < 100
    assert f"failed: {len(failed)} of 8 question runs" in res.output and "--retry-failed" in res.output
    assert f"{len(failed)} failed" in (run / "results.md").read_text()

    # The outage is over, but a plain resume trusts every record: nothing reruns.
    lines = path.read_text().splitlines()
    res = CliRunner().invoke(eval_app, args)
    assert res.exit_code == 0 and path.read_text().splitlines() == lines
    assert json.loads((run / "summary.json").read_text())[0]["summary"]["failed"] == len(failed)

    res = CliRunner().invoke(eval_app, args + ["--retry-failed"])
    assert res.exit_code == 0, res.output
    after = path.read_text().splitlines()
    assert [json.loads(x)["question"]["id"] for x in after] == [r["question"]["id"] for r in before]
    for old, new in zip(lines, after):  # successes untouched, byte for byte; failures replaced
        if json.loads(old)["question"]["id"] not in failed:
            assert new == old
        else:
            assert json.loads(new)["error"] is None and json.loads(new)["steps"]
    summary = json.loads((run / "summary.json").read_text())[0]["summary"]
    assert summary["failed"] == 0 and summary["format_validity"] == 100.0
    assert "failed: 0 of 8 question runs" in res.output
