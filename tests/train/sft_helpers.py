"""Helpers shared by the train tests (fixtures live in conftest.py)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY_CONFIG = ROOT / "configs" / "train" / "tiny-cpu.yaml"

# The models' own chat templates, byte for byte as their tokenizer_config.json ships them. TRL
# keeps exact copies (checked weekly against the Hub) for template detection; reading them from
# the installed package keeps them out of this repository. test_train_templates.py pins each
# one's rendering of a known conversation, so a changed file cannot pass silently.
REAL_TEMPLATE_FILES = {"qwen2": "qwen2_5.jinja", "llama": "llama3_1.jinja"}


def real_template(family: str) -> str:
    return (files("trl") / "chat_templates" / REAL_TEMPLATE_FILES[family]).read_text(encoding="utf-8")


def model_with_real_template(out_dir: Path, family: str, pad_is_eos: bool = False) -> Path:
    """The tiny random model of `family`, its tokenizer carrying the real Instruct template (no
    generation markers) and the real special-token layout. pad_is_eos reproduces the common
    Llama-3 setup `tokenizer.pad_token = tokenizer.eos_token`."""
    from transformers import AutoTokenizer

    from train.tiny_model import build_tiny_chat_model

    out = build_tiny_chat_model(out_dir, family=family)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = real_template(family)
    if pad_is_eos:
        tok.pad_token = tok.eos_token
    tok.save_pretrained(out)
    return out


def tiny_args(model_dir: Path, data_dir: Path, out_dir: Path, *flags: str):
    """configs/train/tiny-cpu.yaml with its paths replaced, through the real parser."""
    from train.sft import parse_args

    return parse_args(["--config", str(TINY_CONFIG), "--model_name_or_path", str(model_dir),
                       "--dataset_path", str(data_dir), "--output_dir", str(out_dir), *flags])
