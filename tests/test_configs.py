"""Every YAML under configs/ loads into its dataclass and starts with its launch command."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kair_runtime.config import ConfigError, LoopConfig, RuntimeConfig, from_dict, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


def config_class(path: Path):
    """Which dataclass a config file is for, by its folder (other packages add theirs here)."""
    kind = path.relative_to(ROOT / "configs").parts[0]
    if kind == "runtime":
        return RuntimeConfig
    if kind == "serve":
        from kair_runtime.serve.config import ServeConfig
        return ServeConfig
    if kind == "train":
        from train.sft import validate_config
        return validate_config
    if kind == "eval":
        from eval.run import EvalConfig
        return EvalConfig
    if kind == "demo":
        from pipeline.demo_config import DemoConfig
        return DemoConfig
    return None


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_config_loads_and_documents_its_command(path):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# ") and any(w in first for w in ("kair", "accelerate", "python")), first
    cls = config_class(path)
    if cls is None:
        assert isinstance(yaml.safe_load(path.read_text()), dict)  # accelerate/deepspeed files
    elif not isinstance(cls, type):
        cls(path)  # a validating function (train configs go through TRL's parser)
    else:
        load_config(cls, path)


def test_unknown_key_is_an_error_naming_it(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("loop:\n  max_stpes: 3\n")
    with pytest.raises(ConfigError, match=r"loop\.max_stpes.*valid keys under loop"):
        load_config(RuntimeConfig, p)


def test_overrides_and_types():
    cfg = load_config(RuntimeConfig, None, ["loop.max_steps=2", "llm.backend=openai", "loop.temperature=1"])
    assert cfg.loop.max_steps == 2 and cfg.llm.backend == "openai" and cfg.loop.temperature == 1.0
    with pytest.raises(ConfigError, match="loop.max_steps: expected int"):
        from_dict(RuntimeConfig, {"loop": {"max_steps": "four"}})
    with pytest.raises(ConfigError, match="must look like"):
        load_config(RuntimeConfig, None, ["loop.max_steps"])
    assert from_dict(LoopConfig, {"max_passage_words": None}).max_passage_words is None


def test_a_float_written_without_a_dot_is_a_number():
    # YAML 1.1 (PyYAML) reads `5e-4` as a string; a float field takes it as the number.
    cfg = load_config(RuntimeConfig, None, ["loop.temperature=5e-4"])
    assert cfg.loop.temperature == 5e-4
    with pytest.raises(ConfigError, match="loop.temperature: expected a number"):
        load_config(RuntimeConfig, None, ["loop.temperature=warm"])


def test_a_section_override_keeps_the_fields_own_default_for_the_other_keys():
    """`kair demo --set runtime.llm.backend=vllm` once replaced the demo's compact runtime (2 steps,
    top-3, 96 step tokens, float32) with RuntimeConfig's defaults (4 steps, top-5, 384 tokens)."""
    from pipeline.demo_config import DemoConfig, load_demo_config

    default = DemoConfig().runtime
    cfg = load_demo_config(None, ["runtime.llm.backend=vllm", "runtime.llm.kv_cache_gib=1"], max_steps=3)
    assert cfg.runtime.llm.backend == "vllm" and cfg.runtime.llm.kv_cache_gib == 1.0
    assert cfg.runtime.llm.dtype == default.llm.dtype == "float32"
    assert cfg.runtime.loop.max_steps == 3
    assert (cfg.runtime.loop.top_k, cfg.runtime.loop.step_max_tokens) == (default.loop.top_k, default.loop.step_max_tokens)
    assert cfg.runtime.retriever == default.retriever
