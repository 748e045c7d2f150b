"""`kair corpus ...`: build closed retrieval corpora from the benchmarks (mounted by kair_runtime.cli
through the `kair.commands` entry point).

    kair corpus build --dataset musique --split dev --out corpus.jsonl
    kair corpus build --dataset 2wiki --extra ../shared/data/2wikimultihopqa/corpus_6119.json --out 2wiki.jsonl
    kair corpus build --dataset hotpotqa:dev --dataset musique:train --out union.jsonl
"""

from __future__ import annotations

import typer

from eval.corpus import build_corpus
from eval.specs import parse_dataset_arg
from kair_runtime.errors import USER_ERRORS, os_error_line

corpus_app = typer.Typer(help="Build closed retrieval corpora from benchmark paragraphs.", no_args_is_help=True)


@corpus_app.callback()
def corpus() -> None:
    """Build closed retrieval corpora from benchmark paragraphs."""
    # A callback keeps `build` a subcommand even while it is the only one (typer would
    # otherwise collapse a one-command app into that command).


@corpus_app.command("build")
def build(
    dataset: list[str] = typer.Option([], "--dataset", "-d",
                                      help="NAME or NAME:SPLIT or NAME:FILE; repeat for a union."),
    split: str = typer.Option("dev", help="Split for datasets given without one."),
    extra: list[str] = typer.Option([], "--extra", help="A paragraph file ({title,text} JSON array or jsonl); repeatable."),
    out: str = typer.Option(..., "--out", "-o", help="The corpus jsonl to write ({id, title, text})."),
) -> None:
    """Union of the benchmarks' paragraphs, deduplicated, with content-hash ids."""
    if not dataset and not extra:
        raise typer.BadParameter("give at least one --dataset or --extra")
    sources = [parse_dataset_arg(d, split) for d in dataset]
    try:
        stats = build_corpus(sources, extra, out)
    except (*USER_ERRORS, ValueError) as e:  # + a loader's ValueError on a malformed input file
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    except OSError as e:  # --out a folder, under a file, read-only or on a full disk
        typer.echo(f"error: {os_error_line(e, out, '--out')}", err=True)
        raise typer.Exit(2)
    for label, n in stats.sources.items():
        typer.echo(f"  {label}: {n} paragraphs")
    for note in stats.notes:
        typer.echo(f"  note: {note}")
    typer.echo(f"read {stats.read}, unique {stats.unique}, written {stats.written} -> {stats.out}")
