"""Golden pins for issue 16 ("one loop, one pipeline"): exact outputs of today's code, so a
refactor that moves rules into one home but changes what they produce fails here.

Each `observe_*` function runs real code and returns plain, JSON-able values with what varies
run to run removed (wall times; the test's tmp folder, replaced by "<ROOT>"). The tests compare
them with tests/golden/pins.json: small values inline, and files of records (trajectories, SFT
chats, eval traces) with the golden files under tests/golden/ that pins.json names, record by
record, so a failure shows the records that changed (tests/golden.py, check_golden_files). A pin
changes only with a stated, deliberate behaviour fix (by hand in pins.json; golden files with the
explicit `python tests/golden_diff.py --write-files`, never by a test). Two runs of this module
give the same values (checked when pinned).

The demo world and the tiny random-init model are embedded/built here; G2, G4, G5 and G6 read
the benchmark samples under $KAIR_SHARED_DATA (../shared/data) and skip without them.
MiniLM (the demo's default dense encoder) is not installed offline here, so G1 pins BM25 only.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest

from golden import blank_column, check_golden_files, file_text, jsonl_text, load_pins, strip_times, \
    stripped_traces, without_lines

FORMATS = ["kr", "text", "keywords", "facts", "kf", "none"]
PINS = load_pins()


def _shared_data() -> Path:
    from eval.datasets import shared_data_dir

    root = shared_data_dir()
    if not (root / "musique").is_dir() or not (root / "hotpotqa").is_dir():
        pytest.skip(f"benchmark samples not found at {root}")
    return root


def _datagen_conftest():
    # tests/data_gen/conftest.py holds the oracle teacher; loaded under its own name so it does
    # not clash with the conftest module pytest already imported.
    path = Path(__file__).parent / "data_gen" / "conftest.py"
    spec = importlib.util.spec_from_file_location("golden_datagen_conftest", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- G1: silver on the demo world

def demo_loop(fmt: str):
    from kair_runtime.config import LoopConfig

    # the smoke demo's loop (pipeline.demo_config._smoke_runtime), with the format varied
    return LoopConfig(index_format=fmt, max_steps=2, top_k=3, step_max_tokens=96, answer_max_tokens=16,
                      max_passage_words=40)


def observe_g1(root: Path) -> dict[str, str]:
    """The silver trajectories JSONL's text, per index format, BM25 over the demo corpus."""
    from pipeline.demo_config import DemoConfig
    from pipeline.demo_sets import demo_sets
    from data_gen.silver import run_silver
    from kair_runtime.config import RetrieverConfig, RuntimeConfig
    from kair_runtime.jsonl import JsonlWriter
    from kair_runtime.retrieval import build_retriever

    train, _ = demo_sets(DemoConfig())
    retriever = build_retriever(RetrieverConfig(kind="bm25", corpus=str(train.corpus)))
    out = {}
    for fmt in FORMATS:
        runtime = RuntimeConfig(retriever=RetrieverConfig(kind="bm25"), loop=demo_loop(fmt))
        traces = run_silver(train.questions, retriever, runtime, train.corpus)
        path = root / f"silver-{fmt}.jsonl"
        with JsonlWriter(path) as w:
            w.write(t.to_dict() for t in traces)
        out[fmt] = file_text(path)
    return out


@pytest.fixture(scope="module")
def g1(tmp_path_factory):
    root = tmp_path_factory.mktemp("g1")
    return root, observe_g1(root)


def test_g1_silver_on_the_demo_world(g1):
    """Silver trajectories (data_gen.silver.run_silver) on the 16 demo train questions, every index
    format, BM25, the smoke loop: the exact JSONL bytes. Issue 16 step 3 replays silver through
    KairLoop; these bytes (extra key order, zero times and tokens, fallbacks, merge) must not move.
    Golden files: tests/golden/silver_demo_<format>.jsonl."""
    _, observed = g1
    pinned = PINS["g1_silver_demo_bm25"]
    assert check_golden_files(observed, pinned, "g1_silver_demo_bm25") == pinned


