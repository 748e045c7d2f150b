"""The serve config: a runtime config (llm, retriever, loop) plus a `server` section.

    cfg = load_serve_config("configs/serve/default.yaml", ["server.max_batch=32"])

A configs/runtime/*.yaml file is also a valid serve config (the server section has defaults).
The API key is deliberately not a config key: secrets come from `--api-key` or $KAIR_API_KEY,
never from a file that gets committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kair_runtime.config import ConfigError, LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig, load_config
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
    # question at max_question_chars (see check_serve_config).
    max_body_bytes: int = 64 * 1024
    max_steps_limit: int = 8  # per-request max_steps must be in 1..this
    max_top_k: int = 20  # per-request top_k must be in 1..this
    # Index formats a request may ask for; empty means every registered format.
    index_formats: list[str] = field(default_factory=list)
    keepalive_s: float = 15.0  # a comment line on idle streams, so proxies keep them open


@dataclass
class ServeConfig:
    llm: LLMConfig = field(default_factory=LLMConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    server: ServerConfig = field(default_factory=ServerConfig)

    @property
    def runtime(self) -> RuntimeConfig:
        return RuntimeConfig(llm=self.llm, retriever=self.retriever, loop=self.loop)


def load_serve_config(path: str | Path | None = None, overrides: list[str] | None = None) -> ServeConfig:
    cfg = load_config(ServeConfig, path, overrides)
    check_serve_config(cfg, str(path or "<defaults>"))
    return cfg


def check_serve_config(cfg: ServeConfig, where: str = "<config>") -> None:
    """Reject limits that would make every request fail, naming the key."""
    s = cfg.server
    positive = {"server.max_batch": s.max_batch, "server.max_queue": s.max_queue,
                "server.request_timeout_s": s.request_timeout_s, "server.max_question_chars": s.max_question_chars,
                "server.max_steps_limit": s.max_steps_limit, "server.max_top_k": s.max_top_k,
                "server.keepalive_s": s.keepalive_s, "server.max_body_bytes": s.max_body_bytes}
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{where}: {key} must be > 0, got {value}")
    # A question at the character limit, sent as UTF-8 (up to 4 bytes a character), plus room for
    # the other fields, must fit: otherwise a valid question would get 413 instead of an answer.
    needed = 4 * s.max_question_chars + BODY_OVERHEAD_BYTES
    if s.max_body_bytes < needed:
        raise ConfigError(f"{where}: server.max_body_bytes={s.max_body_bytes} cannot hold a question of "
                          f"server.max_question_chars={s.max_question_chars} (needs >= {needed}: 4 bytes a "
                          f"character + {BODY_OVERHEAD_BYTES})")
    if s.batch_wait_ms < 0:
        raise ConfigError(f"{where}: server.batch_wait_ms must be >= 0, got {s.batch_wait_ms}")
    for key, name in [("loop.index_format", cfg.loop.index_format)] + [
            (f"server.index_formats[{i}]", f) for i, f in enumerate(s.index_formats)]:
        try:
            get_format(name)
        except KeyError as e:
            raise ConfigError(f"{where}: {key}: {e.args[0]}") from None
    if not 1 <= cfg.loop.max_steps <= s.max_steps_limit:
        raise ConfigError(f"{where}: loop.max_steps={cfg.loop.max_steps} is outside 1..server.max_steps_limit"
                          f"={s.max_steps_limit}")
    if not 1 <= cfg.loop.top_k <= s.max_top_k:
        raise ConfigError(f"{where}: loop.top_k={cfg.loop.top_k} is outside 1..server.max_top_k={s.max_top_k}")
