"""Build and open index dirs by kind: the plain-Python side of `kair index build` / `serve`.

    build_index("corpus.jsonl", "index/", kind="dense", encoder="minilm", index_factory="Flat")
    retriever = open_index("index/")   # the kind comes from index/manifest.json

Builders and loaders are registered by name as "module:attr", imported only when used, so
importing this module (and the CLI) loads neither faiss nor torch.
"""

from __future__ import annotations

import inspect
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from kair_runtime.retrieval.base import Retriever
from kair_runtime.retrieval.store import MANIFEST, SHARD_DIR, Manifest
from kair_runtime.registry import resolve
from kair_runtime.rundir import replaced_folder

BUILDERS: dict[str, str] = {
    "dense": "kair_runtime.retrieval.dense:build_dense_index",
    "bm25": "kair_runtime.retrieval.bm25:build_bm25_index",
}
LOADERS: dict[str, str] = {
    "dense": "kair_runtime.retrieval.dense:DenseRetriever.load",
    "bm25": "kair_runtime.retrieval.bm25:BM25Retriever.load",
}


def _check_options(fn: Callable[..., Any], kind: str, options: dict[str, Any]) -> None:
    """An option the kind does not take is an error, not silently ignored."""
    accepted = set(inspect.signature(fn).parameters)
    extra = sorted(set(options) - accepted)
    if extra:
        raise ValueError(f"option(s) {', '.join(extra)} do not apply to a {kind} index "
                         f"(it takes: {', '.join(sorted(accepted - {'corpus', 'out_dir', 'index_dir'})) or 'none'})")


def build_index(corpus: str | Path, out_dir: str | Path, kind: str = "dense", **options: Any) -> Path:
    """Build an index dir; options are the builder's keywords (dense: encoder, index_factory,
    batch_size, device, query_instruction, shard_size, keep_shards, train_size). None means default.
    The new index is built beside `out_dir` and replaces it only once complete: a failed or
    killed rebuild leaves the old index as it was (kair_runtime.rundir.replaced_folder)."""
    builder = resolve(BUILDERS, kind, "index kind")
    options = {k: v for k, v in options.items() if v is not None}
    _check_options(builder, kind, options)
    out = Path(out_dir)
    with replaced_folder(out, MANIFEST) as staging:
        shards = out / SHARD_DIR
        if shards.is_dir() and not (staging / SHARD_DIR).exists():
            # The old index's embeddings, hard-linked (no copy): the dense builder re-encodes
            # only the shards whose passages changed, as it did when it built in place.
            shutil.copytree(shards, staging / SHARD_DIR, copy_function=os.link)
        builder(corpus, staging, **options)
    return out


def open_index(index_dir: str | Path, **options: Any) -> Retriever:
    """Load any index dir as a Retriever; options go to the kind's loader (dense: encoder, nprobe,
    device, batch_size, query_instruction). None means the manifest's or the default."""
    kind = Manifest.read(index_dir).kind
    loader = resolve(LOADERS, kind, "index kind")
    options = {k: v for k, v in options.items() if v is not None}
    _check_options(loader, kind, options)
    return loader(index_dir, **options)