# ---------------------------------------------------------------- G2: silver on shared data

def observe_g2(root: Path) -> str:
    """As tests/data_gen/test_datagen_silver.py's kr setup: N=15 of three benchmarks, BM25 over
    their closed corpus, max_steps 4, top_k 5."""
    from data_gen.silver import SilverConfig, silver
    from data_gen.store import DataSpec, closed_corpus
    from kair_runtime.config import LoopConfig, RetrieverConfig, RuntimeConfig
    from kair_runtime.retrieval import build_retriever

    # The first train file of each split, as pinned: the corpus is every question's paragraphs of
    # the files read, so a split that grows (issue 28) would otherwise move the pin.
    data = _shared_data()
    specs = [DataSpec("hotpotqa", path=str(data / "hotpotqa" / "train_100.json"), limit=15),
             DataSpec("musique", path=str(data / "musique" / "train_100.json"), limit=15),
             DataSpec("2wikimultihopqa", split="dev", limit=15)]
    corpus = closed_corpus(specs, [], root / "corpus.jsonl")
    retriever = build_retriever(RetrieverConfig(kind="bm25", corpus=str(corpus)))
    cfg = SilverConfig(runtime=RuntimeConfig(loop=LoopConfig(index_format="kr", max_steps=4, top_k=5)),
                       datasets=specs, corpus=str(corpus), out_dir=str(root / "kr"))
    path, _ = silver(cfg, retriever=retriever)
    return file_text(path)


def test_g2_silver_on_benchmark_samples(tmp_path):
    """Silver over HotpotQA, MuSiQue and 2Wiki samples (their chains: supporting titles,
    decompositions with #n filled, evidence triples): the exact file bytes. Guards steps 3 and
    10 of issue 16 (oracle replay, retriever built from config) on real multi-hop data. Golden
    file: tests/golden/silver_shared_kr.jsonl."""
    _shared_data()
    pinned = PINS["g2_silver_shared_kr"]
    assert check_golden_files(observe_g2(tmp_path), pinned, "g2_silver_shared_kr") == pinned


# ---------------------------------------------------------------- G3: filter + SFT, prompt versions

def observe_g3(root: Path, silver_kr: Path) -> dict[str, object]:
    from data_gen.filter import FilterConfig, run_filter
    from data_gen.sft import SFTDataConfig, build_sft
    from kair_runtime.config import RetrieverConfig, RuntimeConfig
    from kair_runtime.prompts import PromptSet

    report = run_filter(FilterConfig(trajectories=str(silver_kr), out_dir=str(root / "filtered")))
    stats = build_sft(SFTDataConfig(runtime=RuntimeConfig(retriever=RetrieverConfig(kind="bm25"), loop=demo_loop("kr")),
                                trajectories=str(root / "filtered"), out_dir=str(root / "sft")))
    return {"kept": report["kept"], "reasons": report["reasons"],
            "train": file_text(root / "sft" / "train.jsonl"),
            "validation": file_text(root / "sft" / "validation.jsonl"),
            "examples": {k: v["examples"] for k, v in stats["splits"].items()},
            "prompt_versions": {f: PromptSet.load(f).version for f in FORMATS}}


def test_g3_filter_and_sft_chats(g1, tmp_path):
    """run_filter + build_sft over G1's kr silver: the SFT chat files byte for byte ("same SFT
    chats"), and PromptSet.version of every format. Issue 16 step 5 moves the step layout out of
    the prompt files; the versions (hashed prompt bytes) and the rebuilt prompts must not change.
    Golden files: tests/golden/sft_demo_{train,validation}.jsonl."""
    root, _ = g1
    pinned = PINS["g3_sft"]
    assert check_golden_files(observe_g3(tmp_path, root / "silver-kr.jsonl"), pinned, "g3_sft") == pinned


