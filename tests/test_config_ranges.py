"""Loop and LLM settings are range- and type-checked where configs are read, for every command."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kair_runtime.cli import ask, mount_plugins
from kair_runtime.config import (LLM_RANGES, LOOP_RANGES, ConfigError, LLMConfig, LoopConfig, RuntimeConfig,
                                 load_config)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("override, message", [
    ("loop.max_steps=-1", "loop.max_steps=-1 is out of range; allowed: >= 1"),
    ("loop.max_steps=0", "loop.max_steps=0 is out of range; allowed: >= 1"),
    ("loop.max_steps=true", "loop.max_steps: expected int, got True"),  # a bool is not an int
    ("loop.top_k=0", "loop.top_k=0 is out of range"),
    ("loop.step_max_tokens=-5", "loop.step_max_tokens=-5 is out of range; allowed: >= 1"),
    ("loop.answer_max_tokens=0", "loop.answer_max_tokens=0 is out of range"),
    ("loop.round_size=0", "loop.round_size=0 is out of range; allowed: >= 1"),
    ("loop.temperature=-0.1", "loop.temperature=-0.1 is out of range; allowed: >= 0"),
    ("loop.temperature='0.5'", "loop.temperature: expected a number, got '0.5'"),  # a string is not a number
    ("loop.temperature=.nan", "loop.temperature=nan is not a finite number"),
    ("loop.top_p=0", "loop.top_p=0.0 is out of range; allowed: in (0, 1]"),
    ("loop.top_p=1.5", "loop.top_p=1.5 is out of range"),
    ("loop.seed=-1", "loop.seed=-1 is out of range; allowed: >= 0"),
    ("loop.max_passage_words=0", "loop.max_passage_words=0 is out of range"),
    ("loop.no_repeat_ngram=-1", "loop.no_repeat_ngram=-1 is out of range; allowed: >= 0"),
    ("llm.batch_size=0", "llm.batch_size=0 is out of range; allowed: >= 1"),
    ("llm.batch_size=false", "llm.batch_size: expected int, got False"),
    ("llm.concurrency=0", "llm.concurrency=0 is out of range; allowed: >= 1"),
    ("llm.timeout_s=0", "llm.timeout_s=0.0 is out of range; allowed: > 0"),
    ("llm.timeout_s=.inf", "llm.timeout_s=inf is not a finite number"),
    ("llm.timeout_s='30'", "llm.timeout_s: expected a number, got '30'"),
    ("llm.retries=-1", "llm.retries=-1 is out of range; allowed: >= 0"),
    ("llm.tensor_parallel_size=0", "llm.tensor_parallel_size=0 is out of range"),
    ("llm.gpu_memory_utilization=0", "llm.gpu_memory_utilization=0.0 is out of range; allowed: in (0, 1]"),
    ("llm.gpu_memory_utilization=1.2", "llm.gpu_memory_utilization=1.2 is out of range; allowed: in (0, 1]"),
    ("llm.kv_cache_gib=0", "llm.kv_cache_gib=0.0 is out of range; allowed: > 0"),
    ("llm.max_model_len=0", "llm.max_model_len=0 is out of range"),
    ("llm.max_lora_rank=0", "llm.max_lora_rank=0 is out of range; allowed: >= 1"),
    ("llm.enforce_eager=1", "llm.enforce_eager: expected true/false, got 1"),
    # Named choices, checked before any run folder or model is set up (answer_mode was a bare
    # "error: docs" after the model had loaded).
    ("loop.answer_mode=docs", "loop.answer_mode='docs' is not one of answer, answer_docs, answer_index"),
    ("loop.index_format=kk", "loop.index_format: unknown index format 'kk'; choose one of"),
    ("loop.index_update=append", "loop.index_update='append' is not one of merge, replace"),
])
def test_a_bad_loop_or_llm_setting_names_key_value_and_range(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(RuntimeConfig, None, [override])
    assert str(e.value) == message or str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_the_edges_of_each_range_are_accepted():
    cfg = load_config(RuntimeConfig, None, [
        "loop.max_steps=1", "loop.temperature=0", "loop.top_p=1", "loop.seed=0", "loop.no_repeat_ngram=0",
        "loop.round_size=1", "loop.max_passage_words=null", "llm.retries=0", "llm.gpu_memory_utilization=1",
        "llm.kv_cache_gib=0.5", "llm.timeout_s=5e-1", "llm.max_model_len=null"])
    assert (cfg.loop.max_steps, cfg.loop.top_p, cfg.llm.gpu_memory_utilization, cfg.llm.timeout_s) == (1, 1.0, 1.0, 0.5)


def _numeric_fields(cls) -> set[str]:
    hints = typing.get_type_hints(cls)
    out = set()
    for f in dataclasses.fields(cls):
        types = set(typing.get_args(hints[f.name])) or {hints[f.name]}
        if types & {int, float}:
            out.add(f.name)
    return out


def test_every_numeric_loop_and_llm_field_has_a_range():
    # A field added later without a range would accept any value again.
    assert _numeric_fields(LoopConfig) == set(LOOP_RANGES)
    assert _numeric_fields(LLMConfig) == set(LLM_RANGES)


def _kair() -> typer.Typer:
    """The `kair` command as the console script builds it (ask + the mounted subcommands)."""
    app = typer.Typer(pretty_exceptions_enable=False)
    app.command("ask")(ask)
    mount_plugins(app)
    return app


@pytest.mark.parametrize("command", ["ask", "eval", "datagen generate", "demo", "serve"])
def test_every_command_refuses_a_bad_loop_setting_before_doing_anything(command, tmp_path):
    """Exit 2, one line naming key, value and range, and no output folder (nothing a resume would trust)."""
    out = tmp_path / "out"
    prefix = "runtime." if command in ("eval", "datagen generate", "demo") else ""
    bad = ["--set", f"{prefix}loop.max_steps=-1"]
    if command == "ask":
        args = ["ask", "q", "--backend", "scripted", "--retriever", "bm25", *bad]
    elif command == "eval":
        cfg = tmp_path / "e.yaml"
        cfg.write_text(f"runtime: {{llm: {{backend: scripted}}, retriever: {{kind: bm25}}}}\n"
                       f"datasets: [{{name: musique}}]\nout_dir: {out}\n")
        args = ["eval", "--config", str(cfg), *bad]
    elif command == "datagen generate":
        args = ["datagen", "generate", "--out", str(out), "--no-progress", *bad]
    elif command == "demo":
        args = ["demo", "--out", str(out), *bad]
    else:
        args = ["serve", "--config", str(ROOT / "configs" / "serve" / "scripted.yaml"), *bad]
    res = CliRunner().invoke(_kair(), args)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{prefix}loop.max_steps=-1 is out of range; allowed: >= 1" in lines[0], res.output
    assert not out.exists()


def test_serve_limits_are_checked_by_the_same_rule():
    from kair_runtime.serve.config import load_serve_config

    with pytest.raises(ConfigError, match=r"^server\.max_batch=0 is out of range; allowed: >= 1$"):
        load_serve_config(None, ["server.max_batch=0"])
    with pytest.raises(ConfigError, match=r"^server\.batch_wait_ms=-1\.0 is out of range; allowed: >= 0$"):
        load_serve_config(None, ["server.batch_wait_ms=-1"])
    with pytest.raises(ConfigError, match=r"^loop\.max_steps=0 is out of range"):  # the loop's own rule first
        load_serve_config(None, ["loop.max_steps=0"])
    with pytest.raises(ConfigError, match=r"^loop\.max_steps=9 is outside 1\.\.server\.max_steps_limit=8$"):
        load_serve_config(None, ["loop.max_steps=9"])
