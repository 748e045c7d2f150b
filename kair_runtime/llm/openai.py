"""The HTTP backend: any OpenAI-compatible chat completions server.

Typically vLLM serving the base model with the trained adapter:

    vllm serve BASE --enable-lora --lora-modules kair=PATH --max-lora-rank 16
    llm: {backend: openai, base_url: http://localhost:8000/v1, model: kair}

A batch becomes concurrent requests (a thread pool of `concurrency`); each is retried with
exponential backoff on connection errors, 429 and 5xx. Token counts come from the server's
`usage`. Any other 4xx fails at once with the server's message.

Every request carries the whole sampling the loop asks for. A vLLM server (recognised by the
`owned_by` of its /models list, asked once) fills each field a request leaves out from the model's
generation_config (a Qwen base: repetition_penalty 1.05, top_k 20...), so to vLLM the backend also
sends its own fields neutral: top_k, min_p, repetition_penalty. Other servers get only the
OpenAI fields (OpenAI itself refuses unknown ones).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from kair_runtime.config import LLMConfig
from kair_runtime.llm.base import BackendError, Completion, SamplingParams
from kair_runtime.records import Message

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# vLLM's sampling fields beyond OpenAI's, at the values that turn each off
VLLM_NEUTRAL = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
MAX_BACKOFF_S = 30.0


class OpenAIBackend:
    # SamplingParams.grammar: sent as the request body's `structured_outputs` (vLLM >= 0.12 reads it
    # there; older field names are ignored with a 200), so only to a server that says it is vLLM.
    constrains_grammar = True

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, concurrency: int = 16,
                 timeout_s: float = 120.0, retries: int = 3, backoff_s: float = 0.5):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.models_url = base_url.rstrip("/") + "/models"
        self._vllm: bool | None = None  # is the server vLLM? asked on the first generate()
        self.model = model
        self.concurrency = max(1, concurrency)
        self.retries = retries
        self.backoff_s = backoff_s
        self.name = f"openai:{model}@{base_url}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One client for all threads: httpx.Client is thread-safe and pools connections.
        self.client = httpx.Client(timeout=timeout_s, headers=headers,
                                   limits=httpx.Limits(max_connections=self.concurrency))

    @classmethod
    def from_config(cls, cfg: LLMConfig) -> "OpenAIBackend":
        if cfg.adapter:  # the server applies adapters; quietly dropping this would score the base model
            raise BackendError(f"llm.adapter ({cfg.adapter}) cannot be applied by backend: openai; serve it "
                               f"(vLLM: --enable-lora --lora-modules NAME={cfg.adapter}) and set llm.model: NAME")
        if not cfg.base_url:
            raise BackendError("llm.base_url is required for backend: openai "
                               "(e.g. http://localhost:8000/v1)")
        api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        return cls(cfg.base_url, cfg.model, api_key=api_key, concurrency=cfg.concurrency,
                   timeout_s=cfg.timeout_s, retries=cfg.retries)

    def generate(self, prompts: list[list[Message]], sampling: SamplingParams) -> list[Completion]:
        if sampling.no_repeat_ngram:  # no OpenAI-compatible API has a completion-only n-gram ban
            raise BackendError(f"{self.name}: loop.no_repeat_ngram is implemented by the hf backend only; "
                               f"set it to 0 for an OpenAI-compatible server")
        if not prompts:
            return []
        if self._vllm is None:
            self._vllm = self._server_is_vllm()
        if sampling.grammar and not self._vllm:
            raise BackendError(f"{self.name}: loop.structured needs a vLLM server (its /models says owned_by "
                               f"vllm); this server would ignore the grammar and answer unconstrained")
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(lambda msgs: self._complete(msgs, sampling), prompts))

    def close(self) -> None:
        self.client.close()

    def _complete(self, messages: list[Message], s: SamplingParams) -> Completion:
        payload: dict = {"model": self.model, "messages": messages, "max_tokens": s.max_tokens,
                         "temperature": s.temperature, "top_p": s.top_p,
                         "presence_penalty": 0.0, "frequency_penalty": 0.0}
        if self._vllm:
            payload |= VLLM_NEUTRAL
        if s.seed is not None:
            payload["seed"] = s.seed
        if s.stop:
            payload["stop"] = list(s.stop)
        if s.grammar:
            payload["structured_outputs"] = {"grammar": s.grammar}
        data = self._post(payload)
        try:
            choice = data["choices"][0]
            usage = data.get("usage") or {}
            return Completion(text=choice["message"].get("content") or "",
                              prompt_tokens=int(usage.get("prompt_tokens", 0)),
                              completion_tokens=int(usage.get("completion_tokens", 0)),
                              finish_reason=choice.get("finish_reason") or "stop")
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise BackendError(f"{self.url}: unexpected response shape ({e!r}): {str(data)[:300]}") from None

    def _server_is_vllm(self) -> bool:
        """True when the server's /models says vLLM serves them. A server without /models is taken
        for a plain OpenAI-compatible one; one that cannot be reached fails as a request would."""
        r = self._send("GET", self.models_url)
        if r.status_code >= 400:
            return False
        try:
            return any(m.get("owned_by") == "vllm" for m in r.json().get("data", []))
        except (ValueError, AttributeError, TypeError):
            return False

    def _send(self, method: str, url: str, payload: dict | None = None) -> httpx.Response:
        """One request with the retry policy; any answer that is not retried is returned."""
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                r = self.client.request(method, url, json=payload)
            except httpx.TransportError as e:  # refused, reset, timed out: the server may come back
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code in RETRY_STATUS:
                last = f"HTTP {r.status_code}: {r.text[:300]}"
                continue
            return r
        raise BackendError(f"{url} failed after {self.retries + 1} attempt(s): {last}")

    def _post(self, payload: dict) -> dict:
        r = self._send("POST", self.url, payload)
        if r.status_code >= 400:
            raise BackendError(f"{self.url} rejected the request (model {self.model!r}): "
                               f"HTTP {r.status_code}: {r.text[:500]}")
        try:
            return r.json()
        except ValueError:
            raise BackendError(f"{self.url}: response is not JSON: {r.text[:300]}") from None
