"""Dense retrieval: a sentence-transformers encoder over a faiss inner-product index.

Build (`build_dense_index`, what `kair index build --retriever dense` runs):

    corpus.jsonl -> passages.jsonl (+ offsets) -> shards/00000.npy, 00001.npy, ... -> index.faiss

Embeddings are written shard by shard, each with a small json naming what it was computed from
(row count, a hash of its passages' bytes, the encoder), so a rerun after a crash, or after
appending to the corpus, only encodes the shards that are missing or stale. The index type is any
faiss index_factory string: "Flat" is exact; IVF and PQ variants are trained on a sample first.
Loading memory-maps the index file, so a served index is not copied into RAM a second time.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kair_runtime.config import RetrieverConfig
from kair_runtime.records import Passage, ScoredPassage
from kair_runtime.retrieval.base import CorpusError, iter_corpus, load_corpus
from kair_runtime.retrieval.encoders import Encoder, EncoderError, same_encoder
from kair_runtime.retrieval.store import (MANIFEST, SHARD_DIR, IndexDirError, Manifest, PassageStore, atomic_save_npy,
                                          atomic_write_text, now_iso, passage_text, tmp_path,
                                          unique_passages, write_passages)

INDEX_FILE = "index.faiss"
DEFAULT_SHARD_SIZE = 100_000
MIN_TRAIN_SIZE = 100_000  # IVF/PQ training sample floor; raised to 64 points per IVF list


# ---------------------------------------------------------------- faiss helpers

def make_faiss_index(chunks: Sequence[np.ndarray], index_factory: str = "Flat",
                     train_size: int | None = None, seed: int = 0) -> Any:
    """An inner-product faiss index over the rows of `chunks` (arrays or memory-mapped shards),
    trained on a random sample of them when the index type needs training."""
    import faiss

    if not chunks or sum(len(c) for c in chunks) == 0:
        raise CorpusError("cannot build a dense index over zero passages")
    dim = int(chunks[0].shape[1])
    try:
        index = faiss.index_factory(dim, index_factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"index_factory {index_factory!r} is not a valid faiss index_factory string "
                         f"for dim {dim} (e.g. 'Flat', 'IVF4096,PQ64', 'HNSW32'): {_faiss_message(e)}") from None
    if not index.is_trained:
        _skip_polysemous_training(index)
        sample = _training_sample(chunks, train_size or _default_train_size(index), seed)
        try:
            index.train(sample)
        except RuntimeError as e:
            raise ValueError(f"cannot train {index_factory!r} on {len(sample)} vectors: {_faiss_message(e)}; "
                             f"use fewer IVF lists or 'Flat' for a corpus this small") from None
    for chunk in chunks:
        index.add(np.ascontiguousarray(chunk, dtype=np.float32))  # one shard in RAM at a time
    return index


def _skip_polysemous_training(index: Any) -> None:
    """PQ indexes from index_factory also learn a code permutation for Hamming filtering, which
    search never uses here and which costs several times the PQ training itself."""
    import faiss

    for part in (index, faiss.try_extract_index_ivf(index)):
        if part is not None and hasattr(part, "do_polysemous_training"):
            part.do_polysemous_training = False


def _default_train_size(index: Any) -> int:
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    return max(MIN_TRAIN_SIZE, 64 * ivf.nlist) if ivf is not None else MIN_TRAIN_SIZE


def _training_sample(chunks: Sequence[np.ndarray], size: int, seed: int) -> np.ndarray:
    total = sum(len(c) for c in chunks)
    if size >= total:
        return np.ascontiguousarray(np.concatenate([np.asarray(c) for c in chunks]), dtype=np.float32)
    rows = np.sort(np.random.default_rng(seed).choice(total, size, replace=False))
    parts, start = [], 0
    for c in chunks:
        mine = rows[(rows >= start) & (rows < start + len(c))] - start
        parts.append(np.asarray(c[mine]))
        start += len(c)
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


def _faiss_message(e: Exception) -> str:
    # faiss errors carry a C++ location line; the last line says what went wrong.
    return str(e).strip().splitlines()[-1]


def write_faiss_index(index: Any, path: Path) -> None:
    import faiss

    tmp = tmp_path(path)
    faiss.write_index(index, str(tmp))
    tmp.replace(path)


def read_faiss_index(path: Path) -> Any:
    """Memory-map the index: IO_FLAG_MMAP_IFC maps flat codes and inverted lists alike (faiss >=
    1.9); IO_FLAG_MMAP maps IVF lists on older versions; other types are read into RAM."""
    import faiss

    if not path.exists():
        raise IndexDirError(f"{path} is missing; rebuild the index dir")
    for flag in (getattr(faiss, "IO_FLAG_MMAP_IFC", None), faiss.IO_FLAG_MMAP):
        if flag is None:
            continue
        try:
            return faiss.read_index(str(path), flag)
        except RuntimeError:
            continue
    return faiss.read_index(str(path))


def set_nprobe(index: Any, nprobe: int) -> None:
    import faiss

    if faiss.try_extract_index_ivf(index) is not None:
        faiss.ParameterSpace().set_index_parameter(index, "nprobe", nprobe)


# ---------------------------------------------------------------- resumable shards

def _shard_key(store: PassageStore, lo: int, hi: int, encoder: Encoder) -> dict[str, Any]:
    """What a shard's embeddings depend on; a shard whose key differs is re-encoded."""
    return {"rows": hi - lo, "dim": encoder.dim, "encoder": encoder.name,
            "passage_instruction": encoder.passage_instruction,
            "sha1": hashlib.sha1(store.raw(lo, hi)).hexdigest()}


