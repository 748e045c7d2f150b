"""`kair train`, `kair merge` and `kair soup`: the training scripts behind the project's command.

    kair train --config configs/train/tiny-cpu.yaml --set max_steps=10 --set learning_rate=1e-3
    kair train --config configs/train/qwen2.5-7b-lora.yaml --accelerate-config configs/accelerate/deepspeed_zero2.yaml
    kair merge --base Qwen/Qwen2.5-7B-Instruct --adapter runs/train/qwen2.5-7b-lora --out runs/merged
    kair soup runs/demo/round-1/adapter runs/demo/round-2/adapter --out runs/soup

`kair train` runs train.sft's main in this process, or, given --accelerate-config, hands the same
arguments to `accelerate launch` (which starts one process per GPU). `--set key=value` overrides
any YAML key by name (and anything after `--` goes to the SFT parser as is). Both are plain
functions, mounted through the `kair.commands` entry-point group.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer


def set_to_flags(overrides: list[str]) -> list[str]:
    """`key=value` overrides -> the SFT parser's `--key value` flags."""
    flags = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{item!r} must look like key=value, e.g. learning_rate=1e-4", param_hint="--set")
        flags += [f"--{key.strip()}", value]
    return flags


def accelerate_command(config: str, accelerate_config: str, flags: list[str],
                       num_processes: int | None = None) -> list[str]:
    """The `accelerate launch` command line equivalent to `kair train` with these arguments."""
    script = Path(__file__).resolve().parent / "sft.py"
    count = ["--num_processes", str(num_processes)] if num_processes is not None else []
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", accelerate_config, *count,
            str(script), "--config", config, *flags]


def processes_for(accelerate_config: str, num_processes: int | None) -> int | None:
    """--num_processes for accelerate: the user's, else none where the config sets it, else one per
    visible GPU (the GPU configs leave it out so that no fixed count outruns the machine)."""
    import yaml

    if num_processes is not None:
        return num_processes
    path = Path(accelerate_config)
    if not path.is_file():
        raise typer.BadParameter(f"{path} not found", param_hint="--accelerate-config")
    if (yaml.safe_load(path.read_text()) or {}).get("num_processes") is not None:
        return None
    import torch

    return max(torch.cuda.device_count(), 1)


def train_command(
    config: str = typer.Option(..., "--config", "-c", help="A configs/train/*.yaml file."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: --set learning_rate=1e-4"),
    accelerate_config: Optional[str] = typer.Option(
        None, "--accelerate-config", help="Run under `accelerate launch` with this configs/accelerate/*.yaml."),
    num_processes: Optional[int] = typer.Option(
        None, "--num-processes", help="With --accelerate-config: processes to start (default: the config's "
                                      "num_processes, or one per visible GPU where it has none)."),
    flags: Optional[list[str]] = typer.Argument(None, help="More SFT parser flags after --, e.g. -- --max_steps 10"),
) -> None:
    """LoRA / QLoRA SFT of a KAIR student (train/sft.py)."""
    args = set_to_flags(set_) + list(flags or [])
    if accelerate_config:
        cmd = accelerate_command(config, accelerate_config, args, processes_for(accelerate_config, num_processes))
        typer.echo("+ " + shlex.join(cmd), err=True)
        raise typer.Exit(subprocess.call(cmd))
    from kair_runtime.errors import USER_ERRORS
    from train.sft import run

    try:
        run(["--config", config, *args])
    except USER_ERRORS as e:  # the data, the settings, a resume point (SFTDataError, TrainSettingsError)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


def merge_command(
    base: str = typer.Option(..., help="The base model: hub name, local path or embedded name (smollm2-135m)."),
    adapter: str = typer.Option(..., help="A PEFT adapter dir (any training checkpoint dir works)."),
    out: str = typer.Option(..., help="Where to write the merged model and tokenizer."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    device: str = typer.Option("cpu", help="cpu | cuda"),
    tolerance: Optional[float] = typer.Option(None, help="Max allowed |logit| difference, relative to the "
                                                          "largest |logit| (default by dtype)."),
) -> None:
    """Merge a LoRA adapter into its base and check merged vs unmerged logits agree."""
    from train.merge import merge_adapter

    merge_adapter(base, adapter, out, dtype=dtype, device=device, tolerance=tolerance)  # prints its report


def soup_command(
    adapters: list[str] = typer.Argument(..., help="LoRA adapter folders of one base, r and lora_alpha."),
    out: str = typer.Option(..., help="The soup's folder (must not exist)."),
) -> None:
    """Average LoRA adapters exactly into one (stacked along the rank): a uniform model soup."""
    from train.soup import SoupError, soup

    try:
        dest = soup(adapters, out)
    except (SoupError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    typer.echo(f"soup of {len(adapters)} adapters -> {dest}")
