"""The `datagen_app` commands through typer's CliRunner, and the shipped configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from data_gen.cli import datagen_app
from data_gen.filter import FilterConfig
from data_gen.quality import QualityConfig
from data_gen.sft import SFTDataConfig
from data_gen.silver import SilverConfig
from data_gen.teacher import GenerateConfig
from kair_runtime.config import from_dict, read_yaml

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "datagen"
COMMAND_OF = {"teacher": ("generate", GenerateConfig), "filter": ("filter", FilterConfig),
              "sft": ("to-sft", SFTDataConfig), "silver": ("silver", SilverConfig),
              "quality": ("quality", QualityConfig)}


def invoke(*args: str, env: dict[str, str] | None = None):
    result = CliRunner().invoke(datagen_app, [str(a) for a in args], env=env)
    return result, result.output + (result.stderr if result.stderr_bytes is not None else "")


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load_and_name_their_command(path):
    command, cls = next(v for k, v in COMMAND_OF.items() if path.name.startswith(k))
    assert path.read_text().startswith(f"# kair datagen {command} ")
    from_dict(cls, read_yaml(path))


def test_generate_filter_to_sft_from_the_command_line(tmp_path, shared_data):
    cfg = tmp_path / "gen.yaml"
    cfg.write_text(yaml.safe_dump({
        "runtime": {"llm": {"backend": "scripted"}, "retriever": {"kind": "bm25"}, "loop": {"max_steps": 2}},
        "datasets": [{"name": "hotpotqa"}, {"name": "musique"}],
        "sampling": {"temperatures": [0.0, 0.5]}, "out_dir": str(tmp_path / "ignored")}))
    res, out = invoke("generate", "--config", cfg, "--limit", 3, "--out", tmp_path / "t", "--no-progress",
                      "--set", "sampling.samples_per_temperature=1")
    assert res.exit_code == 0, out
    assert "12 / 12 trajectories" in out  # 3 + 3 questions x 2 samples, in --out, not the config's out_dir
    assert (tmp_path / "t" / "trajectories").is_dir() and not (tmp_path / "ignored").exists()
    res, out = invoke("filter", tmp_path / "t", "--out", tmp_path / "f", "--min-f1", 0)
    assert res.exit_code == 0, out
    assert "kept" in out and json.loads((tmp_path / "f" / "report.json").read_text())["total"] == 12
    res, out = invoke("to-sft", tmp_path / "f", "--out", tmp_path / "s", "--validation-fraction", 0.34,
                      "--set", "runtime.loop.max_steps=2")
    assert res.exit_code == 0, out
    assert "from 2 questions" in out and (tmp_path / "s" / "dataset" / "dataset_dict.json").exists()


def test_silver_and_quality_from_the_command_line(tmp_path, shared_data):
    res, out = invoke("silver", "--datasets", "musique,2wikimultihopqa:dev", "--limit", 4, "--out", tmp_path / "s",
                      "--index-format", "kr", "--set", "runtime.retriever.kind=bm25")
    assert res.exit_code == 0, out
    assert "musique:" in out and "/ 4 complete" in out and "8 trajectories" in out
    res, out = invoke("quality", tmp_path / "s", env={"COLUMNS": "80"})
    assert res.exit_code == 0, out
    summary = json.loads((tmp_path / "s" / "quality.json").read_text())["summary"]
    assert {r["dataset"] for r in summary} == {"musique", "2wikimultihopqa"}
    assert "entity recall" in (tmp_path / "s" / "quality.md").read_text()
    # The terminal table fits 80 columns: every measure named whole, no cell cut to an ellipsis.
    assert "\u2026" not in out and "evidence recall relaxed" in out
    table = [line for line in out.splitlines() if line[:1] in "\u250f\u2503\u2521\u2502\u2514"]
    assert len(table) > 16 and max(len(line) for line in table) <= 80


def test_bad_config_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("min_f1: 0.5\nbest_of: 2\n")
    res, out = invoke("filter", tmp_path, "--config", bad)
    assert res.exit_code == 2 and "unknown config key(s) best_of" in out
    res, out = invoke("quality", tmp_path / "missing")
    assert res.exit_code == 2 and "no such trajectory file or folder" in out
