"""`kair demo` end to end at toy scale: the tiny random-init model as the student, BM25, 2 LoRA
steps, 2 dev questions. Random weights write no KAIR layout, so the figures are not checked for
quality, only that every stage ran and left its files."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from eval.run import evaluate_one
from eval.specs import TrainSet
from kair_runtime.config import ConfigError, LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig
from pipeline.demo import run_demo
from pipeline.demo_config import DemoConfig, TrainSettings, load_demo_config
from pipeline.demo_sets import demo_sets


def test_smoke_config_is_the_builtin_default():
    path = Path(__file__).resolve().parents[2] / "configs" / "demo" / "smoke.yaml"
    assert path.read_text().startswith("# kair demo --config configs/demo/smoke.yaml")
    assert load_demo_config(str(path), []) == DemoConfig()


def test_flags_override_the_config(tmp_path):
    cfg = load_demo_config(None, ["train.learning_rate=5.0e-4"], out=str(tmp_path), train_steps=3, max_steps=1)
    assert (cfg.out_dir, cfg.train.steps, cfg.runtime.loop.max_steps) == (str(tmp_path), 3, 1)
    assert cfg.train.learning_rate == 5e-4 and cfg.runtime.llm.model == "smollm2-135m"
    with pytest.raises(ConfigError, match="train.stepz"):
        load_demo_config(None, ["train.stepz=3"])
    with pytest.raises(ConfigError, match=r"train.steps=0 is out of range; allowed: >= 1"):
        load_demo_config(None, [], train_steps=0)
    with pytest.raises(ConfigError, match="not a trainer checkpoint"):
        load_demo_config(None, [f"train.resume_from_checkpoint={tmp_path}"])
    assert load_demo_config(None, ["eval_runs=[tuned-kair]"]).eval_runs == ["tuned-kair"]
    with pytest.raises(ConfigError, match="eval_runs: \\['tuned'\\]; choose among prompted-kair, prompted-vanilla"):
        load_demo_config(None, ["eval_runs=[tuned]"])
    with pytest.raises(ConfigError, match="eval_runs: empty"):
        load_demo_config(None, ["eval_runs=[]"])
    # One corpus for every set would leave each set's gold ids pointing into its own corpus.
    with pytest.raises(ConfigError, match="runtime.retriever.corpus: the demo searches each question set's own"):
        load_demo_config(None, [f"runtime.retriever.corpus={tmp_path / 'c.jsonl'}"])
    # Flags are values as given, not YAML: a numeric-looking model name stays a name.
    assert load_demo_config(None, [], model="123").runtime.llm.model == "123"


def tiny_cfg(tmp_path, tiny_model_dir, **kw) -> DemoConfig:
    return DemoConfig(
        runtime=RuntimeConfig(
            llm=LLMConfig(backend="hf", model=str(tiny_model_dir), device="cpu", dtype="float32", batch_size=4),
            retriever=RetrieverConfig(kind="bm25"),
            loop=LoopConfig(max_steps=2, top_k=3, step_max_tokens=8, answer_max_tokens=4, max_passage_words=40)),
        out_dir=str(tmp_path / "demo"), train=TrainSettings(steps=2, learning_rate=5e-3), dev_limit=2, **kw)


def test_demo_runs_every_stage_with_the_tiny_model(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = tiny_cfg(tmp_path, tiny_model_dir)
    console = Console(record=True, width=160)
    info = run_demo(cfg, console)
    out = tmp_path / "demo"

    # Stage 2: silver data for the 16 train questions, the complete ones kept, as SFT chats.
    assert info["data"]["sources"] == {"silver": 16} and 0 < info["data"]["kept"] <= 16
    assert info["data"]["examples"]["train"] > 0
    assert (out / "silver" / "trajectories.jsonl").is_file() and (out / "filtered" / "kept.jsonl").is_file()
    assert (out / "sft" / "dataset").is_dir() and (out / "train.yaml").is_file()
    # Stage 3: a PEFT adapter the runtime can load, with its loss history.
    adapter = out / "adapter"
    assert (adapter / "adapter_config.json").is_file() and info["student"] == str(adapter)
    assert info["trained_this_run"] and any("loss" in r for r in info["train_log"])
    # Stage 4: three runs on the 2 dev questions, their traces, the table and the plots.
    assert [(r["model"].split()[-1], r["method"], r["summary"]["n"]) for r in info["rows"]] == [
        ("(prompted)", "kair", 2), ("(prompted)", "vanilla", 2), ("(tuned)", "kair", 2)]
    assert info["rows"][1]["summary"]["format_validity"] is None
    for name in ("prompted-kair", "tuned-kair", "prompted-vanilla"):
        lines = (out / "traces" / "demo-dev" / f"{name}.jsonl").read_text().splitlines()
        assert len(lines) == 2
    tuned = json.loads((out / "traces" / "demo-dev" / "tuned-kair.jsonl").read_text().splitlines()[0])
    assert "+" in tuned["extra"]["llm"]  # the loop ran with the adapter loaded
    assert info["plots"] and all(Path(p).is_file() for p in info["plots"])
    results = (out / "results.md").read_text()
    assert "| dataset | model | method | n | F1 | EM | format valid % | mean steps | tokens/q |" in results
    assert "SMOKE-SCALE" in results and "kair serve --config" in results
    serve = yaml.safe_load((out / "serve.yaml").read_text())
    assert serve["llm"]["adapter"] == str(adapter) and serve["loop"]["max_passage_words"] == 40
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["wall_s"]) == {"index", "data", "train", "eval", "serve", "total"}
    printed = console.export_text()
    assert "valid %" in printed and "tuned" in printed and f"kair serve --config {out / 'serve.yaml'}" in printed
    assert "SMOKE-SCALE" in printed

    # A rerun with the same config reuses the student and every trace: nothing is trained or generated.
    again = run_demo(cfg, Console(record=True, width=160))
    assert not again["trained_this_run"]
    assert [r["summary"]["f1"] for r in again["rows"]] == [r["summary"]["f1"] for r in info["rows"]]
    assert (out / "traces" / "demo-dev" / "tuned-kair.jsonl").read_text().count("\n") == 2
    # The demo evaluates through `kair eval`'s unit: evaluate_one reads its traces back, runs nothing
    # (no method is built), and scores them into the demo's row.
    _, (dev,) = demo_sets(cfg)

    def no_method():
        raise AssertionError("every dev question has a trace: nothing should run")

    traces, summary = evaluate_one(no_method, dev.questions, dev.gold, out / "traces" / "demo-dev" / "tuned-kair.jsonl",
                                   lambda n: None)
    assert [t.question.id for t in traces] == [q.id for q in dev.questions]
    assert summary == info["rows"][2]["summary"]
    # eval_runs picks the comparisons: the tuned row alone, the same figures.
    only = run_demo(dataclasses.replace(cfg, eval_runs=["tuned-kair"]), Console(record=True, width=160))
    assert [(r["model"].split()[-1], r["method"]) for r in only["rows"]] == [("(tuned)", "kair")]
    assert only["rows"][0]["summary"] == info["rows"][2]["summary"]
    # Other loop settings would make other traces: resuming these is refused before any stage runs.
    changed = dataclasses.replace(cfg, runtime=dataclasses.replace(
        cfg.runtime, loop=dataclasses.replace(cfg.runtime.loop, step_max_tokens=7, no_repeat_ngram=24)))
    with pytest.raises(ConfigError, match=r"differs in: runtime.loop.no_repeat_ngram, runtime.loop.step_max_tokens"):
        run_demo(changed, Console(record=True, width=160))


BENCH_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.mark.skipif(not (BENCH_DATA / "musique").is_dir(), reason="needs the benchmark samples in ../shared/data")
def test_demo_on_benchmark_files_trains_and_evaluates_each_dev_set(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Part of two train splits: MuSiQue's is two files (the limit takes from the first), 2Wiki's one.
    cfg = tiny_cfg(tmp_path, tiny_model_dir, data_dir=str(BENCH_DATA),
                   train_sets=[TrainSet("musique", limit=60), TrainSet("2wikimultihopqa", limit=40)],
                   dev_sets=["musique:dev", "2wikimultihopqa:dev"])
    cfg.train = TrainSettings(steps=1, learning_rate=5e-3, use_peft=False)  # full fine-tuning this time
    cfg.silver_outcomes = True  # 2Wiki's A-or-B questions get their outcome relation
    info = run_demo(cfg, Console(record=True, width=160))
    out = tmp_path / "demo"
    assert info["data"]["sources"] == {"silver": 100} and info["data"]["kept"] > 30
    silver, kept = info["data"]["silver"], info["data"]["kept_by_dataset"]
    assert {k: c["total"] for k, c in silver.items()} == {"musique": 60, "2wikimultihopqa": 40}
    assert silver["2wikimultihopqa"]["outcomes"] > 0 and "outcomes" not in silver["musique"]
    assert sum(c["kept"] for c in kept.values()) == info["data"]["kept"] and kept["2wikimultihopqa"]["kept"] > 0
    assert f"silver chains complete musique {silver['musique']['complete']}/60" in (out / "results.md").read_text()
    # Full fine-tuning saves a whole model, which the tuned runs load as their model.
    assert info["student"] == str(out / "student") and (out / "student" / "model.safetensors").is_file()
    tuned = json.loads((out / "traces" / "musique" / "tuned-kair.jsonl").read_text().splitlines()[0])
    assert tuned["extra"]["llm"].endswith("student")
    # One row per (run, dev set), then the pooled rows over both sets' 4 questions.
    pooled = [r for r in info["rows"] if r["dataset"] == "all"]
    assert [r["summary"]["n"] for r in pooled] == [4, 4, 4]
    assert {r["dataset"] for r in info["rows"]} == {"musique", "2wikimultihopqa", "all"}
    # Recall uses each set's gold paragraph ids in its own closed corpus (2Wiki's includes corpus_6119).
    assert all("recall" in r["summary"] for r in info["rows"])
    corpus_2wiki = (out / "corpora" / "2wikimultihopqa-dev.jsonl").read_text().count("\n")
    assert corpus_2wiki > 6000
    assert "benchmark files in" in (out / "results.md").read_text()


def test_a_dataset_without_its_split_is_a_config_error(tmp_path):
    from pipeline.demo_sets import benchmark_sets

    cfg = load_demo_config(None, [f"data_dir={tmp_path}", "train_sets=[musique]"])
    with pytest.raises(ConfigError, match="name:split"):
        benchmark_sets(cfg, tmp_path / "out")


@pytest.mark.skipif(not (BENCH_DATA / "musique").is_dir(), reason="needs the benchmark samples in ../shared/data")
def test_one_question_in_two_train_sets_is_a_config_error(tmp_path):
    from pipeline.demo_sets import benchmark_sets

    again = TrainSet("musique", path=str(BENCH_DATA / "musique" / "train_300.jsonl"))
    cfg = DemoConfig(data_dir=str(BENCH_DATA), train_sets=["musique:train", again], dev_sets=["musique:dev"])
    with pytest.raises(ConfigError, match="is in both train_sets\\[0\\] and train_sets\\[1\\]"):
        benchmark_sets(cfg, tmp_path / "out")


def test_a_configured_teacher_adds_its_trajectories(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The scripted backend writes well-formed KAIR steps from the documents it is shown: a teacher
    # that costs nothing. Its answers are rarely right, so the F1 bar is lowered to keep them.
    cfg = tiny_cfg(tmp_path, tiny_model_dir, teacher=LLMConfig(backend="scripted"), min_f1=0.0)
    cfg.train.steps, cfg.dev_limit = 1, 1
    cfg.runtime.loop.step_max_tokens = 200  # the teacher's steps must fit (the tiny student's 8 would cut them)
    info = run_demo(cfg, Console(record=True, width=160))
    out = tmp_path / "demo"
    assert info["data"]["sources"] == {"silver": 16, "teacher": 16}
    teacher_lines = list((out / "teacher").glob("**/*.jsonl"))
    assert teacher_lines and sum(f.read_text().count("\n") for f in teacher_lines) == 16
    kept = [json.loads(line) for line in (out / "filtered" / "kept.jsonl").read_text().splitlines()]
    assert {k["extra"]["teacher"] for k in kept} >= {"annotations", "scripted"}


def test_training_goes_on_from_an_earlier_runs_checkpoint(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    first = tiny_cfg(tmp_path, tiny_model_dir)
    first.train = TrainSettings(steps=2, learning_rate=5e-3, save_steps=1)
    run_demo(first, Console(record=True, width=160))
    checkpoint = tmp_path / "demo" / "adapter" / "checkpoint-1"
    assert (checkpoint / "trainer_state.json").is_file()

    longer = tiny_cfg(tmp_path, tiny_model_dir)
    longer.out_dir = str(tmp_path / "longer")
    longer.train = TrainSettings(steps=3, learning_rate=5e-3, save_steps=1, resume_from_checkpoint=str(checkpoint))
    info = run_demo(longer, Console(record=True, width=160))
    assert yaml.safe_load((tmp_path / "longer" / "train.yaml").read_text())["resume_from_checkpoint"] == str(checkpoint)
    state = json.loads((tmp_path / "longer" / "adapter" / "trainer_state.json").read_text())
    # Steps 2 and 3 were trained here; step 1's log came with the checkpoint.
    assert state["global_step"] == 3 and info["trained_this_run"]
    assert [r["step"] for r in info["train_log"] if "loss" in r] == [1, 2, 3]
    assert not (tmp_path / "longer" / "adapter" / "checkpoint-1").exists()

    longer.train.resume_from_checkpoint = str(tmp_path / "demo" / "adapter")  # final weights, no optimizer state
    (tmp_path / "demo" / "adapter" / "trainer_state.json").unlink()
    longer.out_dir = str(tmp_path / "bad-resume")
    with pytest.raises(ConfigError, match="not a trainer checkpoint"):
        run_demo(longer, Console(record=True, width=160))
    assert not (tmp_path / "bad-resume").exists()  # refused before the index and data stages ran


def test_an_interrupted_training_goes_on_from_its_last_checkpoint(tmp_path, tiny_model_dir, monkeypatch):
    """A rerun with the same settings whose student was never saved resumes from the latest
    checkpoint the trainer finished, not from step 0."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = tiny_cfg(tmp_path, tiny_model_dir, eval_runs=["tuned-kair"])
    cfg.train = TrainSettings(steps=2, learning_rate=5e-3, save_steps=1)
    run_demo(cfg, Console(record=True, width=160))
    adapter = tmp_path / "demo" / "adapter"
    # As if killed after checkpoint-1: no final save, no checkpoint-2, a checkpoint-2 half written.
    (adapter / "adapter_config.json").unlink()
    shutil.rmtree(adapter / "checkpoint-2")
    (adapter / "checkpoint-2").mkdir()
    console = Console(record=True, width=200)
    info = run_demo(cfg, console)
    assert f"resuming the interrupted training from {adapter / 'checkpoint-1'}" in console.export_text()
    state = json.loads((adapter / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and info["trained_this_run"] and (adapter / "adapter_config.json").is_file()
    assert [r["step"] for r in info["train_log"] if "loss" in r] == [1, 2]
    # Checkpoints of a training with other settings are never resumed as this one's.
    (adapter / "adapter_config.json").unlink()
    train_yaml = tmp_path / "demo" / "train.yaml"
    train_yaml.write_text(train_yaml.read_text().replace("learning_rate: 0.005", "learning_rate: 0.004"))
    with pytest.raises(ConfigError, match=r"adapter holds checkpoints of a training with other settings"):
        run_demo(cfg, Console(record=True, width=200))


def test_the_benchmark_recipe_is_the_measured_one():
    """docs/results.md's benchmark figures (the silver student, its rounds) were measured with these
    settings of configs/demo/benchmark-cpu.yaml; change one and the figures must be measured again."""
    cfg = load_demo_config("configs/demo/benchmark-cpu.yaml", [])
    t, loop, llm = cfg.train, cfg.runtime.loop, cfg.runtime.llm
    assert (t.steps, t.learning_rate, t.lr_scheduler_type, t.warmup_steps, t.batch_size) == (450, 1e-3, "cosine", 10, 4)
    assert (t.use_peft, t.lora_r, t.lora_alpha, t.max_length, t.precision, t.seed) == (True, 16, 32, 1024, "bfloat16", 0)
    assert (llm.model, llm.dtype, llm.batch_size, cfg.runtime.retriever.kind) == ("smollm2-135m", "bfloat16", 32, "bm25")
    assert (loop.index_format, loop.max_steps, loop.top_k, loop.step_max_tokens, loop.answer_max_tokens,
            loop.max_passage_words, loop.no_repeat_ngram, loop.structured) == ("kr", 3, 3, 160, 16, 40, 0, False)
    assert [str(s) for s in cfg.train_sets] == ["hotpotqa:train", "musique:train", "2wikimultihopqa:train"]
    assert (cfg.min_f1, cfg.validation_fraction, cfg.dev_limit, cfg.silver_outcomes) == (1.0, 0.05, 50, False)
    assert (cfg.rounds.count, cfg.rounds.samples, cfg.rounds.temperature) == (0, 2, 0.7)
    assert t.sft == {}  # random batches: group_by_length was measured at 1,100 steps only


def test_the_benchmark_students_train_config_matches_the_demos_training(tmp_path):
    """configs/train/smollm2-135m-benchmark-cpu.yaml trains students on other data with the settings
    `kair demo --config configs/demo/benchmark-cpu.yaml` writes; the two must not drift apart."""
    from pipeline.demo_train import train_yaml

    cfg = load_demo_config("configs/demo/benchmark-cpu.yaml", [])
    demo = train_yaml(cfg, "smollm2-135m", tmp_path, "smollm2")
    shipped = yaml.safe_load(Path("configs/train/smollm2-135m-benchmark-cpu.yaml").read_text(encoding="utf-8"))
    # By design: the run's paths, its step budget and checkpoint cadence, and the demo's own progress bar.
    own = {"dataset_path", "output_dir", "max_steps", "save_steps", "eval_steps", "logging_steps", "disable_tqdm",
           "dataset_train_split", "dataset_test_split"}
    assert {k: v for k, v in demo.items() if k not in own} == {k: v for k, v in shipped.items() if k not in own}


def test_batching_the_adapter_merge_and_step_reuse_are_trace_neutral_in_float32_only():
    """A resumed demo may regroup prompts into other batches, merge its adapter, or reuse a
    repeated step's output, only where that cannot change a trace."""
    from pipeline.demo_config import BATCHING, trace_neutral

    moved = set(BATCHING) | {"runtime.llm.merge_adapter", "runtime.loop.reuse_repeated_steps"}
    assert moved <= set(trace_neutral(load_demo_config(None, ["runtime.llm.dtype=float32"])))
    assert not moved & set(trace_neutral(load_demo_config(None, ["runtime.llm.dtype=bfloat16"])))


@pytest.mark.parametrize("override, message", [
    ("min_f1=1.5", r"min_f1=1.5 is out of range; allowed: in \[0, 1\]"),
    ("validation_fraction=1.0", r"validation_fraction=1.0 is out of range; allowed: in \[0, 1\)"),
    ("dev_limit=0", r"dev_limit=0 is out of range"),
    ("train.learning_rate=0", r"train.learning_rate=0.0 is out of range; allowed: > 0"),
    ("train.batch_size=0", r"train.batch_size=0 is out of range"),
])
def test_demo_settings_are_range_checked_at_load(override, message):
    with pytest.raises(ConfigError, match=message):
        load_demo_config(None, [override])


def test_any_other_train_sft_key_passes_through_to_train_yaml(tmp_path):
    """A training option the demo does not name goes in train.sft and reaches train/sft.py as it is,
    overriding what the demo derives; its name is checked at load."""
    from pipeline.demo_train import train_yaml
    from train.sft import parse_args

    cfg = load_demo_config(None, ["train.sft.gradient_accumulation_steps=2", "train.sft.lora_dropout=0.05",
                                  "train.sft.logging_steps=7"])
    settings = train_yaml(cfg, "smollm2-135m", tmp_path, "smollm2")
    assert (settings["gradient_accumulation_steps"], settings["lora_dropout"], settings["logging_steps"]) == (2, 0.05, 7)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(settings))
    _, training_args, model_args = parse_args(["--config", str(path)])  # the values as training reads them
    assert training_args.gradient_accumulation_steps == 2 and model_args.lora_dropout == 0.05
    with pytest.raises(ConfigError, match=r"train.sft.gradient_acumulation_steps: not a train/sft.py key"):
        load_demo_config(None, ["train.sft.gradient_acumulation_steps=2"])
    with pytest.raises(ConfigError, match=r"train.sft.output_dir: the demo sets it"):
        load_demo_config(None, ["train.sft.output_dir=elsewhere"])
