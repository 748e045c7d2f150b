"""The KAIR loop (paper section 3.1), batched across questions.

    step 1:   D_1 = Retriever(q0);           {I_1, R_1, q_1} = LLM(init prompt: q0, D_1)
    step t:   D_t = Retriever(q_{t-1});      {I_t, R_t, q_t} = LLM(update prompt: q0, D_t, o_{t-1})
    stop when R_t judges the knowledge sufficient, or after max_steps;
    answer:   y = LLM(q0, D_1 ∪ ... ∪ D_k, I_k)

`KairLoop.run(questions)` advances every unfinished question by one step per round, with one
batched retrieval call and one batched LLM call per round, so a vLLM engine or a padded HF
generate sees many sequences at once. Questions that stop searching leave the batch and are
answered together in one more batched call in the same round. `start()`/`advance()` expose the
rounds so a server can add requests to the batch between rounds; `iter_run()` yields each trace
the moment it is answered (a teacher appends it to its file then).

Greedy decoding is a function of the prompt, so a step whose prompt repeats an earlier step's of
the same question reuses that step's output instead of calling the model again
(`loop.reuse_repeated_steps`; its step numbers are in `Trace.extra["reused_steps"]`).

An LLM that needs to know which question a call is for (silver's gold oracle, which writes the
step the annotations imply for the documents actually retrieved) implements `generate_for`: the
loop then hands it the questions' states and whether the call is a step or the answer.

Nothing here raises for a single bad question: a backend error on one question is isolated
(the batch is retried one prompt at a time), recorded in `Trace.error`, and the question still
gets a trace (and counts, scored 0, in eval). The exception is a backend that can answer nothing
more (BackendDeadError, a dead vLLM engine): that stops the run, and what finished is kept.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

from kair_runtime.config import LoopConfig
from kair_runtime.index import empty_index
from kair_runtime.grammar import GrammarBounds, answer_grammar, longest, step_grammar
from kair_runtime.llm.base import (LLM, BackendDeadError, Completion, SamplingParams, check_grammar,
                                   check_no_repeat_ngram)
from kair_runtime.parser import parse_step_output
from kair_runtime.prompts import PromptSet
from kair_runtime.records import FALLBACK_RETRIEVAL_EMPTY, Message, Question, ScoredPassage, Step, Trace
from kair_runtime.retrieval.base import Retriever

ProgressFn = Callable[[int], None]  # called with the number of questions just answered
EventFn = Callable[[str, Trace, Step | None], None]  # ("step" | "answer", trace, step)
FinalDocsFn = Callable[[Question, list[ScoredPassage]], list[ScoredPassage]]
StartFn = Callable[["QuestionState"], None]  # called on every state right after start()

STEP, ANSWER = "step", "answer"  # the two kinds of LLM call a round makes
# Trace.extra key: the numbers of the steps whose output was reused, not generated (_repeat_of).
REUSED_STEPS = "reused_steps"


@dataclass
class QuestionState:
    """A question in flight: `advance()` moves it one step; `answered` when its trace is complete."""

    trace: Trace
    query: str  # the query the next step retrieves with
    on_event: EventFn | None = None  # serve streams steps through this
    started: float = field(default_factory=time.perf_counter)
    done: bool = False  # no more steps (sufficient, max_steps or error)
    answered: bool = False
    retrieved: list[ScoredPassage] = field(default_factory=list)  # this step's documents, set before generating


class StateAwareLLM(Protocol):
    """An LLM that answers for known questions: `generate_for(kind, states, prompts, sampling)`,
    kind STEP or ANSWER, one completion per state/prompt, in order. The loop prefers it to
    `generate` when an LLM has it."""

    name: str

    def generate_for(self, kind: str, states: list[QuestionState], prompts: list[list[Message]],
                     sampling: SamplingParams) -> list[Completion]: ...


def loop_sampling(cfg: LoopConfig, max_tokens: int, grammar: str | None = None) -> SamplingParams:
    """The sampling of every call the loop (or a baseline on its settings) makes."""
    # A structured call may run to its grammar's longest output (a token is at least one
    # character), so the grammar ends every output, valid, and the token cap never cuts one.
    if grammar is not None:
        max_tokens = max(max_tokens, longest(grammar))
    return SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=max_tokens, seed=cfg.seed,
                          no_repeat_ngram=cfg.no_repeat_ngram, grammar=grammar)


class KairLoop:
    def __init__(self, llm: LLM | StateAwareLLM, retriever: Retriever, config: LoopConfig | None = None,
                 prompts: PromptSet | None = None, final_docs: FinalDocsFn | None = None, answers: bool = True):
        self.llm = llm
        self.retriever = retriever
        # Reorders the answer prompt's documents (eval's shuffle and gold-position studies).
        self.final_docs = final_docs
        # False: the loop only searches and its traces end without an answer (the no-evolving
        # ablation builds an index afterwards and answers from that).
        self.answers = answers
        self.cfg = config or LoopConfig()
        check_no_repeat_ngram(llm, self.cfg.no_repeat_ngram)
        check_grammar(llm, self.cfg.structured)
        self.prompts = prompts or PromptSet.for_loop(self.cfg)
        self.step_sampling = self._sampling(self.cfg.step_max_tokens, self._grammar(STEP))
        self.answer_sampling = self._sampling(self.cfg.answer_max_tokens, self._grammar(ANSWER))
        # A state-aware LLM's output depends on more than its prompt, and a sampled one on chance.
        self.reuses_steps = (self.cfg.reuse_repeated_steps and self.step_sampling.greedy
                             and not hasattr(llm, "generate_for"))

    def _sampling(self, max_tokens: int, grammar: str | None) -> SamplingParams:
        return loop_sampling(self.cfg, max_tokens, grammar)

    @staticmethod
    def grammar_bounds(c: LoopConfig) -> GrammarBounds:
        return GrammarBounds(max_entries=c.max_index_entries, entry_words=c.max_entry_words,
                             reasoning_words=c.max_reasoning_words, query_words=c.max_query_words,
                             answer_words=c.max_answer_words, word_chars=c.max_word_chars)

    def _grammar(self, kind: str) -> str | None:
        """The structured mode's grammar for a step or answer call; None when it is off."""
        if not self.cfg.structured:
            return None
        bounds = self.grammar_bounds(self.cfg)
        return step_grammar(self.cfg.index_format, bounds) if kind == STEP else answer_grammar(bounds)

    # ------------------------------------------------------------ public

    def run(self, questions: list[Question], progress: ProgressFn | None = None,
            on_start: StartFn | None = None) -> list[Trace]:
        """Run every question to its answer; traces come back in input order. `on_start` sees
        every state, in input order, before the first round."""
        states = self._start_all(questions, on_start)
        for finished in self._rounds(states):
            if progress:
                progress(len(finished))
        return [s.trace for s in states]

    def iter_run(self, questions: list[Question], on_start: StartFn | None = None) -> Iterator[Trace]:
        """The rounds of `run`, yielding each trace the moment its question is answered (within a
        round, in input order)."""
        for finished in self._rounds(self._start_all(questions, on_start)):
            yield from (s.trace for s in finished)

    def run_one(self, question: Question) -> Trace:
        return self.run([question])[0]

    def _start_all(self, questions: list[Question], on_start: StartFn | None) -> list[QuestionState]:
        states = [self.start(q) for q in questions]
        if on_start:
            for s in states:
                on_start(s)
        return states

    def _rounds(self, states: list[QuestionState]) -> Iterator[list[QuestionState]]:
        """Advance the states round by round, yielding the ones answered in each round. At most
        `round_size` questions are in flight at once; a finished one makes room for the next."""
        queue, active = list(states), []
        size = max(1, self.cfg.round_size)
        while queue or active:
            while queue and len(active) < size:
                active.append(queue.pop(0))
            self.advance(active)
            finished = [s for s in active if s.answered]
            active = [s for s in active if not s.answered]
            if finished:
                yield finished

    def start(self, question: Question, on_event: EventFn | None = None) -> QuestionState:
        trace = Trace(question=question, method="kair", index_format=self.prompts.format,
                      extra={"prompt_version": self.prompts.version, "llm": getattr(self.llm, "name", ""),
                             "retriever": getattr(self.retriever, "name", "")})
        return QuestionState(trace=trace, query=question.question, on_event=on_event)

    def advance(self, states: list[QuestionState]) -> None:
        """One round: a batched step for every question still searching, then a batched answer
        for every question that stopped searching (in this round or before)."""
        stepping = [s for s in states if not s.done]
        if stepping:
            self._step_round(stepping)
        answering = [s for s in states if s.done and not s.answered]
        if answering:
            self._answer_round(answering)

    # ------------------------------------------------------------ rounds

    def _step_round(self, active: list[QuestionState]) -> None:
        t0 = time.perf_counter()
        retrieved = self.retriever.search([s.query for s in active], self.cfg.top_k)
        for s, docs in zip(active, retrieved):
            s.retrieved = list(docs)
        prompts = [self._step_prompt(s, docs) for s, docs in zip(active, retrieved)]
        completions: list[Completion | None] = [self._repeat_of(s, p) for s, p in zip(active, prompts)]
        reused = [c is not None for c in completions]
        fresh = [i for i, r in enumerate(reused) if not r]
        if fresh:
            made = self._generate(STEP, [active[i] for i in fresh], [prompts[i] for i in fresh], self.step_sampling)
            for i, c in zip(fresh, made):
                completions[i] = c
        # The round's wall time is shared by the batch: each step records its share.
        per_q = (time.perf_counter() - t0) / len(active)
        for s, docs, prompt, c, r in zip(active, retrieved, prompts, completions, reused):
            if c is not None:  # None: backend error, already recorded on the trace
                self._record_step(s, docs, prompt, c, per_q)
                if r:
                    s.trace.extra.setdefault(REUSED_STEPS, []).append(s.trace.steps[-1].step)

    def _repeat_of(self, s: QuestionState, prompt: list[Message]) -> Completion | None:
        """The completion an earlier step of this question gave for this very prompt, when the loop
        may reuse it (loop.reuse_repeated_steps, greedy, a prompt-only LLM); else None."""
        if not self.reuses_steps:
            return None
        for step in s.trace.steps:
            if step.prompt == prompt:
                return Completion(text=step.raw_output, prompt_tokens=step.prompt_tokens,
                                  completion_tokens=step.completion_tokens)
        return None

    def _step_prompt(self, s: QuestionState, docs) -> list[Message]:
        q0 = s.trace.question.question
        if not s.trace.steps:
            return self.prompts.init(q0, docs)
        prev = s.trace.steps[-1]
        return self.prompts.update(q0, docs, prev.index, prev.reasoning, s.query)

    def _record_step(self, s: QuestionState, docs, prompt, c: Completion, wall: float) -> None:
        tr = s.trace
        prev_index = tr.steps[-1].index if tr.steps else empty_index(self.prompts.format)
        parsed = parse_step_output(c.text, self.prompts.format, prev_index, tr.question.question,
                                   self.prompts.index_update)
        fallbacks = list(parsed.fallbacks)
        if not docs:
            fallbacks.append(FALLBACK_RETRIEVAL_EMPTY)
        step = Step(step=len(tr.steps) + 1, query=s.query, retrieved=list(docs), prompt=prompt,
                    raw_output=c.text, index=parsed.index, reasoning=parsed.reasoning,
                    judgment=parsed.judgment, next_query=parsed.next_query, fallbacks=fallbacks,
                    prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens, wall_time_s=wall)
        tr.steps.append(step)
        if parsed.judgment == "sufficient":
            s.done, tr.stop_reason = True, "sufficient"
        elif step.step >= self.cfg.max_steps:
            s.done, tr.stop_reason = True, "max_steps"
        else:
            s.query = parsed.next_query or tr.question.question
        if s.on_event:
            s.on_event("step", tr, step)

    def _answer_round(self, states: list[QuestionState]) -> None:
        todo = [s for s in states if s.trace.error is None and self.answers]
        prompts = [self.prompts.answer(s.trace.question.question, final_docs_for(s.trace, self.final_docs),
                                       s.trace.final_index, self.cfg.answer_mode) for s in todo]
        completions = self._generate(ANSWER, todo, prompts, self.answer_sampling)
        for s, prompt, c in zip(todo, prompts, completions):
            if c is not None:
                tr = s.trace
                tr.final_prompt, tr.final_output = prompt, c.text
                tr.answer = extract_answer(c.text)
                tr.final_prompt_tokens, tr.final_completion_tokens = c.prompt_tokens, c.completion_tokens
        for s in states:
            s.answered = True
            s.trace.wall_time_s = time.perf_counter() - s.started
            if s.on_event:
                s.on_event("answer", s.trace, None)

    def _generate(self, kind: str, states: list[QuestionState], prompts: list[list[Message]],
                  sampling: SamplingParams) -> list[Completion | None]:
        hook = getattr(self.llm, "generate_for", None)
        if hook is not None:
            def call(idx: list[int]) -> list[Completion]:
                return hook(kind, [states[i] for i in idx], [prompts[i] for i in idx], sampling)
        else:
            def call(idx: list[int]) -> list[Completion]:
                return self.llm.generate([prompts[i] for i in idx], sampling)
        out: list[Completion | None] = []
        for s, c in zip(states, _isolated(call, len(prompts))):
            if isinstance(c, Exception):
                s.done = True
                record_failure(s.trace, c)
                c = None
            out.append(c)
        return out


