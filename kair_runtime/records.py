"""Records that cross module boundaries: one definition each, JSON in and out.

The trace record (`Trace` with its `Step`s) is what data_gen, eval and serve consume.
Keep field names stable; add fields with defaults so old jsonl files still load.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

TRACE_VERSION = 1

Message = dict[str, str]  # {"role": "user", "content": "..."}: the OpenAI chat shape


@dataclass
class Question:
    id: str
    question: str
    answers: list[str] = field(default_factory=list)  # every gold string, aliases included
    dataset: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)  # gold annotations (supporting titles, ...)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Question":
        return cls(
            id=str(d["id"]),
            question=str(d["question"]),
            answers=[str(a) for a in d.get("answers", [])],
            dataset=str(d.get("dataset", "")),
            metadata=dict(d.get("metadata", {})),
        )


def question_problem(text: str) -> str | None:
    """Why `text` cannot be asked, as the rest of a sentence about it (None: it can). The one rule
    for every way a question comes in: `kair ask`, a dataset record, an HTTP request."""
    if not text.strip():
        return "must not be empty"  # the loop would search for nothing and still answer
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        # The tokenizer, the retriever and the trace writer would each fail on it later.
        code = ord(text[e.start])
        if 0xDC80 <= code <= 0xDCFF:  # how Python keeps a command-line byte that is not UTF-8
            return f"is not UTF-8 text (byte 0x{code - 0xDC00:02x} at character {e.start + 1})"
        return f"is not valid Unicode text (a lone surrogate U+{code:04X} at character {e.start + 1})"
    return None


@dataclass
class Passage:
    id: str
    title: str
    text: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Passage":
        return cls(id=str(d["id"]), title=str(d.get("title", "")), text=str(d.get("text", "")))


@dataclass
class ScoredPassage:
    id: str
    title: str
    text: str
    score: float

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ScoredPassage":
        return cls(id=str(d["id"]), title=str(d.get("title", "")), text=str(d.get("text", "")),
                   score=float(d.get("score", 0.0)))


@dataclass
class Index:
    """The evolving index. Each format uses the fields it needs (see kair_runtime.index)."""

    format: str
    keywords: list[str] = field(default_factory=list)
    relations: list[list[str]] = field(default_factory=list)  # [head, relation, tail]
    facts: list[str] = field(default_factory=list)
    keyword_facts: list[list[Any]] = field(default_factory=list)  # [keyword, [fact, ...]]
    summary: str = ""

    def is_empty(self) -> bool:
        return not (self.keywords or self.relations or self.facts or self.keyword_facts or self.summary)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Index":
        return cls(
            format=str(d["format"]),
            keywords=[str(k) for k in d.get("keywords", [])],
            relations=[[str(x) for x in r] for r in d.get("relations", [])],
            facts=[str(f) for f in d.get("facts", [])],
            keyword_facts=[[str(k), [str(f) for f in fs]] for k, fs in d.get("keyword_facts", [])],
            summary=str(d.get("summary", "")),
        )


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens


@dataclass
class Step:
    """One KAIR step t: D_t = Retriever(q_{t-1}); {I_t, R_t, q_t} = LLM(q0, D_t, o_{t-1})."""

    step: int  # 1-based
    query: str  # q_{t-1}: the query this step retrieved with (q0 at step 1)
    retrieved: list[ScoredPassage]
    prompt: list[Message]
    raw_output: str
    index: Index
    reasoning: str
    judgment: str  # "sufficient" | "insufficient"
    next_query: str | None  # q_t; None when sufficient
    fallbacks: list[str] = field(default_factory=list)  # what the parser had to repair
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_time_s: float = 0.0

    @property
    def parsed_ok(self) -> bool:
        """Format validity: index, judgment and (when needed) query all came from the model."""
        return not any(f in FORMAT_FALLBACKS for f in self.fallbacks)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Step":
        return cls(
            step=int(d["step"]),
            query=str(d["query"]),
            retrieved=[ScoredPassage.from_dict(p) for p in d.get("retrieved", [])],
            prompt=[dict(m) for m in d.get("prompt", [])],
            raw_output=str(d.get("raw_output", "")),
            index=Index.from_dict(d["index"]),
            reasoning=str(d.get("reasoning", "")),
            judgment=str(d.get("judgment", "insufficient")),
            next_query=d.get("next_query"),
            fallbacks=[str(f) for f in d.get("fallbacks", [])],
            prompt_tokens=int(d.get("prompt_tokens", 0)),
            completion_tokens=int(d.get("completion_tokens", 0)),
            wall_time_s=float(d.get("wall_time_s", 0.0)),
        )


# Fallbacks that mean the model broke the output format (counted as invalid steps);
# others (e.g. an empty retrieval) are recorded but are not the model's fault.
FALLBACK_INDEX_MISSING = "index_missing"
FALLBACK_JUDGMENT_MISSING = "judgment_missing"
FALLBACK_JUDGMENT_UNCLEAR = "judgment_unclear"  # a judgment was written but says neither way
FALLBACK_QUERY_MISSING = "query_missing"
FALLBACK_OUTPUT_TRUNCATED = "output_truncated"  # a runaway output: only its head was parsed
FALLBACK_TEMPLATE_ECHO = "template_echo"  # placeholder items copied from the prompt's reply layout
FALLBACK_RETRIEVAL_EMPTY = "retrieval_empty"
FORMAT_FALLBACKS = frozenset({FALLBACK_INDEX_MISSING, FALLBACK_JUDGMENT_MISSING, FALLBACK_JUDGMENT_UNCLEAR,
                              FALLBACK_QUERY_MISSING, FALLBACK_TEMPLATE_ECHO, FALLBACK_OUTPUT_TRUNCATED})


@dataclass
class Trace:
    """Everything one question went through in one method run."""

    question: Question
    method: str = "kair"
    index_format: str = "kr"
    steps: list[Step] = field(default_factory=list)
    final_prompt: list[Message] = field(default_factory=list)
    final_output: str = ""
    answer: str = ""
    stop_reason: str = ""  # "sufficient" | "max_steps" | "error"
    error: str | None = None  # set when the run failed; the question still counts (scored 0)
    final_prompt_tokens: int = 0
    final_completion_tokens: int = 0
    wall_time_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # teacher, sampling, sample id, ...
    version: int = TRACE_VERSION

    @property
    def usage(self) -> Usage:
        u = Usage(self.final_prompt_tokens, self.final_completion_tokens)
        for s in self.steps:
            u.add(s.prompt_tokens, s.completion_tokens)
        return u

    @property
    def final_index(self) -> Index | None:
        return self.steps[-1].index if self.steps else None

    def all_passages(self) -> list[ScoredPassage]:
        """The union of all retrieved docs, deduplicated by id in first-seen order (Eq. 2)."""
        seen: dict[str, ScoredPassage] = {}
        for s in self.steps:
            for p in s.retrieved:
                seen.setdefault(p.id, p)
        return list(seen.values())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trace":
        return cls(
            question=Question.from_dict(d["question"]),
            method=str(d.get("method", "kair")),
            index_format=str(d.get("index_format", "kr")),
            steps=[Step.from_dict(s) for s in d.get("steps", [])],
            final_prompt=[dict(m) for m in d.get("final_prompt", [])],
            final_output=str(d.get("final_output", "")),
            answer=str(d.get("answer", "")),
            stop_reason=str(d.get("stop_reason", "")),
            error=d.get("error"),
            final_prompt_tokens=int(d.get("final_prompt_tokens", 0)),
            final_completion_tokens=int(d.get("final_completion_tokens", 0)),
            wall_time_s=float(d.get("wall_time_s", 0.0)),
            extra=dict(d.get("extra", {})),
            version=int(d.get("version", TRACE_VERSION)),
        )

    @classmethod
    def from_json(cls, line: str) -> "Trace":
        return cls.from_dict(json.loads(line))


@dataclass
class SFTExample:
    """One chat example for SFT: the prompt exactly as the runtime sends it, plus the target turn."""

    messages: list[Message]  # ends with the assistant turn the student must learn
    question_id: str
    kind: str  # "init" | "update" | "answer"
    step: int = 0
    source: str = ""  # teacher model name, or "annotations"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SFTExample":
        return cls(messages=[dict(m) for m in d["messages"]], question_id=str(d["question_id"]),
                   kind=str(d["kind"]), step=int(d.get("step", 0)), source=str(d.get("source", "")),
                   extra=dict(d.get("extra", {})))
