"""Continuous batching for the server: one worker thread owns the KAIR loops and runs their rounds.

    sched = Scheduler(llm, retriever, LoopConfig(), max_batch=64, batch_wait_ms=5)
    sched.start()
    ticket = sched.submit(question, Settings("kr", top_k=5, max_steps=4), notify)
    ...                      # notify("step", trace, step) per step, then notify("answer", trace, None)
    sched.close()

Requests never queue behind a lock one by one. The worker keeps a set of in-flight questions; each
round it admits what arrived since the last round (up to `max_batch` in flight), then calls
`KairLoop.advance()` once per group of questions with equal settings, so every group's LLM call is
one batch. When the worker is idle, the first arrival waits `batch_wait_ms` for others to join it.

Per-request settings (index format, top_k, max_steps) change the prompts and the stopping rule, so
each combination gets its own KairLoop; all of them share the one llm and retriever objects.

`notify` is called on the worker thread. The loop records backend errors in `Trace.error`; a
failure the loop does not isolate (the retriever raising, say) is recorded the same way on every
question of that group, so a caller always gets exactly one "answer" per ticket.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kair_runtime.config import LoopConfig
from kair_runtime.llm.base import LLM, check_no_repeat_ngram
from kair_runtime.loop import KairLoop, QuestionState
from kair_runtime.records import Question, Step, Trace
from kair_runtime.retrieval.base import Retriever
from kair_runtime.runtime import build_loop

log = logging.getLogger("kair.serve")

Notify = Callable[[str, Trace, Step | None], None]  # ("step" | "answer", trace, step)


@dataclass(frozen=True)
class Settings:
    """The per-request loop settings; requests with equal settings share a batch."""

    index_format: str
    top_k: int
    max_steps: int


class SchedulerBusy(RuntimeError):
    """The queue is full or the scheduler is shutting down: the caller should answer 503."""


class Ticket:
    """One submitted question. `cancel()` drops it at the next round boundary."""

    def __init__(self, question: Question, settings: Settings, notify: Notify):
        self.question = question
        self.settings = settings
        self.notify = notify
        self.submitted = time.perf_counter()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


@dataclass
class _InFlight:
    ticket: Ticket
    state: QuestionState


@dataclass
class SchedulerStats:
    rounds: int = 0
    admitted: int = 0
    answered: int = 0
    cancelled: int = 0
    max_in_flight: int = 0


class Scheduler:
    def __init__(self, llm: LLM, retriever: Retriever, base: LoopConfig, *, max_batch: int = 64,
                 batch_wait_ms: float = 5.0, max_queue: int = 1024, on_round: Callable[[int], None] | None = None):
        """`on_round(n)` is called on the worker thread before each round with the n questions it
        advances (the server's batch-size metric)."""
        check_no_repeat_ngram(llm, base.no_repeat_ngram)  # at startup: loops are built per request later
        self.llm = llm
        self.retriever = retriever
        self.base = base
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.stats = SchedulerStats()
        self.on_round = on_round
        self._inbox: queue.Queue[Ticket] = queue.Queue(maxsize=max_queue)
        self._loops: dict[Settings, KairLoop] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ caller side (any thread)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kair-scheduler", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the current round; questions still waiting or in flight are abandoned (their
        callers time out or are told the server is shutting down by the app)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def submit(self, question: Question, settings: Settings, notify: Notify) -> Ticket:
        if not self.running:
            raise SchedulerBusy("the scheduler is not running (server starting up or shutting down)")
        ticket = Ticket(question, settings, notify)
        try:
            self._inbox.put_nowait(ticket)
        except queue.Full:
            raise SchedulerBusy(f"server busy: {self._inbox.maxsize} requests already waiting") from None
        return ticket

    def queued(self) -> int:
        return self._inbox.qsize()

    def loop_for(self, settings: Settings) -> KairLoop:
        """The loop for one settings combination, built on first use (worker thread only)."""
        loop = self._loops.get(settings)
        if loop is None:
            cfg = dataclasses.replace(self.base, index_format=settings.index_format, top_k=settings.top_k,
                                      max_steps=settings.max_steps)
            loop = self._loops[settings] = build_loop(self.llm, self.retriever, cfg)
        return loop

    # ------------------------------------------------------------ worker thread

    def _run(self) -> None:
        active: list[_InFlight] = []
        while not self._stop.is_set():
            active = self._admit(active)
            active = [f for f in active if not self._drop_if_cancelled(f)]
            if not active:
                continue
            self.stats.rounds += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, len(active))
            if self.on_round is not None:
                self.on_round(len(active))
            for settings, group in _group(active).items():
                self._advance(settings, group)
            done = [f for f in active if f.state.answered]
            self.stats.answered += len(done)
            active = [f for f in active if not f.state.answered]
        self._abandon(active)

    def _abandon(self, active: list[_InFlight]) -> None:
        """On close, answer everything still in flight or waiting with an error, so no caller
        waits for its timeout."""
        for f in active:
            _fail(f.state, "server shutting down")
        while True:
            try:
                t = self._inbox.get_nowait()
            except queue.Empty:
                return
            _fail(QuestionState(trace=Trace(question=t.question), query=t.question.question,
                                on_event=_safe(t.notify)), "server shutting down")

    def _admit(self, active: list[_InFlight]) -> list[_InFlight]:
        """Take new tickets up to max_batch in flight. Idle: block briefly for the first one, then
        give others `batch_wait_s` to arrive. Busy: take whatever is waiting, without waiting."""
        room = self.max_batch - len(active)
        if room <= 0:
            return active
        new: list[Ticket] = []
        if not active:
            try:
                new.append(self._inbox.get(timeout=0.1))  # short, so close() is noticed
            except queue.Empty:
                return active
            deadline = time.perf_counter() + self.batch_wait_s
            while len(new) < room and (left := deadline - time.perf_counter()) > 0:
                try:
                    new.append(self._inbox.get(timeout=left))
                except queue.Empty:
                    break
        while len(new) < room:
            try:
                new.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for t in new:
            if t.cancelled:
                self.stats.cancelled += 1
                continue
            notify = _safe(t.notify)
            try:
                state = self.loop_for(t.settings).start(t.question, on_event=notify)
            except Exception as e:  # noqa: BLE001 - e.g. a prompt_dir without this format's templates
                log.exception("could not start a loop for %s", t.settings)
                _fail(QuestionState(trace=Trace(question=t.question), query=t.question.question,
                                    on_event=notify), f"{type(e).__name__}: {e}")
                continue
            active.append(_InFlight(t, state))
            self.stats.admitted += 1
        return active

    def _drop_if_cancelled(self, f: _InFlight) -> bool:
        if f.ticket.cancelled and not f.state.answered:
            self.stats.cancelled += 1
            return True
        return False

    def _advance(self, settings: Settings, group: list[_InFlight]) -> None:
        try:
            self.loop_for(settings).advance([f.state for f in group])
        except Exception as e:  # noqa: BLE001 - the loop isolates LLM errors, not retriever ones
            log.exception("loop round failed for %d question(s)", len(group))
            for f in group:
                if not f.state.answered:
                    _fail(f.state, f"{type(e).__name__}: {e}")


def _group(active: list[_InFlight]) -> dict[Settings, list[_InFlight]]:
    groups: dict[Settings, list[_InFlight]] = {}
    for f in active:
        groups.setdefault(f.ticket.settings, []).append(f)
    return groups


def _safe(notify: Notify) -> Notify:
    """A caller's callback must never take the worker thread down with it."""
    def call(kind: str, trace: Trace, step: Step | None) -> None:
        try:
            notify(kind, trace, step)
        except Exception:  # noqa: BLE001
            log.exception("a request's event callback failed; that request will time out")
    return call


def _fail(state: QuestionState, error: str) -> None:
    """Finish a question the loop could not, the way the loop records its own errors."""
    tr = state.trace
    tr.error, tr.stop_reason = error, "error"
    state.done = state.answered = True
    tr.wall_time_s = time.perf_counter() - state.started
    if state.on_event:
        state.on_event("answer", tr, None)
