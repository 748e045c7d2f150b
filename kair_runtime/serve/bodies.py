"""Request and response bodies of the HTTP API: the request model, the JSON each route returns,
the server-sent event framing and the one-line description of a validation error.

    body = answer_body(trace, settings, latency_s, with_trace=False)

Pure functions of the loop's records; `service.py` and `app.py` use them.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
from dataclasses import asdict
from typing import Any, Optional

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, field_validator
from pydantic_core import PydanticCustomError

from kair_runtime.index import empty_index, get_format
from kair_runtime.records import Index, Step, Trace
from kair_runtime.retrieval.base import Retriever
from kair_runtime.serve.scheduler import Settings

VERSIONED = ("kair", "fastapi", "uvicorn", "pydantic", "torch", "transformers", "peft",
             "sentence-transformers", "faiss-cpu", "bm25s", "vllm", "openai")


class AnswerRequest(BaseModel):
    # Unknown fields are an error: a misspelt "max_step" must not silently fall back to a default.
    # Strict: a JSON value must already have the field's type. Lax mode would read "3", 2.0 and
    # true as max_steps=3, 2, 1 and "true" as return_trace, hiding a client's bug behind a guess.
    # The ranges of max_steps and top_k depend on the server's limits: `Service.settings_for`.
    model_config = ConfigDict(extra="forbid", strict=True)

    question: str
    max_steps: Optional[int] = None
    top_k: Optional[int] = None
    index_format: Optional[str] = None
    return_trace: bool = False

    @field_validator("question", "index_format")
    @classmethod
    def unicode_text(cls, value: Optional[str]) -> Optional[str]:
        # JSON may carry a lone surrogate escape ("\ud800") that Python decodes into a str that
        # is not Unicode text: it cannot be encoded as UTF-8, so the tokenizer, the retriever and
        # the response writer would each fail on it later, as a 502 or a broken stream.
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise PydanticCustomError(
                    "lone_surrogate", "not valid Unicode text: a lone surrogate U+{code} at character "
                    "{position}; send UTF-8 text", {"code": f"{ord(value[e.start]):04X}", "position": e.start})
        return value


class RequestError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail



def index_items(index: Index) -> dict[str, list]:
    """Every format's content as keywords, relations and facts (kf's keywords carry facts)."""
    keywords = list(index.keywords) + [k for k, _ in index.keyword_facts]
    facts = list(index.facts) + [f"{k}: {f}" for k, fs in index.keyword_facts for f in fs]
    return {"keywords": keywords, "relations": [list(r) for r in index.relations], "facts": facts}


def index_delta(prev: Optional[Index], cur: Index) -> dict[str, Any]:
    """What a step added to and removed from the index (the streamed "index delta")."""
    before = index_items(prev) if prev is not None else {"keywords": [], "relations": [], "facts": []}
    after = index_items(cur)
    delta: dict[str, Any] = {}
    for key in ("keywords", "relations", "facts"):
        old, new = [json.dumps(x) for x in before[key]], [json.dumps(x) for x in after[key]]
        delta[f"added_{key}"] = [json.loads(x) for x in new if x not in set(old)]
        delta[f"removed_{key}"] = [json.loads(x) for x in old if x not in set(new)]
    delta["summary"] = cur.summary if cur.summary != (prev.summary if prev else "") else None
    return delta


def step_summary(trace: Trace, step: Step) -> dict[str, Any]:
    i = step.step - 1  # steps are numbered 1, 2, ... in trace order
    prev = trace.steps[i - 1].index if i > 0 else None
    return {"step": step.step, "query": step.query,
            "retrieved": [{"id": p.id, "title": p.title, "text": p.text, "score": round(p.score, 4)}
                          for p in step.retrieved],
            "index": asdict(step.index), "index_text": get_format(step.index.format).linearize(step.index),
            "index_delta": index_delta(prev, step.index), "reasoning": step.reasoning,
            "judgment": step.judgment, "next_query": step.next_query, "fallbacks": step.fallbacks,
            "usage": {"prompt_tokens": step.prompt_tokens, "completion_tokens": step.completion_tokens},
            "wall_time_s": round(step.wall_time_s, 4)}


def answer_body(trace: Trace, settings: Settings, latency_s: float, with_trace: bool) -> dict[str, Any]:
    index = trace.final_index or empty_index(settings.index_format)
    u = trace.usage
    body = {"id": trace.question.id, "question": trace.question.question, "answer": trace.answer,
            "index": asdict(index), "index_text": get_format(index.format).linearize(index),
            "steps": [step_summary(trace, s) for s in trace.steps], "stop_reason": trace.stop_reason,
            "settings": asdict(settings),
            "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens},
            "latency_s": round(latency_s, 4)}
    if with_trace:
        body["trace"] = trace.to_dict()
    return body


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def corpus_size(retriever: Optional[Retriever]) -> Optional[int]:
    """The retriever's passage count, if it knows it (a remote one may not)."""
    if retriever is None:
        return None
    for attr in ("corpus_size", "num_passages", "size"):
        value = getattr(retriever, attr, None)
        if isinstance(value, int):
            return value
    for attr in ("passages", "corpus"):
        value = getattr(retriever, attr, None)
        if hasattr(value, "__len__"):
            return len(value)
    return len(retriever) if hasattr(retriever, "__len__") else None  # type: ignore[arg-type]


def versions() -> dict[str, Optional[str]]:
    out: dict[str, Optional[str]] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass  # not installed: leave it out rather than report a guess
    return out

def describe_validation(e: RequestValidationError, fields: Optional[Any] = None,
                        example: str = '{"question": "..."}') -> str:
    """Pydantic's error list as one readable line: `question: Field required; top_k: ...`.
    `fields`: the valid field names an unknown one is told about (default: AnswerRequest's)."""
    parts = []
    for err in e.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'decode error')})")
        elif err.get("type") == "string_unicode":  # pydantic's word for a field *name* with a lone surrogate
            parts.append("a field name is not valid Unicode text (a lone surrogate escape); send UTF-8 text")
        elif not loc:  # the body as a whole: missing, or not an object (a list, a string, form data)
            parts.append(f"the body must be a JSON object like {example} sent with Content-Type: application/json")
        elif err.get("type") == "extra_forbidden":
            valid = AnswerRequest.model_fields if fields is None else fields
            parts.append(f"{'.'.join(loc)}: unknown field; valid fields: {', '.join(valid)}")
        else:
            parts.append(f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "the body does not match the schema"
