"""Prompt files and how they are rendered into chat messages.

Templates live in `kair_runtime/prompts/`: `<format>/init.txt` and `<format>/update.txt` per index
format, and `answer.txt`, `answer_docs.txt`, `answer_index.txt` for the final answer (a format may
override them with its own `<format>/answer*.txt`). Placeholders are `$question`, `$documents`,
`$index`, `$reasoning`, `$query`, and in update prompts `$index_rule`: the sentence of
kair_runtime/index.py that says what the loop does with the index the model writes
(loop.index_update). `$layout` is the format's reply layout (kair_runtime/layout.py), filled in
when the templates are loaded, so a template's text, and the prompt version hashed from it, are
the same as if the block were written out. A user can point `prompt_dir` at a copy to change them
(a copy with the block written out works as well).

Rendering is a pure function of the trace's contents, so data_gen can rebuild every prompt from
a trace byte for byte (that is how SFT examples match inference).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from kair_runtime.config import ANSWER_MODES, LoopConfig
from kair_runtime.index import INDEX_UPDATE_RULES, get_format
from kair_runtime.layout import step_layout
from kair_runtime.records import Index, Message, ScoredPassage

ROLES = ("init", "update", *ANSWER_MODES)


def default_prompt_dir() -> Path:
    return Path(str(resources.files("kair_runtime") / "prompts"))


def fill_layout(template: str, format_name: str) -> str:
    """The template with `$layout` (or `${layout}`) replaced by the format's reply layout; every
    other placeholder, and an escaped `$$`, is left for rendering."""
    block = step_layout(format_name).block

    def fill(m: re.Match) -> str:
        return block if (m.group("named") or m.group("braced")) == "layout" else m.group(0)

    return Template.pattern.sub(fill, template)


@dataclass(frozen=True)
class PromptSet:
    """The templates for one index format, loaded once."""

    format: str
    templates: dict[str, str]
    system: str | None = None
    max_passage_words: int | None = None  # truncate each passage in prompts (small models)
    index_update: str = "merge"  # which of index.py's INDEX_UPDATE_RULES the update prompt states

    @classmethod
    def for_loop(cls, loop: LoopConfig, format_name: str | None = None) -> "PromptSet":
        """The prompts a loop with these settings renders (format_name: another format's)."""
        return cls.load(format_name or loop.index_format, loop.prompt_dir, loop.system_prompt,
                        loop.max_passage_words, loop.index_update)

    @classmethod
    def load(cls, format_name: str, prompt_dir: str | Path | None = None, system: str | None = None,
             max_passage_words: int | None = None, index_update: str = "merge") -> "PromptSet":
        if index_update not in INDEX_UPDATE_RULES:
            raise ValueError(f"index_update must be one of {', '.join(INDEX_UPDATE_RULES)}, got {index_update!r}")
        fmt = get_format(format_name).name
        root = Path(prompt_dir) if prompt_dir else default_prompt_dir()
        templates = {}
        for role in ROLES:
            own, shared = root / fmt / f"{role}.txt", root / f"{role}.txt"
            path = own if own.exists() else shared
            if not path.exists():
                raise FileNotFoundError(f"prompt template for {fmt}/{role} not found: looked for {own} and {shared}")
            templates[role] = fill_layout(path.read_text(encoding="utf-8"), fmt)
        return cls(format=fmt, templates=templates, system=system, max_passage_words=max_passage_words,
                   index_update=index_update)

    @property
    def version(self) -> str:
        """A short hash of everything that shapes the prompt text, recorded with trajectories."""
        h = hashlib.sha256()
        for role in ROLES:
            h.update(role.encode() + b"\0" + self.templates[role].encode() + b"\0")
        h.update(repr((self.system, self.max_passage_words, self.index_update)).encode())
        return h.hexdigest()[:12]

    def format_documents(self, passages: list[ScoredPassage]) -> str:
        if not passages:
            return "(no documents were retrieved)"
        return "\n".join(f"[{i}] {p.title}: {self._truncate(p.text)}" for i, p in enumerate(passages, 1))

    def _truncate(self, text: str) -> str:
        words = text.split()
        if self.max_passage_words is None or len(words) <= self.max_passage_words:
            return " ".join(words)
        return " ".join(words[: self.max_passage_words]) + " ..."

    def linearize(self, index: Index) -> str:
        return get_format(self.format).linearize(index)

    def messages(self, role: str, **values: str) -> list[Message]:
        text = Template(self.templates[role]).substitute(**values).strip()
        msgs: list[Message] = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": text}]

    # One function per role keeps the callers honest about which values each template needs.
    def init(self, question: str, docs: list[ScoredPassage]) -> list[Message]:
        return self.messages("init", question=question, documents=self.format_documents(docs))

    def update(self, question: str, docs: list[ScoredPassage], index: Index, reasoning: str,
               query: str) -> list[Message]:
        return self.messages("update", question=question, documents=self.format_documents(docs),
                             index=self.linearize(index), reasoning=reasoning or "(none)", query=query,
                             index_rule=INDEX_UPDATE_RULES[self.index_update])

    def answer(self, question: str, docs: list[ScoredPassage], index: Index | None, mode: str = "answer") -> list[Message]:
        """mode: "answer" (docs + index, Eq. 6), "answer_docs" (Eq. 3), "answer_index"."""
        values = {"question": question}
        if mode in ("answer", "answer_docs"):
            values["documents"] = self.format_documents(docs)
        if mode in ("answer", "answer_index"):
            values["index"] = self.linearize(index) if index is not None else "(empty)"
        return self.messages(mode, **values)