def _shard_done(npy: Path, key: dict[str, Any]) -> bool:
    meta = npy.with_suffix(".json")
    if not (npy.exists() and meta.exists()):
        return False
    try:
        if json.loads(meta.read_text(encoding="utf-8")) != key:
            return False
        return np.load(npy, mmap_mode="r").shape == (key["rows"], key["dim"])
    except (ValueError, OSError):  # a truncated or foreign file: encode it again
        return False


def encode_shards(store: PassageStore, shard_dir: Path, encoder: Encoder,
                  shard_size: int = DEFAULT_SHARD_SIZE) -> list[Path]:
    """Embed the store's passages into shard_dir/NNNNN.npy, skipping shards already done."""
    from tqdm import tqdm

    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    shard_dir.mkdir(parents=True, exist_ok=True)
    n = len(store)
    bounds = [(lo, min(lo + shard_size, n)) for lo in range(0, n, shard_size)]
    paths = [shard_dir / f"{i:05d}.npy" for i in range(len(bounds))]
    keys = [_shard_key(store, lo, hi, encoder) for lo, hi in bounds]
    done = [_shard_done(p, k) for p, k in zip(paths, keys)]
    skipped = sum(hi - lo for (lo, hi), d in zip(bounds, done) if d)
    with tqdm(total=n, initial=skipped, desc="encode passages", unit="passage") as bar:
        for (lo, hi), path, key, is_done in zip(bounds, paths, keys, done):
            if is_done:
                continue
            # Order matters for crash safety: drop the old array, then the key, then the new array.
            path.unlink(missing_ok=True)
            emb = encoder.encode_passages([passage_text(store[j]) for j in range(lo, hi)], progress=bar)
            atomic_write_text(path.with_suffix(".json"), json.dumps(key))
            atomic_save_npy(path, emb)
    for stale in set(shard_dir.glob("*.npy")) - set(paths):  # the corpus shrank since last time
        stale.unlink()
        stale.with_suffix(".json").unlink(missing_ok=True)
    return paths


# ---------------------------------------------------------------- build

def build_dense_index(corpus: str | Path, out_dir: str | Path, *, encoder: str | Encoder = "minilm",
                      index_factory: str = "Flat", batch_size: int = 64, device: str = "cpu",
                      query_instruction: str | None = None, shard_size: int = DEFAULT_SHARD_SIZE,
                      keep_shards: bool = True, train_size: int | None = None) -> Path:
    """Encode a jsonl corpus into an index dir; rerunning after a crash resumes from the shards.
    keep_shards=False deletes the embeddings once the index is written (they double the disk)."""
    corpus, out = Path(corpus), Path(out_dir)
    if not corpus.is_file():
        raise CorpusError(f"corpus not found: {corpus}")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # unfinished until the new manifest is written
    count = write_passages(unique_passages(iter_corpus(corpus), str(corpus)), out)
    if count == 0:
        raise CorpusError(f"{corpus}: the corpus has no passages")
    enc = encoder if isinstance(encoder, Encoder) else Encoder(encoder, device, batch_size, query_instruction)
    shards = encode_shards(PassageStore(out), out / SHARD_DIR, enc, shard_size)
    index = make_faiss_index([np.load(p, mmap_mode="r") for p in shards], index_factory, train_size)
    write_faiss_index(index, out / INDEX_FILE)
    Manifest(kind="dense", count=count, corpus=str(corpus.resolve()), created=now_iso(), encoder=enc.name,
             dim=enc.dim, normalized=True, metric="inner_product", index_factory=index_factory,
             query_instruction=enc.query_instruction, passage_instruction=enc.passage_instruction).write(out)
    if not keep_shards:
        shutil.rmtree(out / SHARD_DIR)
    return out


