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


def test_a_retry_stopped_midway_keeps_what_it_finished(tmp_path, specs, questions, bm25):
    """The retry writes its trajectories a round's worth at a time; a run stopped inside one (a
    dead engine, Ctrl-C) still writes the ones it finished, and a rerun retries only the rest."""
    import pytest

    from data_gen.store import read_trajectories
    from data_gen.teacher import GenerateConfig, SamplingGrid, generate
    from kair_runtime.config import LLMConfig, LoopConfig, RuntimeConfig
    from kair_runtime.llm.base import BackendDeadError, BackendError
    from kair_runtime.llm.scripted import ScriptedLLM, echo_kair

    def config(out: str) -> GenerateConfig:
        # round_size 10: all 10 questions in one round, so nothing is written by count.
        return GenerateConfig(runtime=RuntimeConfig(llm=LLMConfig(backend="scripted"),
                                                    loop=LoopConfig(max_steps=3, top_k=3, round_size=10)),
                              datasets=specs, sampling=SamplingGrid([0.0]), out_dir=out)

    class DiesOnThirdCall(ScriptedLLM):
        """Round 1's step and answer calls work; round 2's step call finds the engine dead."""

        def generate(self, prompts, sampling):
            if len(self.calls) == 2:
                raise BackendDeadError("engine core died (simulated)")
            return super().generate(prompts, sampling)

    def down(messages):
        raise BackendError("connection refused (simulated outage)")

    cfg = config(str(tmp_path / "t"))
    generate(cfg, llm=ScriptedLLM(down), retriever=bm25, progress=False)
    assert len(questions) == 10 and all(t.error for t in read_trajectories(cfg.out_dir))
    with pytest.raises(BackendDeadError):
        generate(cfg, llm=DiesOnThirdCall(echo_kair), retriever=bm25, progress=False, retry_failed=True)
    done = [t for t in read_trajectories(cfg.out_dir) if t.error is None]
    # Exactly the questions echo_kair judges sufficient at step 1 (answered in round 1).
    reference = generate(config(str(tmp_path / "ref")), llm=ScriptedLLM(echo_kair), retriever=bm25, progress=False)
    one_step = {t.question.id for t in read_trajectories(reference.path) if len(t.steps) == 1}
    assert 0 < len(one_step) < 10 and {t.question.id for t in done} == one_step
    again = generate(cfg, llm=ScriptedLLM(echo_kair), retriever=bm25, progress=False, retry_failed=True)
    assert again.retried == 10 - len(one_step) and all(t.error is None for t in read_trajectories(cfg.out_dir))
