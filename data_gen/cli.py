"""`kair datagen ...`: teacher trajectories, filtering, SFT data, silver trajectories, index quality.

    kair datagen generate --config configs/datagen/teacher-qwen2.5-7b-vllm.yaml --shard 0 --num-shards 4
    kair datagen filter runs/datagen/teacher --out runs/datagen/filtered --best-k 2
    kair datagen to-sft runs/datagen/filtered --out runs/datagen/sft
    kair datagen silver --config configs/datagen/silver.yaml
    kair datagen relabel runs/datagen/teacher --datasets hotpotqa:train --out runs/datagen/relabelled
    kair datagen quality runs/datagen/silver

Every command takes `--config FILE` (a dataclass config: an unknown key is an error) and
`--set key=value` overrides; explicit flags win over both. Mounted as `kair datagen` through
the `kair.commands` entry point; `python -m data_gen.cli` runs it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from data_gen.filter import FilterConfig, print_report, run_filter
from data_gen.quality import QualityConfig, assess_quality, print_quality, write_quality
from data_gen.sft import SFTDataConfig, build_sft
from data_gen.relabel import RelabelConfig, relabel
from data_gen.silver import SilverConfig, silver, silver_counts
from data_gen.store import read_trajectories
from data_gen.teacher import GenerateConfig, generate
from eval.specs import TrainSet, dataset_entries
from kair_runtime.config import ConfigError, load_config
from kair_runtime.errors import USER_ERRORS, os_error_line

datagen_app = typer.Typer(help="Distillation data: teacher trajectories, filtering, SFT examples, silver data.",
                          no_args_is_help=True, pretty_exceptions_enable=False)

CONFIG = typer.Option(None, "--config", "-c", help="A configs/datagen/*.yaml file.")
SET = typer.Option([], "--set", help="Override a config key: --set runtime.loop.max_steps=3")


def datasets_flag(arg: str | None) -> list[dict] | None:
    """`hotpotqa:train,musique,2wiki:data/x.json` -> dataset entries (split "train" when not given)."""
    return None if arg is None else dataset_entries(arg, TrainSet)


def _fail(e: Exception | str) -> None:
    # Every datagen command catches ValueError on top of USER_ERRORS: its inputs are the user's own
    # trajectory files, so a bad value read from one is the user's to fix, and to-sft's SFTError
    # (trajectories made with other prompts, nothing left to convert) is a plain ValueError.
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


def _fail_output(e: OSError, out: str | Path | None) -> None:
    # An output folder the OS refuses (a file in its place, read-only, a full disk), named as --out.
    _fail(os_error_line(e, out, "--out") if out else e)


@datagen_app.command("generate")
def generate_cmd(
    config: Optional[str] = CONFIG,
    set_: list[str] = SET,
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder (default runs/datagen/teacher)."),
    shard: Optional[int] = typer.Option(None, help="This machine's shard, 0-based."),
    num_shards: Optional[int] = typer.Option(None, help="How many machines split the questions."),
    datasets: Optional[str] = typer.Option(None, help="Comma-separated NAME[:SPLIT|:FILE] training sets."),
    limit: Optional[int] = typer.Option(None, help="The first N questions of every training set."),
    progress: bool = typer.Option(True, help="Show the progress bar."),
    retry_failed: bool = typer.Option(False, "--retry-failed",
                                      help="Also rerun the trajectories recorded as failed (e.g. a backend "
                                           "outage), replacing them in place."),
) -> None:
    """Run the teacher through the KAIR loop over the training questions (resumable)."""
    cfg = None
    try:
        cfg = load_config(GenerateConfig, config, set_, {"out_dir": out, "shard": shard, "num_shards": num_shards,
                                                  "datasets": datasets_flag(datasets)})
        if limit is not None:
            for spec in cfg.datasets:
                spec.limit = limit
        result = generate(cfg, progress=progress, retry_failed=retry_failed)
    except (*USER_ERRORS, ValueError) as e:
        _fail(e)
    except OSError as e:  # resuming later is safe: the trajectories written so far are whole
        _fail_output(e, cfg and cfg.out_dir)
    new = result.written - result.retried
    retried = f", {result.retried} failed ones retried" if result.retried else ""
    hint = "; rerun with --retry-failed to run them again" if result.failed else ""
    typer.echo(f"{result.existing + new} / {result.total} trajectories in {result.path} "
               f"({new} written now, {result.existing} already there{retried}); "
               f"{result.failed} failed{hint}")


@datagen_app.command("filter")
def filter_cmd(
    trajectories: Optional[str] = typer.Argument(None, help="A trajectory folder or jsonl file."),
    config: Optional[str] = CONFIG,
    set_: list[str] = SET,
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder (default runs/datagen/filtered)."),
    min_f1: Optional[float] = typer.Option(None, help="Keep answers with token F1 >= this (default 1.0)."),
    best_k: Optional[int] = typer.Option(None, help="At most k trajectories per question."),
    max_step_tokens: Optional[int] = typer.Option(None, help="Completion budget per step (default: as recorded)."),
    merge_with: list[str] = typer.Option([], "--merge-with", help="Trajectories read first (e.g. silver); repeatable."),
    dedupe_paths: Optional[bool] = typer.Option(None, "--dedupe-paths", help="One per question and retrieval path."),
) -> None:
    """Keep correct, well-formed trajectories; print and write a report."""
    cfg = None
    try:
        cfg = load_config(FilterConfig, config, set_, {"trajectories": trajectories, "out_dir": out, "min_f1": min_f1,
                                                "best_k": best_k, "max_step_tokens": max_step_tokens,
                                                "merge_with": merge_with or None, "dedupe_paths": dedupe_paths})
        report = run_filter(cfg)
    except (*USER_ERRORS, ValueError) as e:
        _fail(e)
    except OSError as e:
        _fail_output(e, cfg and cfg.out_dir)
    print_report(report)
    typer.echo(f"kept.jsonl, report.json, report.md -> {cfg.out_dir}")


@datagen_app.command("to-sft")
def to_sft_cmd(
    trajectories: Optional[str] = typer.Argument(None, help="Filtered trajectories (a filter output folder)."),
    config: Optional[str] = CONFIG,
    set_: list[str] = SET,
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder (default runs/datagen/sft)."),
    validation_fraction: Optional[float] = typer.Option(None, help="Share of questions held out (default 0.05)."),
    seed: Optional[int] = typer.Option(None, help="Seed of the train/validation split."),
    prompt_source: Optional[str] = typer.Option(None, help="canonical | recorded"),
) -> None:
    """Turn trajectories into chat examples: messages jsonl, a DatasetDict and a dataset card."""
    cfg = None
    try:
        cfg = load_config(SFTDataConfig, config, set_, {"trajectories": trajectories, "out_dir": out, "seed": seed,
                                                 "validation_fraction": validation_fraction,
                                                 "prompt_source": prompt_source})
        stats = build_sft(cfg)
    except (*USER_ERRORS, ValueError) as e:
        _fail(e)
    except OSError as e:
        _fail_output(e, cfg and cfg.out_dir)
    for name, sp in stats["splits"].items():
        typer.echo(f"{name}: {sp['examples']} examples from {sp['questions']} questions {sp['by_kind']}")
    if stats["skipped_not_reproducible"]:
        typer.echo(f"skipped {len(stats['skipped_not_reproducible'])} trajectories (see stats.json)")
    typer.echo(f"train.jsonl, validation.jsonl, dataset/, README.md -> {cfg.out_dir}")


@datagen_app.command("silver")
def silver_cmd(
    config: Optional[str] = CONFIG,
    set_: list[str] = SET,
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder (default runs/datagen/silver)."),
    datasets: Optional[str] = typer.Option(None, help="Comma-separated NAME[:SPLIT|:FILE], e.g. musique,2wiki:dev"),
    limit: Optional[int] = typer.Option(None, help="The first N questions of every dataset."),
    index_format: Optional[str] = typer.Option(None, help="kr | text | keywords | facts | kf | none"),
) -> None:
    """Trajectories from gold annotations with real retrieval (no LLM)."""
    cfg = None
    try:
        cfg = load_config(SilverConfig, config, set_, {"out_dir": out, "datasets": datasets_flag(datasets),
                                                "runtime.loop.index_format": index_format})
        if limit is not None:
            for spec in cfg.datasets:
                spec.limit = limit
        path, traces = silver(cfg)
    except (*USER_ERRORS, ValueError) as e:
        _fail(e)
    except OSError as e:
        _fail_output(e, cfg and cfg.out_dir)
    for name, c in silver_counts(traces).items():
        with_outcome = f", {c['outcomes']} with an outcome relation" if "outcomes" in c else ""
        typer.echo(f"{name}: {c['complete']} / {c['total']} complete{with_outcome}")
    typer.echo(f"{len(traces)} trajectories -> {path}")


@datagen_app.command("relabel")
def relabel_cmd(
    trajectories: Optional[str] = typer.Argument(None, help="A model's trajectories (a generate output folder)."),
    config: Optional[str] = CONFIG,
    set_: list[str] = SET,
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder (default runs/datagen/relabelled)."),
    datasets: Optional[str] = typer.Option(None, help="Comma-separated NAME[:SPLIT|:FILE]: the questions' gold."),
    corpus: Optional[str] = typer.Option(None, help="The passages the trajectories retrieved from."),
) -> None:
    """Label every step a model took with the step its question's gold chain implies (DAgger)."""
    cfg = None
    try:
        cfg = load_config(RelabelConfig, config, set_, {"trajectories": trajectories, "out_dir": out,
                                                 "datasets": datasets_flag(datasets), "corpus": corpus})
        stats = relabel(cfg)
    except (*USER_ERRORS, ValueError) as e:
        _fail(e)
    except OSError as e:
        _fail_output(e, cfg and cfg.out_dir)
    for name, d in stats["datasets"].items():
        skipped = {k.removeprefix("skipped: "): v for k, v in d.items() if k.startswith("skipped: ")}
        typer.echo(f"{name}: {d.get('relabelled', 0)} / {d['trajectories']} relabelled, skipped {skipped}; "
                   f"judgments {d['judgments']}")
    typer.echo(f"{stats['examples']} examples: examples.jsonl, stats.json -> {cfg.out_dir}")


@datagen_app.command("quality")
def quality_cmd(
    trajectories: Optional[str] = typer.Argument(None, help="A trajectory folder or jsonl file."),
    config: Optional[str] = CONFIG,
    set_: list[str] = SET,
    out: Optional[str] = typer.Option(None, "--out", "-o", help="quality.json path (default: in TRAJ_DIR)."),
) -> None:
    """Index quality: gold entity and triple recall, and the step the answer enters the index."""
    dest = None
    try:
        cfg = load_config(QualityConfig, config, set_, {"trajectories": trajectories, "out": out})
        if not cfg.trajectories:
            raise ConfigError("pass TRAJ_DIR or set `trajectories`")
        traces = read_trajectories(cfg.trajectories)
        report = assess_quality(traces)
        src = Path(cfg.trajectories)
        dest = Path(cfg.out) if cfg.out else (src if src.is_dir() else src.parent) / "quality.json"
        write_quality(report, dest)
    except (*USER_ERRORS, ValueError) as e:
        _fail(e)
    except OSError as e:
        _fail_output(e, dest)
    print_quality(report.rows)
    typer.echo(f"{dest.name}, {dest.with_suffix('.md').name} -> {dest.parent}")


if __name__ == "__main__":
    datagen_app()
