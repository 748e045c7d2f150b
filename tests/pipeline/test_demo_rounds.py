"""Rounds of expert iteration in `kair demo` (pipeline/demo_rounds.py), with the tiny model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from rich.console import Console

import pipeline.demo_rounds as demo_rounds
from data_gen.filter import retrieval_path
from data_gen.store import read_trajectories
from kair_runtime.config import ConfigError, LLMConfig
from kair_runtime.records import Trace
from pipeline.demo import run_demo
from pipeline.demo_config import RoundSettings, load_demo_config
from tests.pipeline.test_demo import tiny_cfg


def lines(path) -> int:
    return path.read_text().count("\n")


def test_the_student_teaches_the_next_round_which_resumes_where_it_stopped(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = tiny_cfg(tmp_path, tiny_model_dir, eval_runs=["tuned-kair"],
                   rounds=RoundSettings(count=1, questions=4, samples=1, temperature=0.8))
    out = tmp_path / "demo"
    real_train = demo_rounds.train_student

    def killed(*args, **kwargs):  # the round's training is interrupted once, after its teacher ran
        raise KeyboardInterrupt

    monkeypatch.setattr(demo_rounds, "train_student", killed)
    with pytest.raises(KeyboardInterrupt):
        run_demo(cfg, Console(record=True, width=160))
    teacher_file = next((out / "round-1" / "teacher").rglob("shard-*.jsonl"))
    assert lines(teacher_file) == 8  # 4 sampled questions x (1 greedy + 1 sample)
    before = teacher_file.read_bytes()

    monkeypatch.setattr(demo_rounds, "train_student", real_train)
    info = run_demo(cfg, Console(record=True, width=160))
    assert teacher_file.read_bytes() == before  # resumed: nothing generated again
    (record,) = info["rounds"]
    assert record["questions"] == 4 and record["teacher"] == str(out / "adapter") and record["backend"] == "hf"
    taught = read_trajectories(teacher_file)
    assert {t.extra["teacher"] for t in taught} == {"round-0 student"}
    assert {t.extra["sample_id"] for t in taught} == {0, 1}
    # The yield counts every teacher trajectory, per dataset, and the kept ones among them.
    assert sum(c["total"] for c in record["data"]["teacher_kept"].values()) == 8
    assert record["data"]["sources"] == {"silver": 16, "teacher": 8}
    # A new student from the base in the round's folder, evaluated alone, served at the end.
    assert (out / "round-1" / "adapter" / "adapter_config.json").is_file() and record["trained_this_run"]
    assert [(r["model"].split(" ", 1)[1], r["dataset"]) for r in info["rows"]] == [
        ("(tuned)", "demo-dev"), ("(round 1)", "demo-dev")]
    assert lines(out / "round-1" / "traces" / "demo-dev" / "tuned-kair.jsonl") == 2
    assert yaml.safe_load((out / "serve.yaml").read_text())["llm"]["adapter"] == str(out / "round-1" / "adapter")
    results = (out / "results.md").read_text()
    assert "## Rounds of expert iteration" in results
    assert "- round 1 (hf, 4 questions): teacher trajectories kept" in results

    again = run_demo(cfg, Console(record=True, width=160))
    assert not again["rounds"][0]["trained_this_run"] and again["rows"] == info["rows"]
    # A round's folder belongs to the settings that made it; the number of rounds is not one of them.
    more = dataclasses.replace(cfg, rounds=dataclasses.replace(cfg.rounds, temperature=0.5))
    with pytest.raises(ConfigError, match="round-1 holds a round made with other settings .*rounds.temperature"):
        run_demo(more, Console(record=True, width=160))


def test_teacher_trajectories_join_silver_once_per_question_and_path(tmp_path, tiny_model_dir, monkeypatch):
    """The scripted backend as round 1's teacher: well-formed steps from the passages shown, the
    same for the greedy and the sampled trajectory, so the filter keeps one of each path."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(demo_rounds, "teacher_llm", lambda cfg, student, rdir: LLMConfig(backend="scripted"))
    cfg = tiny_cfg(tmp_path, tiny_model_dir, eval_runs=["tuned-kair"], min_f1=0.0,
                   rounds=RoundSettings(count=1, samples=2))
    cfg.runtime.loop.step_max_tokens = 200  # the scripted steps must fit
    info = run_demo(cfg, Console(record=True, width=160))
    out = tmp_path / "demo"
    data = info["rounds"][0]["data"]
    assert data["sources"] == {"silver": 16, "teacher": 48}
    kept = [Trace.from_dict(json.loads(line)) for line in (out / "round-1" / "filtered" / "kept.jsonl").open()]
    keys = [(t.question.id, retrieval_path(t)) for t in kept]
    assert len(keys) == len(set(keys))
    assert data["reasons"]["same_path"] >= 32  # each question's two samples repeat its greedy path
    teacher_kept = sum(c["kept"] for c in data["teacher_kept"].values())
    assert 0 < teacher_kept <= 16 and teacher_kept == sum(t.extra["teacher"] != "annotations" for t in kept)


