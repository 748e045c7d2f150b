"""A backend outage for tests: a real ScriptedLLM whose calls fail with BackendError for some
questions, as a server that is down for part of a run would.

Register it in place of the scripted backend (`monkeypatch.setitem(LLM_BACKENDS, "scripted",
OUTAGE)`) so the commands build it from their config, and take it out to "end the outage"
without changing the config a run folder is tied to.
"""

from __future__ import annotations

import hashlib
import re

from kair_runtime.llm.base import BackendError
from kair_runtime.llm.scripted import ScriptedLLM, echo_kair
from kair_runtime.records import Message

OUTAGE = "outage:from_config"  # an LLM_BACKENDS entry
_QUESTION = re.compile(r"^Question: (.*)$", re.MULTILINE)


def is_down(question: str) -> bool:
    """Whether the outage hits this question: about half of them, by a stable hash of its text."""
    return hashlib.sha256(question.encode()).digest()[0] % 2 == 0


def respond(messages: list[Message]) -> str:
    m = _QUESTION.search(messages[-1]["content"])
    assert m, "every KAIR prompt names the question"
    if is_down(m.group(1)):
        raise BackendError("connection refused (simulated outage)")
    return echo_kair(messages)


def from_config(cfg) -> ScriptedLLM:
    return ScriptedLLM(respond, name="scripted-echo")
