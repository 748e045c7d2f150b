"""`kair ask` through the real CLI app, with the scripted backend and BM25 over the demo corpus."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kair_runtime.cli import app, mount_plugins


def test_ask_prints_steps_index_and_answer():
    res = CliRunner().invoke(app, ["ask", "Where was the lead singer of the Glass Herons born?",
                                   "--backend", "scripted", "--retriever", "bm25", "--max-steps", "2"])
    assert res.exit_code == 0, res.output
    assert "step 1" in res.output and "final index" in res.output and "answer" in res.output
    assert "Keywords:" in res.output


def test_ask_json_is_a_whole_trace():
    res = CliRunner().invoke(app, ["ask", "Where was Maren Volk born?", "--backend", "scripted",
                                   "--retriever", "bm25", "--json", "--set", "loop.top_k=2"])
    assert res.exit_code == 0, res.output
    trace = json.loads(res.stdout[res.stdout.index("{"):])
    assert trace["question"]["question"] == "Where was Maren Volk born?"
    assert all(len(s["retrieved"]) == 2 for s in trace["steps"])
    assert trace["final_prompt"] and "answer" in trace


def test_bad_config_is_a_clear_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("loop:\n  max_stpes: 2\n")
    res = CliRunner().invoke(app, ["ask", "q", "--config", str(cfg)])
    assert res.exit_code == 2 and "max_stpes" in res.output
    res = CliRunner().invoke(app, ["ask", "q", "--backend", "nope"])
    assert res.exit_code == 2 and "unknown LLM backend" in res.output


def test_plugin_subcommands_are_mounted():
    mount_plugins(app)
    res = CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0
    for name in ("ask", "index", "corpus", "eval", "serve", "datagen", "train", "merge", "soup"):
        assert name in res.output