# ---------------------------------------------------------------- retriever

class DenseRetriever:
    name = "dense"

    def __init__(self, index: Any, passages: Sequence[Passage], encoder: Encoder, nprobe: int = 32):
        if index.ntotal != len(passages):
            raise IndexDirError(f"the faiss index holds {index.ntotal} vectors but there are "
                                f"{len(passages)} passages; rebuild the index")
        self.index = index
        self.passages = passages
        self.encoder = encoder
        set_nprobe(index, nprobe)

    @classmethod
    def from_passages(cls, passages: list[Passage], encoder: Encoder, index_factory: str = "Flat",
                      nprobe: int = 32, where: str = "corpus") -> "DenseRetriever":
        """Build in memory (no files): for small corpora such as the demo one."""
        from tqdm import tqdm

        if not passages:
            raise CorpusError(f"{where}: the corpus has no passages")
        with tqdm(total=len(passages), desc="encode passages", unit="passage") as bar:
            emb = encoder.encode_passages([passage_text(p) for p in passages], progress=bar)
        return cls(make_faiss_index([emb], index_factory), passages, encoder, nprobe)

    @classmethod
    def load(cls, index_dir: str | Path, encoder: str | Encoder | None = None, nprobe: int = 32,
             device: str = "cpu", batch_size: int = 64,
             query_instruction: str | None = None) -> "DenseRetriever":
        """Open an index dir; `encoder` (a name or a loaded Encoder) must match the manifest's."""
        index_dir = Path(index_dir)
        manifest = Manifest.read(index_dir)
        manifest.expect_kind("dense", index_dir)
        built_with = str(manifest.encoder)
        wanted = encoder.name if isinstance(encoder, Encoder) else (encoder or built_with)
        if not same_encoder(built_with, wanted):
            raise EncoderError(f"{index_dir} was built with encoder {built_with!r} but the retriever asks "
                               f"for {wanted!r}; set retriever.encoder: {built_with} or rebuild the index")
        if not isinstance(encoder, Encoder):
            instruction = manifest.query_instruction if query_instruction is None else query_instruction
            encoder = Encoder(wanted, device, batch_size, instruction)
        if encoder.dim != manifest.dim:
            raise EncoderError(f"{index_dir}: the index has dim {manifest.dim}, encoder {wanted!r} gives {encoder.dim}")
        return cls(read_faiss_index(index_dir / INDEX_FILE), PassageStore(index_dir), encoder, nprobe)

    @classmethod
    def from_config(cls, cfg: RetrieverConfig, encoder: Encoder | None = None) -> "DenseRetriever":
        """`encoder`: one already loaded with cfg's settings (shared by several retrievers)."""
        if cfg.index_dir:
            return cls.load(cfg.index_dir, encoder or cfg.encoder, cfg.nprobe, cfg.device, cfg.batch_size,
                            cfg.query_instruction)
        corpus = cfg.corpus or _demo_corpus()
        encoder = encoder or Encoder(cfg.encoder, cfg.device, cfg.batch_size, cfg.query_instruction)
        return cls.from_passages(load_corpus(corpus), encoder, cfg.index_factory, cfg.nprobe, str(corpus))

    def search(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        """One encode call and one faiss search for the whole batch; blank queries get []."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        results: list[list[ScoredPassage]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]
        if not live:
            return results
        scores, ids = self.index.search(self.encoder.encode_queries([queries[i] for i in live]),
                                        min(k, self.index.ntotal))
        for row, i in enumerate(live):
            # faiss pads with id -1 when an IVF probe finds fewer than k vectors
            results[i] = [_scored(self.passages[int(j)], float(s)) for j, s in zip(ids[row], scores[row]) if j >= 0]
        return results


def _scored(p: Passage, score: float) -> ScoredPassage:
    return ScoredPassage(id=p.id, title=p.title, text=p.text, score=score)


def _demo_corpus() -> Path:
    from kair_runtime.demo_data import demo_corpus_path

    return demo_corpus_path()
