"""The parser on hostile outputs: the pathological shapes and the seeded fuzz of
bench/parse_speed.py. Nothing raises, no parser_error is recorded, and every parse stays well
under GUARD_S: a guard against super-linear patterns (2,000 blank lines used to take minutes),
not a timing benchmark (that is bench/parse_speed.py)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from kair_runtime.index import empty_index
from kair_runtime.parser import MAX_OUTPUT_CHARS, parse_step_output
from kair_runtime.records import FORMAT_FALLBACKS

GUARD_S = 10.0  # loose enough for a loaded 2-core CI machine; the regressions it guards took minutes


def _load_bench():
    path = Path(__file__).resolve().parents[2] / "bench" / "parse_speed.py"
    spec = importlib.util.spec_from_file_location("bench_parse_speed", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def _parse_checked(raw: str, fmt: str):
    t0 = time.perf_counter()
    step = parse_step_output(raw, fmt, empty_index(fmt), bench.QUESTION)
    seconds = time.perf_counter() - t0
    assert not [f for f in step.fallbacks if f.startswith("parser_error")], (raw[:80], step.fallbacks)
    assert step.judgment in {"sufficient", "insufficient"}
    return step, seconds


@pytest.mark.parametrize("fmt", ["kr", "kf"])
def test_pathological_shapes_parse_without_errors_and_fast(fmt):
    slow = []
    for label, raw in bench.pathological_inputs([2_000, 20_000]):
        _, seconds = _parse_checked(raw, fmt)
        if seconds > GUARD_S:
            slow.append(f"{label}: {seconds:.2f}s")
    assert not slow


def test_blank_lines_that_used_to_take_minutes():
    for n in (1_000, 2_000, MAX_OUTPUT_CHARS):
        step, seconds = _parse_checked("\n" * n, "kr")
        assert seconds < GUARD_S and step.fallbacks == ["index_missing", "judgment_missing", "query_missing"]


def test_one_megabyte_outputs_are_cut_and_recorded():
    for label, raw in list(bench.pathological_inputs([1_000_000]))[::7]:
        step, seconds = _parse_checked(raw, "kr")
        assert seconds < GUARD_S, label
        assert "output_truncated" in step.fallbacks and "output_truncated" in FORMAT_FALLBACKS
    # The head of a runaway output is still read: a good step followed by a megabyte of junk.
    good = "<index>\nKeywords: The Glass Herons\n</index>\n<reasoning>Judgment: sufficient</reasoning>\n"
    step, _ = _parse_checked(good + "\n" * 1_000_000, "kr")
    assert step.index.keywords == ["The Glass Herons"] and step.judgment == "sufficient"
    assert step.fallbacks == ["output_truncated"]
    step, _ = _parse_checked(good + "\n" * (MAX_OUTPUT_CHARS - len(good)), "kr")
    assert step.fallbacks == []  # at the limit nothing is cut


def test_seeded_fuzz_never_breaks_the_parser():
    slow = []
    for i, raw in enumerate(bench.fuzz_inputs(2_000, seed=15)):
        fmt = bench.FORMATS[i % len(bench.FORMATS)]
        _, seconds = _parse_checked(raw, fmt)
        if seconds > GUARD_S:
            slow.append(f"#{i}: {bench.describe(raw)}")
    assert not slow