def final_docs_for(trace: Trace, final_docs: FinalDocsFn | None) -> list[ScoredPassage]:
    """The documents an answer prompt shows: every retrieved one (Eq. 2), in the order
    `final_docs` gives them when set."""
    docs = trace.all_passages()
    return final_docs(trace.question, docs) if final_docs else docs


def record_failure(trace: Trace, exc: Exception) -> None:
    """A backend error on this question: recorded, and the question stops there."""
    trace.error, trace.stop_reason = f"{type(exc).__name__}: {exc}", "error"


def generate_isolated(llm: LLM, prompts: list[list[Message]], sampling: SamplingParams) -> list[Completion | Exception]:
    """One batched call; if the backend fails, the batch is split in halves until each failure is
    one prompt's, so one bad prompt (an over-long one, say) neither takes the others down with it
    nor turns a round of hundreds into hundreds of single calls. Failures come back as exceptions,
    in place, for the caller to record."""
    return _isolated(lambda idx: llm.generate([prompts[i] for i in idx], sampling), len(prompts))


def _isolated(call: Callable[[list[int]], list[Completion]], n: int) -> list[Completion | Exception]:
    """generate_isolated over any batched call of the items at these positions."""
    return _halving(call, list(range(n))) if n else []


def _halving(call: Callable[[list[int]], list[Completion]], idx: list[int]) -> list[Completion | Exception]:
    try:
        out = call(idx)
        if len(out) != len(idx):
            raise RuntimeError(f"backend returned {len(out)} completions for {len(idx)} prompts")
        return list(out)
    except BackendDeadError:
        raise  # no prompt can succeed any more: stop the run, not record one failure per question
    except Exception as e:
        if len(idx) == 1:
            return [e]
    mid = len(idx) // 2
    return _halving(call, idx[:mid]) + _halving(call, idx[mid:])


_ANSWER_PREFIX = re.compile(r"^\s*(?:(?:the|my)\s+)?(?:final\s+)?answer\s*(?:is)?\s*[:：-]\s*", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<\s*answer\s*>(.*?)(?:<\s*/\s*answer\s*>|$)", re.IGNORECASE | re.DOTALL)


def extract_answer(text: str) -> str:
    """The short answer from the answer call: an <answer> tag if any, else the first non-empty line,
    without an "Answer:" prefix, quotes or a trailing period."""
    m = _ANSWER_TAG.search(text)
    if m:
        text = m.group(1)
    for line in text.splitlines():
        line = _ANSWER_PREFIX.sub("", line.strip()).strip().strip("\"'`*“”").strip()
        if line:
            return line[:-1].rstrip() if line.endswith(".") and not line.endswith("..") else line
    return ""
