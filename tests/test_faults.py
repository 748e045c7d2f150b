"""Fault injection: every resumable command is killed (SIGKILL) at points spread over its durable
writes, then rerun; the folder it leaves must equal what an uninterrupted run writes, byte for
byte once the wall times (the one thing a rerun changes) are set aside.

The commands run as a user runs them, as `kair` processes (tests/fault_harness.py kills one at
its N-th fsync or rename), with the scripted backend and BM25 over the benchmark samples. The
kill points are drawn per command with a fixed seed from 1..W, W being the durable writes of its
uninterrupted run, so they land in the middle of appends, before renames, between a folder's
files and at the swap of a replaced folder. 25 kill points in all; at 9 of them a rebuild over
a finished folder is killed too, which must leave that folder exactly as it was.
"""

from __future__ import annotations

import json
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
VOLATILE = re.compile(r"(^|_)(wall|time|latency|created|since)(_|$)|_s$")


def kair(tmp: Path, args: list[str], kill_at: int = 0) -> tuple[int, int | None]:
    """Run `kair ARGS` (killed at its kill_at-th durable write if > 0); returns (return code,
    durable writes seen, None when killed)."""
    count = tmp / "writes.txt"
    count.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, str(HARNESS), str(kill_at), str(count), *args], cwd=tmp,
                          capture_output=True, text=True, timeout=600)
    if kill_at == 0 and proc.returncode != 0:
        raise AssertionError(f"kair {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return proc.returncode, int(count.read_text()) if count.exists() else None


def plain(value):
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if not VOLATILE.search(k)}
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
        if not path.is_file() or re.fullmatch(r"\.kair(\..+)?\.lock", path.name):
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
