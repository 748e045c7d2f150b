"""`kair datagen generate` after a backend outage: failures are counted in the summary line and
`--retry-failed` reruns only them, in place (scripted teacher down for some questions, BM25)."""

from __future__ import annotations

import json

import yaml
from outage import OUTAGE, is_down
from typer.testing import CliRunner

from data_gen.cli import datagen_app
from kair_runtime.jsonl import recover
from kair_runtime.llm import LLM_BACKENDS


def invoke(*args):
    res = CliRunner().invoke(datagen_app, [str(a) for a in args])
    return res, res.output


def test_retry_failed_reruns_only_the_failed_trajectories_in_place(tmp_path, shared_data, monkeypatch):
    cfg = tmp_path / "gen.yaml"
    cfg.write_text(yaml.safe_dump({
        "runtime": {"llm": {"backend": "scripted"}, "retriever": {"kind": "bm25"},
                    "loop": {"max_steps": 2, "round_size": 2}},  # 2: several in-place rewrites per wave
        "datasets": [{"name": "hotpotqa"}, {"name": "musique"}],
        "sampling": {"temperatures": [0.0, 0.5], "samples_per_temperature": 1}}))
    args = ["generate", "--config", cfg, "--limit", 3, "--out", tmp_path / "t", "--no-progress"]

    with monkeypatch.context() as m:  # the teacher's server is down for some questions
        m.setitem(LLM_BACKENDS, "scripted", OUTAGE)
        res, out = invoke(*args)
    assert res.exit_code == 0, out
    path = next((tmp_path / "t" / "trajectories").glob("*.jsonl"))
    before = recover(path)
    failed = {i for i, r in enumerate(before) if r["error"]}
    assert failed == {i for i, r in enumerate(before) if is_down(r["question"]["question"])}
    assert 0 < len(failed) < 12
    assert "12 / 12 trajectories" in out and f"; {len(failed)} failed; rerun with --retry-failed" in out

    lines = path.read_text().splitlines()
    res, out = invoke(*args)  # a plain resume trusts every record
    assert res.exit_code == 0 and f"{len(failed)} failed" in out and path.read_text().splitlines() == lines

    res, out = invoke(*args, "--retry-failed")
    assert res.exit_code == 0, out
    assert f"(0 written now, 12 already there, {len(failed)} failed ones retried); 0 failed" in out
    after = path.read_text().splitlines()
    assert len(after) == 12
    for i, (old, new) in enumerate(zip(lines, after)):
        if i in failed:  # same trajectory key, now a complete run
            o, n = json.loads(old), json.loads(new)
            assert (n["question"]["id"], n["extra"]["sample_id"]) == (o["question"]["id"], o["extra"]["sample_id"])
            assert n["error"] is None and n["steps"] and n["answer"]
        else:  # untouched, byte for byte
            assert new == old
    assert not list(path.parent.glob(".*.tmp"))
