"""The one protocol every LLM backend implements, and the records it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kair_runtime.errors import UserError
from kair_runtime.records import Message


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # n > 0: no n-gram of tokens may occur twice in the completion (the prompt is not counted, so
    # copying names from it stays free). A small student's greedy loops end here. hf backend only.
    no_repeat_ngram: int = 0
    # The structured mode: an xgrammar EBNF grammar (kair_runtime/grammar.py) the completion must
    # match. None = unconstrained. Backends that cannot constrain refuse it (check_grammar).
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.no_repeat_ngram < 0 or self.no_repeat_ngram == 1:
            raise ValueError(f"no_repeat_ngram must be 0 (off) or at least 2, got {self.no_repeat_ngram}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"  # "stop" | "length"
    extra: dict = field(default_factory=dict)


@runtime_checkable
class LLM(Protocol):
    """generate() takes a batch of chat conversations and returns one completion per conversation,
    in order. Backends batch internally as they can (vLLM, padded HF generate, concurrent HTTP)."""

    name: str

    def generate(self, prompts: list[list[Message]], sampling: SamplingParams) -> list[Completion]: ...


def auto_dtype(dtype: str, on_gpu: bool, gpu_has_bf16: bool = True) -> str:
    """The one meaning of `llm.dtype: auto` for in-process backends: bfloat16 on a GPU (float16 on
    one older than Ampere, which has no bfloat16: vLLM refuses it there), float32 on a CPU (where
    bf16 matmuls are slow or emulated and float32 keeps backends comparable)."""
    if dtype != "auto":
        return dtype
    if not on_gpu:
        return "float32"
    return "bfloat16" if gpu_has_bf16 else "float16"


class BackendError(UserError, RuntimeError):
    """A backend could not produce a completion (unreachable server, OOM, bad adapter path...)."""


class BackendDeadError(BackendError):
    """The backend can produce nothing more in this process (a vLLM engine that died): the run
    stops here instead of recording the same failure for every question still to come."""


def check_grammar(llm: LLM, structured: bool) -> None:
    """Fail before a run: only backends that set `constrains_grammar` honour loop.structured."""
    if structured and not getattr(llm, "constrains_grammar", False):
        raise BackendError(f"loop.structured: {getattr(llm, 'name', type(llm).__name__)} cannot constrain "
                           "its output to a grammar; use backend hf or vllm (or openai on a vLLM server), or set loop.structured: false")


def check_no_repeat_ngram(llm: LLM, n: int) -> None:
    """Fail before a run, not once per question: only backends that set `bans_repeated_ngrams`
    (hf) can honour loop.no_repeat_ngram."""
    if n and not getattr(llm, "bans_repeated_ngrams", False):
        raise BackendError(f"loop.no_repeat_ngram={n}: {getattr(llm, 'name', type(llm).__name__)} cannot ban "
                           "repeated n-grams of a completion; use backend: hf or set it to 0")
