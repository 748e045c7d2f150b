"""The one protocol every LLM backend implements, and the records it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kair_runtime.records import Message


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()

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


class BackendError(RuntimeError):
    """A backend could not produce a completion (unreachable server, OOM, bad adapter path...)."""
