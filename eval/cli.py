"""The eval package's commands (mounted by kair_runtime.cli through the `kair.commands` entry points):
`kair eval` runs eval/run.py's evaluation into a run folder and `kair eval compare` tables several;
`kair corpus build` builds closed retrieval corpora from the benchmarks (eval/corpus.py).

    kair eval --config configs/eval/smoke-cpu.yaml [--adapter PATH | --checkpoints DIR] [--datasets a,b]
    kair eval compare runs/eval/prompted runs/eval/tuned
    kair corpus build --dataset musique --split dev --out corpus.jsonl
    kair corpus build --dataset 2wiki --extra ../shared/data/2wikimultihopqa/corpus_6119.json --out 2wiki.jsonl
    kair corpus build --dataset hotpotqa:dev --dataset musique:train --out union.jsonl
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from eval.corpus import build_corpus
from eval.methods import METHODS
from eval.report import results_table
from eval.run import EvalConfig, read_summary, run_eval
from eval.specs import DatasetSpec, dataset_entries, parse_dataset_arg
from kair_runtime.config import config_data, from_dict
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


# ---------------------------------------------------------------- kair eval

eval_app = typer.Typer(help="Evaluate prompted and tuned models; compare runs.", no_args_is_help=False,
                       invoke_without_command=True)


@eval_app.callback()
def main(
    ctx: typer.Context,
    config: Optional[str] = typer.Option(None, "--config", "-c", help="A configs/eval/*.yaml file."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set runtime.loop.max_steps=3"),
    model: Optional[str] = typer.Option(None, help="Base model (hub name or path)."),
    adapter: Optional[str] = typer.Option(None, help="A LoRA adapter or checkpoint dir."),
    checkpoints: Optional[str] = typer.Option(None, help="Evaluate every checkpoint-* under this dir."),
    datasets: Optional[str] = typer.Option(None, help="Comma-separated NAME[:SPLIT|:FILE] (the dev split by default); "
                                                  "a bare name keeps the config's entry of that name."),
    methods: Optional[str] = typer.Option(None, help=f"Comma-separated: {', '.join(METHODS)}"),
    limit: Optional[int] = typer.Option(None, help="First N questions per dataset."),
    run_name: Optional[str] = typer.Option(None, help="Run folder name under out_dir."),
    out_dir: Optional[str] = typer.Option(None, help="Where run folders go (default runs/eval)."),
    retry_failed: bool = typer.Option(False, "--retry-failed",
                                      help="Also rerun the questions a previous run of this folder recorded as "
                                           "failed (e.g. a backend outage), replacing their records."),
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    if config is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)
    run_dir = None
    try:
        cfg = load_eval_config(config, set_, model=model, adapter=adapter, checkpoints=checkpoints,
                               datasets=datasets, methods=methods, limit=limit, run_name=run_name, out_dir=out_dir)
        run_dir = Path(cfg.out_dir) / (cfg.run_name or Path(config).stem)
        rows = run_eval(cfg, run_dir, retry_failed=retry_failed)
    except USER_ERRORS as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(2)
    except OSError as e:  # the run folder full, read-only or not a folder (resuming later is safe)
        typer.echo(f"error: {e if run_dir is None else os_error_line(e, run_dir, 'run folder')}", err=True)
        raise typer.Exit(2)
    datasets_seen = list(dict.fromkeys(r["dataset"] for r in rows))
    typer.echo(results_table(rows, datasets_seen))
    typer.echo(failures_line(rows))
    typer.echo(f"\nrun folder: {run_dir}  (results.md, summary.json, plots/)")


def failures_line(rows: list[dict]) -> str:
    """How many questions failed over the whole run (each scored 0), and how to rerun them."""
    failed = sum(r["summary"]["failed"] for r in rows)
    total = sum(r["summary"]["n"] for r in rows)
    if not failed:
        return f"failed: 0 of {total} question runs"
    where = ", ".join(f"{r['model']}/{r['dataset']}/{r['method']}: {r['summary']['failed']}"
                      for r in rows if r["summary"]["failed"])
    return (f"failed: {failed} of {total} question runs, scored 0 ({where}); "
            "rerun with --retry-failed to run them again")


def load_eval_config(path: str, overrides: list[str], **flags) -> EvalConfig:
    """The config file, then `--set`, then the flags given; `--datasets` keeps the configured
    entry of a bare name (so it is merged after the file and --set are read)."""
    datasets, methods = flags.pop("datasets", None), flags.pop("methods", None)
    keys = {"model": "runtime.llm.model", "adapter": "runtime.llm.adapter"}
    data = config_data(path, overrides, {keys.get(k, k): v for k, v in flags.items()}
                       | {"methods": methods.split(",") if methods is not None else None})
    if datasets is not None:
        data["datasets"] = dataset_entries(datasets, DatasetSpec, data.get("datasets") or [])
    return from_dict(EvalConfig, data)


@eval_app.command()
def compare(runs: list[str] = typer.Argument(..., help="Run folders to put in one table.")) -> None:
    """One table over several runs (e.g. prompted vs tuned, or every checkpoint)."""
    rows = []
    for run in runs:
        path = Path(run) / "summary.json"
        if not path.exists():
            typer.echo(f"error: {path} not found (is {run} a finished eval run?)", err=True)
            raise typer.Exit(2)
        try:
            summary = read_summary(path)
        except USER_ERRORS as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2)
        rows += [{**r, "model": f"{Path(run).name}: {r['model']}"} for r in summary]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    typer.echo(results_table(rows, datasets))
