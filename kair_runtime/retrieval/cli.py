"""`kair index build` and `kair index serve`: a typer sub-app the main CLI mounts as `index`.

    kair index build --corpus corpus.jsonl --out index/ --retriever dense --encoder minilm
    kair index build --corpus corpus.jsonl --out index/ --index-factory "IVF4096,PQ64"
    kair index serve --index index/ --port 8000

Errors in the input (a bad corpus line, an unknown option for the kind) print one line and exit 2,
as user errors do in every kair command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from kair_runtime.errors import USER_ERRORS, os_error_line

index_app = typer.Typer(help="Build and serve retrieval indexes.", no_args_is_help=True)


def _fail(e: Exception | str) -> None:
    # Both commands also catch any ValueError: an option the index kind does not take, a bad faiss
    # --index-factory or --shard-size, and an encoder that does not fit the index are ValueErrors
    # (tests/kair_runtime/retrieval/test_retrieval_cli.py: "do not apply to a bm25 index").
    message = e.args[0] if isinstance(e, KeyError) and e.args else e
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@index_app.command()
def build(
    corpus: Annotated[Path, typer.Option(help="jsonl of {id, title, text} or FlashRAG {id, contents}.")],
    out: Annotated[Path, typer.Option(help="The index dir to write (created if missing).")],
    retriever: Annotated[str, typer.Option(help="dense | bm25")] = "dense",
    encoder: Annotated[Optional[str], typer.Option(help="dense: a sentence-transformers name or path; "
                                                        "'minilm' is the offline MiniLM. [default: minilm]")] = None,
    index_factory: Annotated[Optional[str], typer.Option(help="dense: a faiss index_factory string, "
                                                              "e.g. Flat, IVF4096,PQ64, HNSW32. [default: Flat]")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="dense: passages per encoder batch.")] = None,
    device: Annotated[Optional[str], typer.Option(help="dense: cpu | cuda | cuda:N.")] = None,
    shard_size: Annotated[Optional[int], typer.Option(help="dense: passages per resumable embedding shard.")] = None,
    keep_shards: Annotated[Optional[bool], typer.Option(help="dense: keep the embedding shards "
                                                             "(reruns skip them) [default: keep]")] = None,
) -> None:
    """Build an index dir: the index, the passages and manifest.json."""
    from kair_runtime.retrieval.indexing import build_index
    from kair_runtime.retrieval.store import Manifest, describe

    try:
        path = build_index(corpus, out, retriever, encoder=encoder, index_factory=index_factory,
                           batch_size=batch_size, device=device, shard_size=shard_size, keep_shards=keep_shards)
    except (*USER_ERRORS, ValueError) as e:
        _fail(e)
    except OSError as e:  # --out a file, read-only or on a full disk
        _fail(os_error_line(e, out, "--out"))
    typer.echo(json.dumps(describe(Manifest.read(path)), indent=2))
    typer.echo(f"index written to {path}")


@index_app.command()
def serve(
    index: Annotated[Path, typer.Option(help="An index dir from `kair index build`.")],
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind; 0.0.0.0 exposes it to the network.")] = "127.0.0.1",
    encoder: Annotated[Optional[str], typer.Option(help="dense: the query encoder [default: the manifest's]")] = None,
    nprobe: Annotated[Optional[int], typer.Option(help="dense IVF: lists searched per query.")] = None,
    device: Annotated[Optional[str], typer.Option(help="dense: cpu | cuda | cuda:N.")] = None,
) -> None:
    """Serve an index dir over HTTP: POST /search {"queries": [...], "k": k}."""
    from kair_runtime.config import TCP_PORT, check_range
    from kair_runtime.retrieval.indexing import open_index
    from kair_runtime.retrieval.remote import serve_retriever

    try:
        check_range(port, TCP_PORT, "--port")
        retriever = open_index(index, encoder=encoder, nprobe=nprobe, device=device)
    except (*USER_ERRORS, ValueError) as e:
        _fail(e)
    try:
        serve_retriever(retriever, host, port, ready=lambda bound: typer.echo(
            f"serving {retriever.name} index {index} on http://{host}:{bound}/search (Ctrl-C stops)"))
    except OSError as e:  # the address is taken or not this machine's
        _fail(f"cannot serve on {host}:{port}: {e.strerror or e}")