# ---------------------------------------------------------------- G4: teacher generate with the oracle

def observe_g4(root: Path) -> str:
    """The oracle teacher of tests/data_gen/conftest.py, 10 shared questions x 3 samples."""
    from data_gen.store import closed_corpus, load_questions, read_trajectories
    from data_gen.teacher import GenerateConfig, SamplingGrid, generate
    from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig
    from kair_runtime.llm.scripted import ScriptedLLM
    from kair_runtime.retrieval import build_retriever

    dg = _datagen_conftest()
    data = _shared_data()  # the first train file of each split, as pinned (see observe_g2)
    specs = [dataclasses.replace(s, path=str(data / s.name / "train_100.json")) for s in dg.SPECS]
    questions = load_questions(specs)
    corpus = closed_corpus(specs, [], root / "corpus.jsonl")
    bm25 = build_retriever(RetrieverConfig(kind="bm25", corpus=str(corpus)))
    llm = ScriptedLLM(dg.oracle_respond(questions, wrong={questions[1].id}, broken={questions[2].id},
                                        messy={questions[3].id}), name="oracle")
    cfg = GenerateConfig(runtime=RuntimeConfig(llm=LLMConfig(backend="scripted", model="oracle"),
                                               loop=LoopConfig(max_steps=3, top_k=3, round_size=4)),
                         datasets=specs, sampling=SamplingGrid([0.0, 0.7], samples_per_temperature=2),
                         out_dir=str(root / "teacher"), teacher="oracle-7b")
    generate(cfg, llm=llm, retriever=bm25, progress=False)
    # read_trajectories orders by file then line: the shards' order, as written
    return jsonl_text(strip_times(t.to_dict()) for t in read_trajectories(cfg.out_dir))


def test_g4_teacher_trajectories(tmp_path):
    """data_gen.teacher.generate with the scripted oracle (right, wrong, broken and messy
    answers), 3 samples per question, round_size 4: every trajectory, times stripped, in file
    order. Issue 16 step 2 replaces run_wave with KairLoop.iter_run; order, extra keys and
    their order, and the steps must stay. Golden file: tests/golden/teacher_oracle.jsonl."""
    _shared_data()
    pinned = PINS["g4_teacher"]
    assert check_golden_files(observe_g4(tmp_path), pinned, "g4_teacher") == pinned


# ---------------------------------------------------------------- G5 / G6: run_eval

METHODS = ["kair", "vanilla", "iter-retgen", "ircot", "qa-docs", "qa-index", "no-index", "no-evolving"]
SUMMARY_TIMES = ("wall_time_s_per_question",)


def eval_outputs(run: Path) -> dict[str, object]:
    """Every traces.jsonl (times stripped), summary.json minus wall time, results.md with the s/q
    column cut."""
    traces = {str(p.relative_to(run).parent): stripped_traces(p) for p in sorted(run.rglob("traces.jsonl"))}
    summary = json.loads((run / "summary.json").read_text())
    md = blank_column((run / "results.md").read_text(), "s/q")
    return {"traces": traces, "summary": _drop_keys(summary, SUMMARY_TIMES), "results_md": md}


