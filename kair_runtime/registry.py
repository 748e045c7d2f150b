"""Registries by name whose entries load only when used: a name maps to "module:attr[.attr]".

    LLM_BACKENDS = {"hf": "kair_runtime.llm.hf:HFBackend.from_config", ...}
    factory = resolve(LLM_BACKENDS, "hf", "LLM backend")

So importing a registry (the CLI does) imports no model library; the backends, retrievers and
index builders each register this way.
"""

from __future__ import annotations

import importlib
from typing import Any


def resolve(registry: dict[str, str], name: str, what: str) -> Any:
    """The object `registry[name]` names, imported now; an unknown name is a KeyError that lists
    the known ones (`what` names the kind of thing: "LLM backend", "retriever")."""
    if name not in registry:
        raise KeyError(f"unknown {what} {name!r}; choose one of {sorted(registry)}")
    module, _, attr = registry[name].partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
