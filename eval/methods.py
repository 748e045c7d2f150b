"""Evaluation methods, registered by name, all on the runtime's LLM and retriever.

Every method returns one `Trace` per question (the runtime's record), so scoring, statistics
and reports treat them alike. A method's `Step`s are its retrieval steps: the query, the
passages, and the LLM call made at that step (none for vanilla RAG).

    kair                   the KAIR loop with the configured index format (Eq. 4-6)
    qa-docs / qa-index     KAIR, answering from the documents only / the index only (Table 2)
    no-index               the loop without any index: reasoning and query from documents only
    no-evolving            no index during the loop; one index built at the end over all
                           retrieved documents, then the answer from documents + that index
    vanilla                one retrieval of top-k for the question, answer from those documents
    iter-retgen            query = question + previous generation, `iter_retgen_iterations` times
    ircot                  interleaved chain-of-thought: each new sentence is the next query,
                           until "So the answer is:" or `ircot_max_steps`
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Callable, Protocol

from kair_runtime.config import AT_LEAST_1, LoopConfig, check_ranges
from kair_runtime.index import empty_index
from kair_runtime.llm.base import LLM, Completion, SamplingParams, check_no_repeat_ngram
from kair_runtime.loop import (FinalDocsFn, KairLoop, ProgressFn, extract_answer, final_docs_for, generate_isolated,
                               loop_sampling, record_failure)
from kair_runtime.parser import parse_step_output
from kair_runtime.prompts import PromptSet
from kair_runtime.records import Message, Question, ScoredPassage, Step, Trace
from kair_runtime.retrieval.base import Retriever
from kair_runtime.runtime import build_loop

PROMPT_DIR = Path(__file__).parent / "prompts"


@dataclass
class BaselineConfig:
    """The baselines' own settings (the `baselines` section of an eval config)."""

    vanilla_top_k: int = 5  # the paper's Table 8 uses 5/10/15/20
    iter_retgen_iterations: int = 3
    iter_retgen_max_tokens: int = 256
    ircot_max_steps: int = 4
    ircot_max_tokens: int = 96

    def validate(self, where: str = "baselines") -> None:
        check_ranges(self, {name: AT_LEAST_1 for name in ("vanilla_top_k", "iter_retgen_iterations",
                                                          "iter_retgen_max_tokens", "ircot_max_steps",
                                                          "ircot_max_tokens")}, where)


@dataclass
class MethodSettings(BaselineConfig):
    """What a method runs with: the baselines' settings and the loop's (prompts, sampling, budget)."""

    loop: LoopConfig = field(default_factory=LoopConfig)


class Method(Protocol):
    name: str

    def run(self, questions: list[Question], progress: ProgressFn | None = None) -> list[Trace]: ...


MethodFactory = Callable[[LLM, Retriever, MethodSettings, FinalDocsFn | None], Method]
METHODS: dict[str, MethodFactory] = {}


def register_method(name: str):
    def deco(factory: MethodFactory) -> MethodFactory:
        METHODS[name] = factory
        return factory
    return deco


def build_method(name: str, llm: LLM, retriever: Retriever, settings: MethodSettings,
                 final_docs: FinalDocsFn | None = None) -> Method:
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    check_no_repeat_ngram(llm, settings.loop.no_repeat_ngram)
    return METHODS[name](llm, retriever, settings, final_docs)


# ---------------------------------------------------------------- KAIR and its ablations

class _NamedLoop:
    """A KairLoop run that stamps the method name on its traces."""

    def __init__(self, name: str, loop: KairLoop):
        self.name, self.loop = name, loop

    def run(self, questions, progress=None):
        traces = self.loop.run(questions, progress)
        for t in traces:
            t.method = self.name
        return traces


def _loop(name: str, llm, retriever, settings: MethodSettings, final_docs, answers: bool = True,
          **overrides) -> _NamedLoop:
    cfg = dataclasses.replace(settings.loop, **overrides)
    return _NamedLoop(name, build_loop(llm, retriever, cfg, final_docs=final_docs, answers=answers))


@register_method("kair")
def _kair(llm, retriever, settings, final_docs):
    return _loop("kair", llm, retriever, settings, final_docs)


@register_method("qa-docs")
def _qa_docs(llm, retriever, settings, final_docs):
    return _loop("qa-docs", llm, retriever, settings, final_docs, answer_mode="answer_docs")


@register_method("qa-index")
def _qa_index(llm, retriever, settings, final_docs):
    return _loop("qa-index", llm, retriever, settings, final_docs, answer_mode="answer_index")


@register_method("no-index")
def _no_index(llm, retriever, settings, final_docs):
    return _loop("no-index", llm, retriever, settings, final_docs, index_format="none", answer_mode="answer_docs")