def _drop_keys(obj, keys):
    if isinstance(obj, dict):
        return {k: _drop_keys(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [_drop_keys(v, keys) for v in obj]
    return obj


def observe_g5(root: Path) -> dict[str, object]:
    from eval.run import DatasetSpec, EvalConfig, run_eval
    from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig

    runtime = RuntimeConfig(llm=LLMConfig(backend="scripted"), retriever=RetrieverConfig(kind="bm25"),
                            loop=LoopConfig(max_steps=3, top_k=3))
    datasets = [DatasetSpec("musique"), DatasetSpec("bamboogle", split="test", corpus_from=["hotpotqa:dev"])]
    cfg = EvalConfig(runtime=runtime, limit=4, methods=METHODS, datasets=datasets)
    run_eval(cfg, root / "run", progress=False)
    return eval_outputs(root / "run")


def test_g5_scripted_eval_over_every_method(tmp_path):
    """run_eval with the scripted backend, every method, MuSiQue and Bamboogle (a borrowed
    corpus): traces, summary and results.md, times removed. Guards issue 16 steps 1, 4, 7-10
    (loop seams, NoEvolving, dataset spec, corpus entry point, tables, config -> objects).
    Golden files: the traces, tests/golden/eval_scripted/<dataset>/<method>.jsonl."""
    _shared_data()
    pinned = PINS["g5_eval_scripted"]
    assert check_golden_files(observe_g5(tmp_path), pinned, "g5_eval_scripted") == pinned


def observe_g6(root: Path, tiny_model_dir: Path) -> list[dict[str, object]]:
    from eval.run import DatasetSpec, EvalConfig, run_eval
    from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig

    runtime = RuntimeConfig(llm=LLMConfig(backend="hf", model=str(tiny_model_dir), batch_size=4),
                            retriever=RetrieverConfig(kind="bm25"),
                            loop=LoopConfig(max_steps=2, top_k=2, step_max_tokens=12, answer_max_tokens=6,
                                            max_passage_words=20))
    cfg = EvalConfig(runtime=runtime, datasets=[DatasetSpec("musique")], methods=METHODS, limit=2)
    cfg.baselines.iter_retgen_iterations = 2
    cfg.baselines.iter_retgen_max_tokens = 8
    cfg.baselines.ircot_max_steps = 2
    cfg.baselines.ircot_max_tokens = 8
    rows = run_eval(cfg, root / "run", progress=False)
    keys = ("f1", "em", "format_validity", "prompt_tokens_per_question", "completion_tokens_per_question",
            "tokens_per_step", "step_distribution", "failed", "n")
    return [{"method": r["method"], **{k: r["summary"].get(k) for k in keys}} for r in rows]


def test_g6_every_method_with_the_tiny_model(tmp_path, tiny_model_dir):
    """Every method with the tiny random-init HF model (greedy, deterministic): F1, EM, format
    validity, token figures and step counts, exact. The random model breaks the layout, so this
    pins the fallback paths a scripted model never takes (issue 16 steps 1, 4, 5)."""
    _shared_data()
    observed = observe_g6(tmp_path, tiny_model_dir)
    # The behaviour test_eval_run once checked on its own run of the same eval (now run once, here).
    assert [r["method"] for r in observed] == METHODS
    assert all(r["n"] == 2 and r["failed"] == 0 and r["completion_tokens_per_question"] > 0 for r in observed)
    assert observed[0]["format_validity"] is not None and observed[0]["format_validity"] < 100  # a random model breaks it
    assert (tmp_path / "run" / "results.md").exists()
    assert observed == PINS["g6_eval_tiny"]


# ---------------------------------------------------------------- G7: the smoke demo, tiny model

REPO = Path(__file__).resolve().parents[1]


def observe_g7(root: Path, tiny_model_dir: Path) -> dict[str, object]:
    """Run in `root` (the caller chdirs there): the student is the relative path "tiny-student",
    a link to the tiny model, so its name, which the console table centres in its title, has
    the same length in every run."""
    import torch
    from rich.console import Console

    from pipeline.demo import run_demo
    from pipeline.demo_config import DemoConfig, TrainSettings
    from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig

    (root / "tiny-student").symlink_to(tiny_model_dir)
    cfg = DemoConfig(
        runtime=RuntimeConfig(
            llm=LLMConfig(backend="hf", model="tiny-student", device="cpu", dtype="float32", batch_size=4),
            retriever=RetrieverConfig(kind="bm25"),
            loop=LoopConfig(max_steps=2, top_k=3, step_max_tokens=8, answer_max_tokens=4, max_passage_words=40)),
        out_dir=str(root / "demo"), train=TrainSettings(steps=2, learning_rate=5e-3), dev_limit=2)
    console = Console(record=True, width=160)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU float32 sums can depend on the thread count
    try:
        info = run_demo(cfg, console)
    finally:
        torch.set_num_threads(threads)
    out = root / "demo"
    rows = [{**r, "summary": _drop_keys(r["summary"], SUMMARY_TIMES)} for r in info["rows"]]

    # Absolute paths become <ROOT> (the tmp folder) and <REPO> (the embedded corpus); wall times
    # become <time>: the stage table, the run-statistics s/q column, the trainer's own seconds,
    # the console's "total N s"; the console's progress bars (elapsed/remaining) are dropped.
    def norm(text: str) -> str:
        text = text.replace(str(root), "<ROOT>").replace(str(REPO), "<REPO>")
        text = blank_column(blank_column(text, "s/q"), "s")
        text = re.sub(r"[0-9]+ s \(trainer_state.json\)", "<time> s (trainer_state.json)", text)
        text = re.sub(r"total [0-9]+ s$", "total <time> s", text, flags=re.MULTILINE)
        return without_lines(text, "\u2501")  # the progress bar's heavy line
    return {"data": info["data"],
            "sft_train": file_text(out / "sft" / "train.jsonl"),
            "losses": [{k: v for k, v in r.items() if k in ("step", "loss", "eval_loss", "epoch")}
                       for r in info["train_log"]],
            "rows": rows,
            "results_md": norm((out / "results.md").read_text()),
            # whitespace runs collapsed: the console wraps a line where <ROOT> (of varying length) ends
            "console": " ".join(norm(console.export_text()).split()),
            "serve_yaml": norm((out / "serve.yaml").read_text())}


def test_g7_smoke_demo_with_the_tiny_model(tmp_path, tiny_model_dir, monkeypatch):
    """`kair demo` at toy scale (tests/pipeline/test_demo.py's config): data stats, the SFT train
    file, the two LoRA losses (rel 1e-5, one torch thread), the three result rows, results.md,
    the console table and serve.yaml. Issue 16 step 13 moves the demo into pipeline/ on the
    shared pieces; its outputs must stay. Golden file: tests/golden/demo_tiny_sft_train.jsonl."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    observed = observe_g7(tmp_path, tiny_model_dir)
    pinned = PINS["g7_demo_tiny"]
    losses = observed.pop("losses")
    assert losses == [{k: pytest.approx(v, rel=1e-5) for k, v in r.items()} for r in pinned["losses"]]
    pinned = {k: v for k, v in pinned.items() if k != "losses"}
    assert check_golden_files(observed, pinned, "g7_demo_tiny") == pinned


# ---------------------------------------------------------------- G8: kair ask --json

def observe_g8() -> dict[str, object]:
    from typer.testing import CliRunner

    from kair_runtime.cli import app

    env = {"COLUMNS": "80"}  # the printed rules span the console width
    res = CliRunner().invoke(app, ["ask", "Where was the lead singer of the Glass Herons born?",
                                   "--backend", "scripted", "--retriever", "bm25", "--json"], env=env)
    assert res.exit_code == 0, res.output
    trace = strip_times(json.loads(res.stdout[res.stdout.index("{"):]))
    text = CliRunner().invoke(app, ["ask", "Where was Maren Volk born?", "--backend", "scripted",
                                    "--retriever", "bm25", "--max-steps", "2"], env=env)
    assert text.exit_code == 0, text.output
    # the last line ends with the wall time ("..., 0.0s")
    return {"trace": trace, "text": re.sub(r"[0-9.]+s$", "<s>", text.stdout.rstrip(), flags=re.MULTILINE)}


def test_g8_kair_ask(tmp_path):
    """`kair ask --backend scripted --retriever bm25` over the embedded corpus: the --json trace
    (times stripped) and the printed steps. Issue 16 step 10 routes ask through the one
    config -> objects module; the answer path must not change."""
    assert observe_g8() == PINS["g8_ask"]