def test_relabelled_teacher_steps_join_the_rounds_sft_data(tmp_path, tiny_model_dir, monkeypatch):
    """rounds.relabel: every step the round's teacher took, with the step the gold chain implies there,
    is trained on beside the filtered trajectories, split with them by question."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(demo_rounds, "teacher_llm", lambda cfg, student, rdir: LLMConfig(backend="scripted"))
    cfg = tiny_cfg(tmp_path, tiny_model_dir, eval_runs=["tuned-kair"],
                   rounds=RoundSettings(count=1, samples=0, relabel=True, init="continue", steps=1))
    cfg.runtime.loop.step_max_tokens = 200  # the scripted steps must fit
    info = run_demo(cfg, Console(record=True, width=160))
    out = tmp_path / "demo"
    stats = info["rounds"][0]["data"]["relabelled"]
    assert stats == json.loads((out / "round-1" / "relabelled" / "stats.json").read_text())
    teacher = [Trace.from_dict(json.loads(line)) for line in
               (out / "round-1" / "teacher" / "trajectories" / "shard-00000-of-00001.jsonl").open()]
    assert sum(d["trajectories"] for d in stats["datasets"].values()) == len(teacher) == 16
    steps = sum(len(t.steps) for t in teacher)
    judged = sum(n for d in stats["datasets"].values() for n in d["judgments"].values())
    assert judged == steps and stats["examples"] >= steps  # every step, plus the answers of complete chains
    rows = [json.loads(line) for split in ("train", "validation")
            for line in (out / "round-1" / "sft" / f"{split}.jsonl").open()]
    assert sum(r["source"].startswith("relabelled: ") for r in rows) == stats["examples"]
    assert "relabelled by gold chains" in (out / "results.md").read_text()


def test_a_continued_round_trains_on_from_the_previous_student(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = tiny_cfg(tmp_path, tiny_model_dir, eval_runs=["tuned-kair"],
                   rounds=RoundSettings(count=1, questions=2, samples=0, init="continue", steps=1))
    info = run_demo(cfg, Console(record=True, width=160))
    out = tmp_path / "demo"
    train = yaml.safe_load((out / "round-1" / "train.yaml").read_text())
    assert train["init_adapter"] == str(out / "adapter") and info["rounds"][0]["init"] == "continue"
    # its own step budget (rounds.steps), the silver student's untouched
    assert train["max_steps"] == 1 == info["rounds"][0]["steps"]
    assert yaml.safe_load((out / "train.yaml").read_text())["max_steps"] == cfg.train.steps
    # The round's student starts where the silver one ended, not at the base's loss.
    first = [e["loss"] for e in info["train_log"] if "loss" in e]
    again = [e["loss"] for e in info["rounds"][0]["train_log"] if "loss" in e]
    assert again[0] < first[0]
    assert "trained on from the previous one" in (out / "results.md").read_text()


@pytest.mark.vllm
@pytest.mark.slow
def test_a_round_teaches_on_vllm_with_the_student_merged_into_its_base(tmp_path, smollm2_model_dir, monkeypatch):
    """rounds.backend vllm (`nox -s vllm`): the hf student's adapter is merged into the base once,
    and that model writes the round's trajectories on vLLM's CPU build."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = tiny_cfg(tmp_path, smollm2_model_dir, eval_runs=["tuned-kair"],
                   rounds=RoundSettings(count=1, questions=2, samples=1, backend="vllm"))
    cfg.runtime.llm = dataclasses.replace(cfg.runtime.llm, kv_cache_gib=1.0, enforce_eager=True)
    info = run_demo(cfg, Console(record=True, width=160))
    out = tmp_path / "demo"
    (record,) = info["rounds"]
    merged = out / "round-1" / "teacher-model"
    assert record["backend"] == "vllm" and record["teacher"] == str(merged) and (merged / "config.json").is_file()
    taught = read_trajectories(next((out / "round-1" / "teacher").rglob("shard-*.jsonl")))
    assert len(taught) == 4 and {t.extra["backend"] for t in taught} == {"vllm"}
    assert sum(c["total"] for c in record["data"]["teacher_kept"].values()) == 4
    # The round's student is trained and evaluated on the student's own (hf) backend.
    assert [(r["model"].split(" ", 1)[1], r["dataset"]) for r in info["rows"]] == [
        ("(tuned)", "demo-dev"), ("(round 1)", "demo-dev")]


def test_an_unchained_round_draws_only_questions_silver_could_not_chain(tmp_path):
    from kair_runtime.records import Question
    from pipeline.demo_config import DemoConfig
    from pipeline.demo_rounds import round_questions
    from pipeline.demo_sets import QuestionSet

    train = QuestionSet("train", [Question(id=f"q{i}", question=f"question {i}") for i in range(10)],
                        tmp_path / "corpus.jsonl", {})
    chained = {"q0", "q2", "q3", "q5", "q8"}
    every = DemoConfig(rounds=RoundSettings(count=1, questions=4))
    unchained = DemoConfig(rounds=RoundSettings(count=1, questions=4, focus="unchained"))
    assert len(round_questions(every, train, 1, chained)) == 4
    drawn = [q.id for q in round_questions(unchained, train, 1, chained)]
    assert len(drawn) == 4 and not set(drawn) & chained and drawn == sorted(drawn, key=lambda i: int(i[1:]))
    # fewer unchained questions than asked for: all of them
    assert [q.id for q in round_questions(DemoConfig(rounds=RoundSettings(count=1, questions=9, focus="unchained")),
                                          train, 1, chained)] == ["q1", "q4", "q6", "q7", "q9"]


def test_round_settings_are_checked_at_load():
    assert load_demo_config(None, ["rounds.count=2", "rounds.questions=300"]).rounds.count == 2
    with pytest.raises(ConfigError, match="rounds.samples=-1 is out of range"):
        load_demo_config(None, ["rounds.samples=-1"])
    with pytest.raises(ConfigError, match="rounds.backend='openai'"):
        load_demo_config(None, ["rounds.backend=openai"])
    with pytest.raises(ConfigError, match="rounds.temperature=0.0 is out of range"):
        load_demo_config(None, ["rounds.temperature=0.0"])
    with pytest.raises(ConfigError, match="rounds.init='warm'"):
        load_demo_config(None, ["rounds.init=warm"])
    with pytest.raises(ConfigError, match="rounds.focus='hard'"):
        load_demo_config(None, ["rounds.focus=hard"])
