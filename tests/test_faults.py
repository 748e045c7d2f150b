"""Fault injection: every resumable command is killed (SIGKILL) at points spread over its durable
writes, then rerun; the folder it leaves must equal what an uninterrupted run writes, byte for
byte once the wall times (the one thing a rerun changes) are set aside.

The commands run as a user runs them, as `kair` processes (tests/fault_harness.py kills one at
its N-th fsync or rename), with the scripted backend and BM25 over the benchmark samples, or,
for `kair train` and `kair demo`, the tiny random-init model. The kill points are drawn per
command with a fixed seed from 1..W, W being the durable writes of its uninterrupted run, so they
land in the middle of appends, before renames, between a folder's files and at the swap of a
replaced folder. Training writes its checkpoints in place, with no fsync or rename, so train and
demo are killed at plain file writes too (--file-writes): in the middle of a checkpoint, of its
trainer_state.json, of the final save. 32 kill points in all; at 9 of them a rebuild over a
finished folder is killed too, which must leave that folder exactly as it was.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eval.datasets import shared_data_dir

pytestmark = pytest.mark.skipif(not (shared_data_dir() / "musique").exists(),
                                reason=f"benchmark samples not found at {shared_data_dir()}")

ROOT = Path(__file__).resolve().parents[1]
HARNESS = Path(__file__).resolve().parent / "fault_harness.py"
DEMO_CORPUS = ROOT / "kair_runtime" / "data" / "demo_corpus.jsonl"
# Keys whose values are wall-clock readings (the only part of an output a rerun may change).
VOLATILE = re.compile(r"(^|_)(wall|time|runtime|latency|created|since)(_|$)|_s$|_per_second$")
# What one process did, by definition another in a resumed run: transformers' train_loss (the mean
# over the steps this process trained) and the demo's trained_this_run.
PER_PROCESS = {"train_loss", "trained_this_run"}


def kair(tmp: Path, args: list[str], kill_at: int = 0) -> tuple[int, int | None]:
    """Run `kair ARGS` (killed at its kill_at-th durable write if > 0); returns (return code,
    durable writes seen, None when killed)."""
    count = tmp / "writes.txt"
    count.unlink(missing_ok=True)
    # One thread: the tiny models gain nothing from more, and oversubscribed threads slow them ~50x.
    # A fixed hash seed: PEFT writes target_modules from a set, in an order that varies by process.
    proc = subprocess.run([sys.executable, str(HARNESS), str(kill_at), str(count), *args], cwd=tmp,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"})
    if kill_at == 0 and proc.returncode != 0:
        raise AssertionError(f"kair {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return proc.returncode, int(count.read_text()) if count.exists() else None


def plain(value):
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if not VOLATILE.search(k) and k not in PER_PROCESS}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def snapshot(folder: Path) -> dict[str, object]:
    """Every file under `folder` by relative path: JSON/JSONL/YAML parsed with their wall times
    dropped, markdown with its numbers blanked (the same numbers are compared in the JSON), images
    by presence, the rest as bytes. The lock file and hidden staging folders are not outputs."""
    out: dict[str, object] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        # Not outputs: the lock, and the datasets library's cache of a tokenized split (written by
        # the run that tokenized it, absent where a resumed run had no more to train).
        if not path.is_file() or re.fullmatch(r"\.kair(\..+)?\.lock|cache-[0-9a-f]+\.arrow", path.name):
            continue
        if path.suffix == ".json":
            out[rel] = plain(json.loads(path.read_text()))
        elif path.suffix == ".jsonl":
            out[rel] = [plain(json.loads(line)) for line in path.read_text().splitlines()]
        elif path.suffix == ".yaml":
            out[rel] = plain(yaml.safe_load(path.read_text()))
        elif path.suffix == ".md":
            out[rel] = re.sub(r"\d+\.\d+", "<n>", path.read_text())
        elif path.suffix == ".png":
            out[rel] = "png"
        else:
            out[rel] = path.read_bytes()
    return out


def outputs(tmp: Path, names: list[str]) -> dict[str, object]:
    return {name: snapshot(tmp / name) if (tmp / name).is_dir() else (tmp / name).read_bytes() for name in names}


def clear(tmp: Path, names: list[str]) -> None:
    for name in names:
        for path in (tmp / name, tmp / f".{name}.partial", tmp / f".{name}.old"):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


def kill_and_resume(tmp: Path, args: list[str], names: list[str], points: int, seed: int,
                    replaced: bool = False) -> list[int]:
    """The uninterrupted run's outputs, then `points` runs killed at drawn durable writes, each
    rerun to completion and compared with them. `replaced`: the command replaces its folder
    whole, so a rebuild killed at the same points over the finished folder must leave it exactly
    as it was. Returns the kill points used."""
    clear(tmp, names)
    _, writes = kair(tmp, args)
    expected = outputs(tmp, names)
    assert writes and writes >= points, f"{args[0]}: {writes} durable writes, fewer than {points} kill points"
    at = sorted(random.Random(seed).sample(range(1, writes + 1), points))
    for n in at:
        clear(tmp, names)
        code, _ = kair(tmp, args, kill_at=n)
        assert code == -9, f"{' '.join(args)}: not killed at durable write {n} of {writes} (exit {code})"
        kair(tmp, args)  # the same command again, as a user resumes
        assert outputs(tmp, names) == expected, f"{' '.join(args)}: killed at write {n} of {writes}, then rerun"
        if replaced:
            code, _ = kair(tmp, args, kill_at=n)
            assert code in (-9, 0) and outputs(tmp, names) == expected, f"{' '.join(args)}: rebuild killed at {n}"
    return at


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("faults")
    (tmp / "eval.yaml").write_text(yaml.safe_dump({
        "runtime": {"llm": {"backend": "scripted"}, "retriever": {"kind": "bm25"},
                    "loop": {"max_steps": 3, "top_k": 3}},
        "datasets": [{"name": "musique"}, {"name": "hotpotqa"}], "methods": ["kair", "vanilla"], "limit": 4,
        "chunk_size": 2, "out_dir": "runs"}))
    (tmp / "gen.yaml").write_text(yaml.safe_dump({
        "runtime": {"llm": {"backend": "scripted"}, "retriever": {"kind": "bm25"}, "loop": {"max_steps": 2}},
        "datasets": [{"name": "hotpotqa"}, {"name": "musique"}], "sampling": {"temperatures": [0.0, 0.5]},
        "out_dir": "teacher"}))
    return tmp


def test_index_build(work):
    kill_and_resume(work, ["index", "build", "--corpus", str(DEMO_CORPUS), "--out", "idx", "--retriever", "bm25"],
                    ["idx"], points=3, seed=1, replaced=True)


def test_eval(work):
    kill_and_resume(work, ["eval", "--config", "eval.yaml", "--run-name", "r"], ["runs"], points=6, seed=2)


def test_datagen_generate_filter_and_to_sft(work):
    generate = ["datagen", "generate", "--config", "gen.yaml", "--limit", "3", "--no-progress",
                "--set", "sampling.samples_per_temperature=1"]
    kill_and_resume(work, generate, ["teacher"], points=5, seed=3)
    kill_and_resume(work, ["datagen", "filter", "teacher", "--out", "kept", "--min-f1", "0"], ["kept"],
                    points=3, seed=4, replaced=True)
    kill_and_resume(work, ["datagen", "to-sft", "kept", "--out", "sft", "--validation-fraction", "0.34",
                           "--set", "runtime.loop.max_steps=2"], ["sft"], points=3, seed=5, replaced=True)


def test_datagen_silver(work):
    kill_and_resume(work, ["datagen", "silver", "--datasets", "musique", "--limit", "4", "--out", "silver",
                           "--index-format", "kr", "--set", "runtime.retriever.kind=bm25"], ["silver"],
                    points=3, seed=6)


def test_corpus_build(work):
    kill_and_resume(work, ["corpus", "build", "--dataset", "musique", "--out", "corpus.jsonl"], ["corpus.jsonl"],
                    points=2, seed=7)


@pytest.fixture(scope="module")
def tiny(work) -> Path:
    """The tiny random-init Qwen2 and the demo SFT data, in `work`; trained once into a scratch
    dir so that the datasets cache of its tokenized splits exists before any counted run (a first
    run writes it, later runs do not, and kill points are drawn from a run's write count)."""
    from train.tiny_model import build_tiny_chat_model
    from train.tiny_run import write_demo_sft

    build_tiny_chat_model(work / "tiny-model", family="qwen2")
    write_demo_sft(work / "tiny-sft")
    kair(work, TRAIN + ["--set", "output_dir=warm"])
    return work


TRAIN = ["--file-writes", "train", "--config", str(ROOT / "configs" / "train" / "tiny-cpu.yaml"),
         "--set", "model_name_or_path=tiny-model", "--set", "dataset_path=tiny-sft", "--set", "max_steps=6",
         "--set", "save_steps=2", "--set", "eval_steps=3", "--set", "logging_steps=1"]


def test_train(tiny):
    """`resume_from_checkpoint: last` makes one command that starts a run and, after a kill, goes
    on from the newest complete checkpoint: a kill in the middle of a checkpoint's files (its
    trainer_state.json last) is not taken for one."""
    kill_and_resume(tiny, TRAIN + ["--set", "output_dir=out", "--set", "resume_from_checkpoint=last"], ["out"],
                    points=3, seed=8)


def test_demo(tiny):
    (tiny / "demo.yaml").write_text(yaml.safe_dump({
        "runtime": {"llm": {"backend": "hf", "model": str(tiny / "tiny-model"), "device": "cpu", "dtype": "float32",
                            "batch_size": 4},
                    "retriever": {"kind": "bm25"},
                    "loop": {"max_steps": 2, "top_k": 3, "step_max_tokens": 8, "answer_max_tokens": 4,
                             "max_passage_words": 40}},
        "out_dir": "demo", "train": {"steps": 2, "learning_rate": 5.0e-3, "save_steps": 1}, "dev_limit": 2}))
    kill_and_resume(tiny, ["--file-writes", "demo", "--config", "demo.yaml"], ["demo"], points=4, seed=9)
