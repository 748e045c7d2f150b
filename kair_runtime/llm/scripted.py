"""A deterministic, zero-cost LLM: answers each prompt by a pure function of its text.

Used by tests (batched and one-at-a-time runs must give identical traces) and by the loop
overhead benchmark. It is a real backend of the protocol, not a stand-in for one: give it any
`respond(messages) -> str`. `echo_kair` is a respond function that emits well-formed KAIR output
built from the documents in the prompt.
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from typing import Callable

from kair_runtime.llm.base import BackendError, Completion, SamplingParams
from kair_runtime.records import Message

Respond = Callable[[list[Message]], str]
_DOC_LINE = re.compile(r"^\[(\d+)\] ([^:\n]+):", re.MULTILINE)


CALLS_KEPT = 4096


class ScriptedLLM:
    def __init__(self, respond: Respond, name: str = "scripted"):
        self.respond = respond
        self.name = name
        # The batch size of each recent generate() call, read by batching tests; bounded because
        # `kair serve` with this backend runs for as long as the server does.
        self.calls: deque[int] = deque(maxlen=CALLS_KEPT)

    def generate(self, prompts: list[list[Message]], sampling: SamplingParams) -> list[Completion]:
        if sampling.grammar:
            # Its outputs are scripted, not decoded: nothing could constrain them (check_grammar
            # refuses loop.structured before a run; this catches a direct call).
            raise BackendError(f"{self.name}: a scripted backend cannot constrain its output to a grammar; "
                               "loop.structured needs backend: hf")
        self.calls.append(len(prompts))
        out = []
        for msgs in prompts:
            text = self.respond(msgs)
            words = text.split()
            truncated = len(words) > sampling.max_tokens
            if truncated:
                text = " ".join(words[: sampling.max_tokens])
            out.append(Completion(text=text, prompt_tokens=sum(len(m["content"].split()) for m in msgs),
                                  completion_tokens=min(len(words), sampling.max_tokens),
                                  finish_reason="length" if truncated else "stop"))
        return out


def echo_kair(messages: list[Message]) -> str:
    """Well-formed K&R output from the prompt's document titles; the judgment is a hash of the
    prompt, so some questions stop early and others run to max_steps, deterministically."""
    prompt = messages[-1]["content"]
    titles = [t.strip() for _, t in _DOC_LINE.findall(prompt)]
    if "short answer only" in prompt:
        return titles[0] if titles else "unknown"
    digest = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
    sufficient = digest % 3 == 0 and bool(titles)
    rels = "\n".join(f"{a} -> related to -> {b}" for a, b in zip(titles, titles[1:]))
    judgment = "sufficient" if sufficient else "insufficient"
    query = "none" if sufficient else f"more about {titles[-1] if titles else 'the question'}"
    return (f"<index>\nKeywords: {', '.join(titles)}\nRelationships:\n{rels}\n</index>\n"
            f"<reasoning>Found {len(titles)} documents. Judgment: {judgment}</reasoning>\n<query>{query}</query>")


def from_config(cfg) -> ScriptedLLM:
    """`backend: scripted`: the echo responder, for checking plumbing without a model."""
    return ScriptedLLM(echo_kair, name="scripted-echo")