@register_method("no-evolving")
class NoEvolving:
    """The no-index loop's search (stopped before its answer call), then one index over all
    retrieved documents (the init prompt of the configured format), then the answer from
    documents + that index. The index-building call is kept in `trace.extra["index_build"]` and
    its tokens count in the final call's tokens.

    The loop's pieces, not a copy of them: the searching is KairLoop, the build call uses the
    loop's step sampling and the format's init prompt and parser, failures and answer documents go
    through record_failure/final_docs_for. The build and answer calls are each one batch over all
    questions after the loop (vLLM's greedy output can depend on what shares a batch)."""

    name = "no-evolving"

    def __init__(self, llm, retriever, settings: MethodSettings, final_docs):
        self.llm = llm
        self.searching = _loop(self.name, llm, retriever, settings, final_docs, answers=False, index_format="none")
        self.prompts = PromptSet.for_loop(settings.loop)
        self.sampling = self.searching.loop.step_sampling
        self.answer_sampling = self.searching.loop.answer_sampling
        self.final_docs = final_docs

    def run(self, questions, progress=None):
        traces = self.searching.run(questions)
        ok = [t for t in traces if t.error is None]
        build_prompts = [self.prompts.init(t.question.question, t.all_passages()) for t in ok]
        built = generate_isolated(self.llm, build_prompts, self.sampling)
        answer_prompts, answering = [], []
        for t, prompt, c in zip(ok, build_prompts, built):
            t.method = self.name
            if _failed(t, c):
                continue
            parsed = parse_step_output(c.text, self.prompts.format, empty_index(self.prompts.format),
                                       t.question.question)
            t.extra["index_build"] = {"prompt": prompt, "raw_output": c.text, "index": dataclasses.asdict(parsed.index),
                                      "fallbacks": parsed.fallbacks, "prompt_tokens": c.prompt_tokens,
                                      "completion_tokens": c.completion_tokens}
            answer_prompts.append(self.prompts.answer(t.question.question, final_docs_for(t, self.final_docs),
                                                      parsed.index))
            answering.append((t, c))
        answers = generate_isolated(self.llm, answer_prompts, self.answer_sampling)
        for (t, build), prompt, c in zip(answering, answer_prompts, answers):
            if _failed(t, c):
                continue
            t.final_prompt, t.final_output, t.answer = prompt, c.text, extract_answer(c.text)
            t.final_prompt_tokens = build.prompt_tokens + c.prompt_tokens
            t.final_completion_tokens = build.completion_tokens + c.completion_tokens
        for t in traces:
            t.method = self.name
        if progress:
            progress(len(traces))
        return traces


def _failed(trace: Trace, c: Completion | Exception) -> bool:
    if isinstance(c, Exception):
        record_failure(trace, c)
        return True
    return False


# ---------------------------------------------------------------- baselines

class _Baseline:
    """Shared plumbing of the non-KAIR methods: their own prompt files, KAIR's document layout."""

    name = ""

    def __init__(self, llm, retriever, settings: MethodSettings, final_docs):
        self.llm, self.retriever, self.settings, self.final_docs = llm, retriever, settings, final_docs
        lc = settings.loop
        self.docs_layout = PromptSet.for_loop(lc)
        self.system = lc.system_prompt

    def render(self, template: str, **values: str) -> list[Message]:
        text = Template((PROMPT_DIR / f"{template}.txt").read_text(encoding="utf-8")).substitute(**values).strip()
        msgs: list[Message] = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": text}]

    def sampling(self, max_tokens: int) -> SamplingParams:
        return loop_sampling(self.settings.loop, max_tokens)

    def new_trace(self, q: Question) -> Trace:
        return Trace(question=q, method=self.name, index_format="", stop_reason="",
                     extra={"llm": getattr(self.llm, "name", ""), "retriever": getattr(self.retriever, "name", "")})

    def docs(self, q: Question, docs: list[ScoredPassage], *, can_answer: bool) -> str:
        """The documents as a prompt shows them. The robustness order (final_docs) applies, as in
        every method, to the documents of a call whose output can be the answer (the paper's study
        moves evidence "during answer generation"); other calls see retrieval order."""
        if can_answer and self.final_docs:
            docs = self.final_docs(q, docs)
        return self.docs_layout.format_documents(docs)

    def step(self, n: int, query: str, docs, prompt=None, c: Completion | None = None, wall: float = 0.0) -> Step:
        return Step(step=n, query=query, retrieved=list(docs), prompt=prompt or [],
                    raw_output=c.text if c else "", index=empty_index("none"), reasoning=c.text if c else "",
                    judgment="insufficient", next_query=None,
                    prompt_tokens=c.prompt_tokens if c else 0, completion_tokens=c.completion_tokens if c else 0,
                    wall_time_s=wall)

    def done(self, traces: list[Trace], t0: float, progress: ProgressFn | None) -> list[Trace]:
        """Share the batch's wall time among its questions (as the loop does) and report progress."""
        wall = (time.perf_counter() - t0) / max(1, len(traces))
        for t in traces:
            t.wall_time_s = wall
        if progress:
            progress(len(traces))
        return traces

    def finish(self, t: Trace, prompt, c: Completion, answer: str) -> None:
        t.final_prompt, t.final_output, t.answer = prompt, c.text, answer
        t.final_prompt_tokens, t.final_completion_tokens = c.prompt_tokens, c.completion_tokens


_SO_THE_ANSWER = re.compile(r"so\s+the\s+answer\s+is\s*[:：]?\s*(.*)", re.IGNORECASE | re.DOTALL)


