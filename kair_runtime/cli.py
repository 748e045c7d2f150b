"""The `kair` command.

    kair ask "Lost! is a song by a British rock band formed in what year?"
    kair ask "..." --config configs/runtime/qwen2.5-7b-vllm.yaml --json
    kair index build --corpus corpus.jsonl --out index/ --retriever dense

kair_runtime owns `ask`, `index` (and `serve`). The other packages (eval, data_gen, train) add
their subcommands through the `kair.commands` entry-point group in pyproject.toml, so this module
never imports them by name and the imports keep pointing one way.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import entry_points
from typing import Optional

import typer
from rich.console import Console

from kair_runtime.config import RuntimeConfig, load_config
from kair_runtime.errors import USER_ERRORS
from kair_runtime.retrieval.cli import index_app

app = typer.Typer(help="KAIR: iterative retrieval with an evolving knowledge index.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(index_app, name="index", help="Build and serve retrieval indexes.")


def main() -> None:
    """The console script: mount the other packages' subcommands, then run."""
    mount_plugins(app)
    app()


def mount_plugins(app: typer.Typer) -> None:
    for ep in entry_points(group="kair.commands"):
        try:
            sub = ep.load()
        except ImportError as e:  # e.g. an extra that is not installed
            sub = _unavailable(ep.name, e)
        if isinstance(sub, typer.Typer):
            app.add_typer(sub, name=ep.name)
        else:
            app.command(ep.name)(sub)


def _unavailable(name: str, err: Exception):
    def cmd() -> None:
        typer.echo(f"`kair {name}` is unavailable: {err}", err=True)
        raise typer.Exit(2)
    cmd.__doc__ = f"(unavailable: {err})"
    return cmd


# ask's flags -> the config keys they set (over the YAML and --set; see config.load_config)
ASK_FLAGS = {"backend": "llm.backend", "model": "llm.model", "adapter": "llm.adapter", "base_url": "llm.base_url",
             "retriever": "retriever.kind", "index_dir": "retriever.index_dir", "corpus": "retriever.corpus",
             "encoder": "retriever.encoder", "index_format": "loop.index_format", "max_steps": "loop.max_steps",
             "top_k": "loop.top_k"}


def runtime_config(config: Optional[str], overrides: list[str], **flags) -> RuntimeConfig:
    """YAML file, then `--set a.b=v` overrides, then the explicit flags that were given."""
    return load_config(RuntimeConfig, config, overrides, {ASK_FLAGS[name]: value for name, value in flags.items()})


@app.command()
def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="A configs/runtime/*.yaml file."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: --set loop.max_steps=3"),
    backend: Optional[str] = typer.Option(None, help="hf | vllm | openai | scripted"),
    model: Optional[str] = typer.Option(None, help="Hub name or local path (default: embedded SmolLM2-135M)."),
    adapter: Optional[str] = typer.Option(None, help="A PEFT LoRA adapter or training checkpoint dir."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1"),
    retriever: Optional[str] = typer.Option(None, help="dense | bm25 | remote"),
    index_dir: Optional[str] = typer.Option(None, help="An index dir from `kair index build`."),
    corpus: Optional[str] = typer.Option(None, help="A jsonl corpus (default: the embedded demo corpus)."),
    encoder: Optional[str] = typer.Option(None, help="Dense encoder name or path (default: minilm)."),
    index_format: Optional[str] = typer.Option(None, help="kr | text | keywords | facts | kf"),
    max_steps: Optional[int] = typer.Option(None, help="Maximum retrieval steps (default 4)."),
    top_k: Optional[int] = typer.Option(None, help="Passages retrieved per step (default 5)."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole trace as JSON."),
) -> None:
    """Answer one question with the KAIR loop and show each step."""
    from kair_runtime.llm import close_llm
    from kair_runtime.records import Question, question_problem
    from kair_runtime.runtime import loop_from_config

    problem = question_problem(question)
    if problem:  # before the model loads
        typer.echo(f"error: the question {problem}", err=True)
        raise typer.Exit(2)
    try:
        cfg = runtime_config(config, set_, backend=backend, model=model, adapter=adapter, base_url=base_url,
                             retriever=retriever, index_dir=index_dir, corpus=corpus, encoder=encoder,
                             index_format=index_format, max_steps=max_steps, top_k=top_k)
    except USER_ERRORS as e:
        typer.echo(f"config error: {e}", err=True)
        raise typer.Exit(2)
    console = Console(stderr=as_json)
    try:
        with console.status("loading model and retriever..."):
            loop = loop_from_config(cfg)
    except (*USER_ERRORS, ValueError, OSError) as e:  # + unknown names, bad paths, bad files
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    try:
        trace = loop.run_one(Question(id="ask", question=question))
    finally:
        close_llm(loop.llm)  # vLLM's engine processes end here, not in interpreter-exit cleanup
    if as_json:
        sys.stdout.write(json.dumps(trace.to_dict(), ensure_ascii=False, indent=2) + "\n")
    else:
        print_trace(trace, console)
    if trace.error:
        raise typer.Exit(1)


def print_trace(trace, console: Console) -> None:
    from kair_runtime.index import get_format

    fmt = get_format(trace.index_format)
    for s in trace.steps:
        console.rule(f"step {s.step}")
        console.print(f"[bold]query[/]: {s.query}")
        for p in s.retrieved:
            console.print(f"  [dim]{p.score:6.3f}[/] {p.title}")
        color = "green" if s.judgment == "sufficient" else "yellow"
        console.print(f"[bold]judgment[/]: [{color}]{s.judgment}[/]"
                      + (f"  [bold]next query[/]: {s.next_query}" if s.next_query else ""))
        if s.fallbacks:
            console.print(f"[red]fallbacks[/]: {', '.join(s.fallbacks)}")
    console.rule("final index")
    if trace.final_index is not None:
        console.print(fmt.linearize(trace.final_index), markup=False, highlight=False)
    console.rule("answer")
    if trace.error:
        console.print(f"[red]failed[/]: {trace.error}")
    else:
        console.print(f"[bold green]{trace.answer}[/]")
    u = trace.usage
    console.print(f"[dim]{len(trace.steps)} steps ({trace.stop_reason}), {u.prompt_tokens} prompt + "
                  f"{u.completion_tokens} completion tokens, {trace.wall_time_s:.1f}s[/]")

