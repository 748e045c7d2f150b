"""python bench/retrieval_memory.py [--queries 300] [--nlist 256] [--pq-m 96] [--nprobe 32] [--work-dir DIR]

Index memory at paper scale. wiki-18 (21M passages) under bge-large (1024-dim) is 86 GB as a flat
float32 index; IVF-PQ must bring it under 8 GB. This builds, on the paragraphs of ../shared/data
(2Wiki corpus_6119.json, HotpotQA contexts, MuSiQue paragraphs; deduplicated by (title, text)),
a flat index with `build_dense_index` (MiniLM, 384-dim) and an IVF-PQ index from the same
embedding shards, then prints:

  - bytes per passage of each, measured from the serialized index;
  - the projection to 21M x 1024-dim: flat, and IVF-PQ with the same dimensions per code byte
    (PQ96 on 384 dims is 4 dims/byte, i.e. PQ256 on 1024 dims);
  - recall@5 of IVF-PQ against flat (mean overlap of the top-5 ids) on the benchmark questions.

Encoding the ~17k passages dominates the runtime: about 3-4 minutes on 2 CPU cores with
passages truncated to 64 tokens (--max-seq-length; both indexes hold the same embeddings, so
the comparison is unaffected). Pass --work-dir to keep the embedding shards, so a rerun
(other --pq-m / --nlist / --nprobe) skips encoding.
KAIR_SHARED_DATA overrides where the data is read from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kair_runtime.records import Passage
from kair_runtime.retrieval.dense import DenseRetriever, build_dense_index, make_faiss_index, set_nprobe
from kair_runtime.retrieval.encoders import Encoder

WIKI18_PASSAGES = 21_015_324  # DPR's psgs_w100 (wiki-18), the paper's HotpotQA-scale corpus
TARGET_DIM = 1024  # bge-large
BUDGET_BYTES = 8e9
TARGET_NLIST = 65536  # IVF lists for 21M vectors (~320 per list)


def shared_data() -> Path:
    default = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
    return Path(os.environ.get("KAIR_SHARED_DATA", default))


def read_records(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]
    return json.loads(path.read_text(encoding="utf-8"))


def paragraphs(data: Path) -> list[tuple[str, str]]:
    """(title, text) of every benchmark paragraph, in file order, deduplicated."""
    pairs: list[tuple[str, str]] = [(d["title"], d["text"]) for d in read_records(data / "2wikimultihopqa/corpus_6119.json")]
    for name in ("hotpotqa/dev_distractor_500.jsonl", "hotpotqa/train_100.json"):
        for rec in read_records(data / name):
            pairs += [(title, "".join(sentences)) for title, sentences in rec["context"]]
    for name in ("musique/ans_dev_200.jsonl", "musique/train_100.json"):
        for rec in read_records(data / name):
            pairs += [(p["title"], p["paragraph_text"]) for p in rec["paragraphs"]]
    return list(dict.fromkeys(pairs))


def questions(data: Path, n: int) -> list[str]:
    """Up to n dev questions, taken in turn from HotpotQA, MuSiQue and 2Wiki."""
    per_set = [[r["question"] for r in read_records(data / name)] for name in
               ("hotpotqa/dev_distractor_500.jsonl", "musique/ans_dev_200.jsonl", "2wikimultihopqa/dev_164.jsonl")]
    mixed = [q for group in zip(*per_set) for q in group] + per_set[0][len(per_set[2]):]
    return mixed[:n]


def gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.2f} GB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--nlist", type=int, default=256, help="IVF lists for the benchmark corpus")
    ap.add_argument("--pq-m", type=int, default=96, help="PQ bytes per vector (must divide 384)")
    ap.add_argument("--nprobe", type=int, default=32)
    ap.add_argument("--max-seq-length", type=int, default=64, help="encoder truncation, in tokens")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep the index dir here (reruns skip encoding)")
    args = ap.parse_args()

    data = shared_data()
    if not (data / "2wikimultihopqa/corpus_6119.json").exists():
        sys.exit(f"benchmark data not found under {data}; set KAIR_SHARED_DATA")
    pairs = paragraphs(data)
    queries = questions(data, args.queries)
    tmp = None if args.work_dir else tempfile.TemporaryDirectory(prefix="kair-bench-")
    work = args.work_dir or Path(tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.jsonl"
    with corpus.open("w", encoding="utf-8") as f:
        for i, (title, text) in enumerate(pairs):
            f.write(json.dumps(vars(Passage(f"p{i}", title, text)), ensure_ascii=False) + "\n")
    print(f"corpus: {len(pairs)} unique paragraphs; {len(queries)} questions; work dir {work}")

    encoder = Encoder("minilm", batch_size=64, max_seq_length=args.max_seq_length)
    t0 = time.time()
    index_dir = build_dense_index(corpus, work / "flat", encoder=encoder, index_factory="Flat", shard_size=4096)
    build_s = time.time() - t0
    flat = DenseRetriever.load(index_dir, encoder=encoder)
    shards = [np.load(p, mmap_mode="r") for p in sorted((index_dir / "shards").glob("*.npy"))]
    t0 = time.time()
    factory = f"IVF{args.nlist},PQ{args.pq_m}"
    ivfpq = DenseRetriever(make_faiss_index(shards, factory), flat.passages, encoder, args.nprobe)
    train_s = time.time() - t0

    import faiss

    n, dim = flat.index.ntotal, encoder.dim
    flat_bytes = (index_dir / "index.faiss").stat().st_size
    pq_bytes = len(faiss.serialize_index(ivfpq.index))
    # What does not grow with the corpus: coarse centroids and PQ codebooks (256 centroids each).
    pq_fixed = args.nlist * dim * 4 + 256 * dim * 4
    pq_per_passage = (pq_bytes - pq_fixed) / n  # the PQ code plus the 8-byte id of the inverted list

    t0 = time.time()
    set_nprobe(ivfpq.index, args.nprobe)
    exact = flat.search(queries, 5)
    approx = ivfpq.search(queries, 5)
    search_s = time.time() - t0
    recall = np.mean([len({p.id for p in a} & {p.id for p in e}) / len(e) for a, e in zip(approx, exact) if e])

    print(f"\nencode + flat build: {build_s:.0f}s ({n / max(build_s, 1e-9):.0f} passages/s); "
          f"{factory} train + add: {train_s:.1f}s; {2 * len(queries)} searches: {search_s:.1f}s")
    print(f"\nmeasured on {n} passages x {dim} dims:")
    print(f"  Flat          {flat_bytes / n:8.1f} bytes/passage  ({flat_bytes / 1e6:.1f} MB serialized)")
    print(f"  {factory:13s} {pq_bytes / n:8.1f} bytes/passage  ({pq_bytes / 1e6:.1f} MB serialized; "
          f"{pq_per_passage:.1f} per passage + {pq_fixed / 1e6:.2f} MB centroids/codebooks)")
    print(f"  recall@5 of {factory} (nprobe {args.nprobe}) vs Flat: {recall:.3f} over {len(queries)} questions")

    target_m = args.pq_m * TARGET_DIM // dim  # same dims per code byte as measured
    flat_proj = WIKI18_PASSAGES * (flat_bytes / n) * TARGET_DIM / dim
    overhead = pq_per_passage - args.pq_m  # id bytes per passage, independent of dim
    print(f"\nprojected to wiki-18: {WIKI18_PASSAGES:,} passages x {TARGET_DIM} dims "
          f"(IVF{TARGET_NLIST} centroids: {gb(TARGET_NLIST * TARGET_DIM * 4)})")
    print(f"  Flat                 {gb(flat_proj)}")
    for m in sorted({64, 128, target_m, 256}):
        proj = WIKI18_PASSAGES * (m + overhead) + TARGET_NLIST * TARGET_DIM * 4 + 256 * TARGET_DIM * 4
        mark = "fits" if proj < BUDGET_BYTES else "over"
        measured = "  <- the recall measured above" if m == target_m else ""
        print(f"  IVF{TARGET_NLIST},PQ{m:<4d}     {gb(proj)}  ({mark} 8 GB; {TARGET_DIM / m:.0f} dims/byte){measured}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