def answer_after_marker(text: str) -> str | None:
    m = _SO_THE_ANSWER.search(text)
    return extract_answer(m.group(1)) if m else None


@register_method("vanilla")
class Vanilla(_Baseline):
    name = "vanilla"

    def run(self, questions, progress=None):
        t0 = time.perf_counter()
        traces = [self.new_trace(q) for q in questions]
        retrieved = self.retriever.search([q.question for q in questions], self.settings.vanilla_top_k)
        prompts = [self.render("vanilla", question=q.question, documents=self.docs(q, d, can_answer=True))
                   for q, d in zip(questions, retrieved)]
        outs = generate_isolated(self.llm, prompts, self.sampling(self.settings.loop.answer_max_tokens))
        for t, docs, prompt, c in zip(traces, retrieved, prompts, outs):
            t.steps.append(self.step(1, t.question.question, docs))
            if not _failed(t, c):
                t.stop_reason = "answered"
                self.finish(t, prompt, c, extract_answer(c.text))
        return self.done(traces, t0, progress)


@register_method("iter-retgen")
class IterRetGen(_Baseline):
    """Each iteration retrieves with q0 + the previous generation and generates again from the
    new documents; the last generation's answer is the answer."""

    name = "iter-retgen"

    def run(self, questions, progress=None):
        t0 = time.perf_counter()
        traces = [self.new_trace(q) for q in questions]
        queries = [q.question for q in questions]
        sampling = self.sampling(self.settings.iter_retgen_max_tokens)
        live = list(range(len(questions)))
        for it in range(1, self.settings.iter_retgen_iterations + 1):
            retrieved = self.retriever.search([queries[i] for i in live], self.settings.loop.top_k)
            last = it == self.settings.iter_retgen_iterations  # only the last generation is the answer
            prompts = [self.render("iter_retgen", question=questions[i].question,
                                   documents=self.docs(questions[i], d, can_answer=last))
                       for i, d in zip(live, retrieved)]
            outs = generate_isolated(self.llm, prompts, sampling)
            still = []
            for i, docs, prompt, c in zip(live, retrieved, prompts, outs):
                t = traces[i]
                if _failed(t, c):
                    t.steps.append(self.step(it, queries[i], docs, prompt))
                    continue
                t.steps.append(self.step(it, queries[i], docs, prompt, c))
                queries[i] = f"{questions[i].question} {c.text.strip()}"
                if it == self.settings.iter_retgen_iterations:
                    t.stop_reason = "max_steps"
                    self.finish(t, prompt, c, answer_after_marker(c.text) or extract_answer(c.text))
                else:
                    still.append(i)
            live = still
        return self.done(traces, t0, progress)


@register_method("ircot")
class IRCoT(_Baseline):
    """Retrieve for q0; then repeatedly generate the next reasoning sentence over all documents so
    far and retrieve with it, until the model writes "So the answer is:" or the step budget ends
    (then one answer call over everything)."""

    name = "ircot"

    def run(self, questions, progress=None):
        t0 = time.perf_counter()
        traces = [self.new_trace(q) for q in questions]
        cot = [""] * len(questions)
        queries = [q.question for q in questions]
        sampling = self.sampling(self.settings.ircot_max_tokens)
        live = list(range(len(questions)))
        for n in range(1, self.settings.ircot_max_steps + 1):
            if not live:
                break
            retrieved = self.retriever.search([queries[i] for i in live], self.settings.loop.top_k)
            prompts = []
            for i, docs in zip(live, retrieved):
                traces[i].steps.append(self.step(n, queries[i], docs))
                prompts.append(self.render("ircot_step", question=questions[i].question,
                                           # any step may write "So the answer is"
                                           documents=self.docs(questions[i], traces[i].all_passages(),
                                                               can_answer=True),
                                           reasoning=cot[i] or "(none yet)"))
            outs = generate_isolated(self.llm, prompts, sampling)
            still = []
            for i, prompt, c in zip(live, prompts, outs):
                t = traces[i]
                if _failed(t, c):
                    continue
                sentence = c.text.strip().split("\n")[0].strip()
                t.steps[-1] = self.step(n, queries[i], t.steps[-1].retrieved, prompt, c)
                cot[i] = f"{cot[i]} {sentence}".strip()
                answer = answer_after_marker(c.text)
                if answer is not None:
                    t.stop_reason = "sufficient"
                    self.finish(t, prompt, c, answer)
                else:
                    queries[i] = sentence or questions[i].question
                    still.append(i)
            live = still
        # Out of steps without an answer: one answer call over everything read.
        prompts = [self.render("ircot_answer", question=questions[i].question,
                               documents=self.docs(questions[i], traces[i].all_passages(), can_answer=True),
                               reasoning=cot[i] or "(none)") for i in live]
        outs = generate_isolated(self.llm, prompts, self.sampling(self.settings.loop.answer_max_tokens))
        for i, prompt, c in zip(live, prompts, outs):
            if not _failed(traces[i], c):
                traces[i].stop_reason = "max_steps"
                self.finish(traces[i], prompt, c, extract_answer(c.text))
        return self.done(traces, t0, progress)
