"""OpenAI's chat-completions API over the KAIR loop: the request model and the bodies it returns.

    req = ChatRequest.model_validate(body); answer_req, unused = as_answer_request(req)
    completion(trace_body, model_id, unused)   # the chat.completion object
    chunk(model_id, cid, created, delta, ...)  # one chat.completion.chunk of a stream

What a chat request means to the loop:
- The last message must be the user's: its text is the question. Earlier messages (a system
  prompt, previous turns) do not reach the loop, which has its own prompts and answers one
  question from the corpus; the response counts them in `kair.unused_messages` rather than
  pretending they were read.
- Loop settings travel in the extra body (the openai SDK's `extra_body`): max_steps, top_k,
  index_format, return_trace, checked exactly as /v1/answer checks them.
- Sampling fields (temperature, max_tokens, stop, tools, ...) are refused with a 422 naming the
  field: the loop decodes with the server's settings, and a client that sets them expects an
  effect it would not get. `n` may only be 1.
- The trace travels in the extra `kair` field: the /v1/answer body (steps with their queries,
  retrieved ids, index and judgments; the final index; stop reason; settings). Streaming sends
  one chunk per finished step (empty delta, `kair.step`), then the answer as the content delta,
  then the finish chunk, the usage chunk if `stream_options.include_usage`, and `data: [DONE]`.
- Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, create_model, field_validator
from pydantic_core import PydanticCustomError

from kair_runtime.config import LLMConfig
from kair_runtime.serve.bodies import AnswerRequest

# Fields of OpenAI's chat-completions request the loop has no use for: refused, never ignored.
UNUSED_FIELDS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "presence_penalty",
                 "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "seed", "tools", "tool_choice",
                 "parallel_tool_calls", "functions", "function_call", "response_format", "reasoning_effort",
                 "modalities", "audio", "prediction", "service_tier", "store", "metadata", "web_search_options",
                 "verbosity")
LOOP_FIELDS = ("max_steps", "top_k", "index_format", "return_trace")  # the extra body


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # name, tool_call_id, ...: not read
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[str] = None  # content parts arrive joined (text_parts)

    @field_validator("content", mode="before")
    @classmethod
    def text_parts(cls, value: Any) -> Any:
        """[{"type": "text", "text": ...}, ...] -> their texts joined by newlines; any other part
        (an image, audio) is refused: the loop reads text."""
        if not isinstance(value, list):
            return value
        texts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise PydanticCustomError("text_only", "content part {i} is of type '{kind}': only "
                                          "text parts (type 'text') can be read",
                                          {"i": i, "kind": str(kind)})
            texts.append(part["text"])
        return "\n".join(texts)

    def text(self) -> str:
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _ChatFields(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    messages: list[ChatMessage]
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = None
    user: Optional[str] = None  # an end-user id for the operator's logs; it changes nothing
    max_steps: Optional[int] = None
    top_k: Optional[int] = None
    index_format: Optional[str] = None
    return_trace: bool = False

    @field_validator(*UNUSED_FIELDS, check_fields=False)
    @classmethod
    def refuse_unused(cls, value: Any) -> Any:
        if value is not None:
            raise PydanticCustomError("unused_field", "not used by the KAIR loop, which decodes with the server's "
                                      "settings; remove it (the loop's own settings: {loop})",
                                      {"loop": ", ".join(LOOP_FIELDS)})
        return value

    @field_validator("n")
    @classmethod
    def one_choice(cls, value: Optional[int]) -> Optional[int]:
        if value not in (None, 1):
            raise PydanticCustomError("one_choice", "the KAIR loop gives one answer per question: n must be 1")
        return value

    @field_validator("messages")
    @classmethod
    def ends_with_user(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise PydanticCustomError("no_messages", "at least one message, the last one the user's question")
        if value[-1].role != "user":
            raise PydanticCustomError("last_not_user", "the last message must be the user's question, not "
                                      "the {role}'s", {"role": value[-1].role})
        return value


# The request model: the fields above, plus every unused OpenAI field declared so that sending one
# is an error naming it (an undeclared field would be "unknown", which misleads a client).
ChatRequest = create_model("ChatRequest", __base__=_ChatFields,
                           **{name: (Optional[Any], None) for name in UNUSED_FIELDS})
ACCEPTED_FIELDS = tuple(_ChatFields.model_fields)


def as_answer_request(req: _ChatFields) -> tuple[AnswerRequest, int]:
    """The /v1/answer request a chat request stands for, and how many earlier messages it leaves
    unused. The question's text is validated by the same model, so it fails the same way."""
    fields = {k: getattr(req, k) for k in LOOP_FIELDS if getattr(req, k) is not None}
    return AnswerRequest(question=req.messages[-1].text(), **fields), len(req.messages) - 1


def served_model(llm: LLMConfig) -> dict[str, Any]:
    """The one model this server answers as: the adapter's folder name (or the model's), with the
    base it runs on as `parent`, the way vLLM lists a LoRA module."""
    if llm.backend == "scripted":  # no model is loaded: its `model` setting names nothing
        return {"id": "scripted", "root": "scripted", "parent": None}
    if llm.adapter:
        return {"id": Path(llm.adapter.rstrip("/")).name, "root": llm.adapter, "parent": llm.model}
    return {"id": llm.model, "root": llm.model, "parent": None}


def models_body(llm: LLMConfig, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{**served_model(llm), "object": "model", "created": created,
                                        "owned_by": "kair"}]}


def accepts_model(llm: LLMConfig, name: str) -> bool:
    m = served_model(llm)
    return name in (m["id"], m["root"])


def usage(body: dict[str, Any]) -> dict[str, int]:
    u = body["usage"]
    return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
            "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}


def kair_field(body: dict[str, Any], unused: int) -> dict[str, Any]:
    """The /v1/answer body less what the chat object already says (answer, usage)."""
    extra = {k: v for k, v in body.items() if k not in ("answer", "usage")}
    extra["unused_messages"] = unused
    return extra


def completion(body: dict[str, Any], model_id: str, unused: int) -> dict[str, Any]:
    return {"id": f"chatcmpl-{body['id']}", "object": "chat.completion", "created": int(time.time()),
            "model": model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": body["answer"]},
                         "logprobs": None, "finish_reason": "stop"}],
            "usage": usage(body), "kair": kair_field(body, unused)}


def chunk(model_id: str, cid: str, created: int, delta: Optional[dict[str, Any]], *,
          finish_reason: Optional[str] = None, kair: Optional[dict[str, Any]] = None,
          usage_: Optional[dict[str, int]] = None) -> str:
    """One SSE `data:` line holding a chat.completion.chunk; delta None: the usage chunk (no choices)."""
    obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id,
                           "choices": [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                                                 "finish_reason": finish_reason}]}
    if usage_ is not None:
        obj["usage"] = usage_
    if kair is not None:
        obj["kair"] = kair
    return data_line(obj)


def data_line(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"

# OpenAI's error `type` and `code` by HTTP status.
ERROR_KINDS: dict[int, tuple[str, Optional[str]]] = {
    400: ("invalid_request_error", None), 401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"), 413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "invalid_value"), 502: ("server_error", "backend_error"),
    503: ("server_error", "unavailable"), 504: ("server_error", "timeout"),
}


def error_body(status: int, message: str, param: Optional[str] = None) -> dict[str, Any]:
    kind, code = ERROR_KINDS.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
