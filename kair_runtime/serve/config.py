"""The serve config: a runtime config (llm, retriever, loop) plus a `server` section.

    cfg = load_serve_config("configs/serve/default.yaml", ["server.max_batch=32"])

A configs/runtime/*.yaml file is also a valid serve config (the server section has defaults).
The API key is deliberately not a config key: secrets come from `--api-key` or $KAIR_API_KEY,
never from a file that gets committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kair_runtime.config import (ConfigError, LLMConfig, LoopConfig, Range, RetrieverConfig, RuntimeConfig,
                                 check_ranges, load_config)
from kair_runtime.index import get_format

BODY_OVERHEAD_BYTES = 1024  # the JSON around the question: the other fields, quotes, whitespace


@dataclass
class ServerConfig:
    # Continuous batching: when the worker is idle, the first request waits this long for company.
    batch_wait_ms: float = 5.0
    max_batch: int = 64  # questions in flight at once (one loop round advances all of them)
    max_queue: int = 1024  # requests waiting for a slot beyond that; more get 503
    request_timeout_s: float = 300.0  # a request that is not answered by then gets 504
    max_question_chars: int = 2000
    # Request bodies over this many bytes get 413 before they are read whole. It must hold a
    # question at max_question_chars (see validate).
    max_body_bytes: int = 64 * 1024
    max_steps_limit: int = 8  # per-request max_steps must be in 1..this
    max_top_k: int = 20  # per-request top_k must be in 1..this
    # Index formats a request may ask for; empty means every registered format.
    index_formats: list[str] = field(default_factory=list)
    keepalive_s: float = 15.0  # a comment line on idle streams, so proxies keep them open
    # GET /metrics without the API key, for a scraper on a private network; by default it needs
    # the key like the /v1 routes (Prometheus sends it with `authorization: {credentials: KEY}`).
    open_metrics: bool = False

    def validate(self, where: str = "server") -> None:
        # A limit at 0 would make every request fail; the error names the key instead.
        check_ranges(self, SERVER_RANGES, where)
        # A question at the character limit, sent as UTF-8 (up to 4 bytes a character), plus room for
        # the other fields, must fit: otherwise a valid question would get 413 instead of an answer.
        needed = 4 * self.max_question_chars + BODY_OVERHEAD_BYTES
        if self.max_body_bytes < needed:
            raise ConfigError(f"{where}.max_body_bytes={self.max_body_bytes} cannot hold a question of "
                              f"{where}.max_question_chars={self.max_question_chars} (needs >= {needed}: 4 bytes "
                              f"a character + {BODY_OVERHEAD_BYTES})")
        for i, name in enumerate(self.index_formats):
            _check_format(f"{where}.index_formats[{i}]", name)


SERVER_RANGES: dict[str, Range] = {
    "batch_wait_ms": Range(low=0), "max_batch": Range(low=1), "max_queue": Range(low=1),
    "request_timeout_s": Range(low=0, low_open=True), "max_question_chars": Range(low=1),
    "max_steps_limit": Range(low=1), "max_top_k": Range(low=1), "keepalive_s": Range(low=0, low_open=True),
    "max_body_bytes": Range(low=1),
}


@dataclass
class ServeConfig:
    llm: LLMConfig = field(default_factory=LLMConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    server: ServerConfig = field(default_factory=ServerConfig)

    @property
    def runtime(self) -> RuntimeConfig:
        return RuntimeConfig(llm=self.llm, retriever=self.retriever, loop=self.loop)

    def validate(self, where: str = "") -> None:
        """What only the whole config can check: the loop's defaults must be requests the server
        accepts (each section's own ranges were checked when it was read)."""
        s, loop, at = self.server, self.loop, f"{where}." if where else ""
        _check_format(f"{at}loop.index_format", loop.index_format)
        if not 1 <= loop.max_steps <= s.max_steps_limit:
            raise ConfigError(f"{at}loop.max_steps={loop.max_steps} is outside "
                              f"1..{at}server.max_steps_limit={s.max_steps_limit}")
        if not 1 <= loop.top_k <= s.max_top_k:
            raise ConfigError(f"{at}loop.top_k={loop.top_k} is outside 1..{at}server.max_top_k={s.max_top_k}")


def _check_format(key: str, name: str) -> None:
    try:
        get_format(name)
    except KeyError as e:
        raise ConfigError(f"{key}: {e.args[0]}") from None


def load_serve_config(path: str | Path | None = None, overrides: list[str] | None = None) -> ServeConfig:
    """Read and check a serve config (from_dict runs every section's `validate`)."""
    return load_config(ServeConfig, path, overrides)
