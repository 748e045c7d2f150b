"""The batching worker on its own: continuous batching, grouping by settings, cancel, close."""

from __future__ import annotations

import threading
import time

import pytest

from serve_helpers import GatedLLM, insufficient_kair
from kair_runtime.config import LoopConfig
from kair_runtime.llm.scripted import ScriptedLLM, echo_kair
from kair_runtime.records import Question
from kair_runtime.serve.scheduler import Scheduler, Settings
from lexical import WordOverlap

KR3 = Settings("kr", top_k=3, max_steps=3)


class Collector:
    """A notify callback that keeps every event and signals when the answer arrives."""

    def __init__(self):
        self.events: list[tuple[str, int | None]] = []
        self.trace = None
        self.done = threading.Event()

    def __call__(self, kind, trace, step):
        self.events.append((kind, step.step if step else None))
        if kind == "answer":
            self.trace = trace
            self.done.set()


def q(i: int) -> Question:
    return Question(id=f"q{i}", question=f"When was Coldplay formed in London? ({i})")


def test_a_late_request_joins_the_running_batch_between_rounds():
    llm = GatedLLM(insufficient_kair)  # round 1 (A's first step) waits for the gate
    sched = Scheduler(llm, WordOverlap(), LoopConfig(), batch_wait_ms=0)
    sched.start()
    try:
        a, b = Collector(), Collector()
        sched.submit(q(0), KR3, a)
        assert llm.entered.wait(5)
        sched.submit(q(1), KR3, b)  # arrives while A's round is running
        llm.gate.set()
        assert a.done.wait(5) and b.done.wait(5)
    finally:
        sched.close()
    # A ran 3 steps + answer alone at first; B joined in round 2, so one call held both.
    assert llm.calls[0] == 1 and 2 in llm.calls
    assert [e for e in a.events if e[0] == "step"] == [("step", 1), ("step", 2), ("step", 3)]
    assert a.trace.stop_reason == b.trace.stop_reason == "max_steps"
    assert sched.stats.max_in_flight == 2 and sched.stats.answered == 2


def test_requests_with_other_settings_get_their_own_loop_and_batch():
    llm = ScriptedLLM(insufficient_kair)
    sched = Scheduler(llm, WordOverlap(), LoopConfig(), batch_wait_ms=200)
    settings = [KR3, Settings("facts", top_k=1, max_steps=1)]
    collectors = [Collector() for _ in range(8)]
    sched.start()
    try:
        for i, c in enumerate(collectors):
            sched.submit(q(i), settings[i % 2], c)
        assert all(c.done.wait(5) for c in collectors)
    finally:
        sched.close()
    for i, c in enumerate(collectors):
        s = settings[i % 2]
        assert c.trace.index_format == s.index_format and len(c.trace.steps) == s.max_steps
        assert all(len(st.retrieved) <= s.top_k for st in c.trace.steps)
    assert llm.calls[0] == 4  # the first round: one call per settings group of 4
    assert set(sched._loops) == set(settings)


def test_max_batch_bounds_the_questions_in_flight():
    llm = ScriptedLLM(echo_kair)
    sched = Scheduler(llm, WordOverlap(), LoopConfig(), max_batch=3, batch_wait_ms=200)
    collectors = [Collector() for _ in range(7)]
    sched.start()
    try:
        for i, c in enumerate(collectors):
            sched.submit(q(i), KR3, c)
        assert all(c.done.wait(5) for c in collectors)
    finally:
        sched.close()
    assert max(llm.calls) <= 3 and sched.stats.max_in_flight == 3 and sched.stats.answered == 7


def test_a_cancelled_request_leaves_the_batch():
    llm = GatedLLM(insufficient_kair)
    sched = Scheduler(llm, WordOverlap(), LoopConfig(), batch_wait_ms=0)
    sched.start()
    try:
        a = Collector()
        ticket = sched.submit(q(0), KR3, a)
        assert llm.entered.wait(5)
        ticket.cancel()  # e.g. the client went away mid-round
        llm.gate.set()
        deadline = time.monotonic() + 5
        while sched.stats.cancelled == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sched.close()
    assert sched.stats.cancelled == 1 and not a.done.is_set()
    assert a.events == [("step", 1)]  # the round in progress finished; no further rounds ran
    assert len(llm.calls) == 1


def test_close_answers_everything_left_with_an_error():
    llm = GatedLLM(insufficient_kair)
    sched = Scheduler(llm, WordOverlap(), LoopConfig(), max_batch=1, batch_wait_ms=0)
    sched.start()
    a, b = Collector(), Collector()
    sched.submit(q(0), KR3, a)
    assert llm.entered.wait(5)
    sched.submit(q(1), KR3, b)  # waits in the queue: max_batch is 1
    closer = threading.Thread(target=sched.close)
    closer.start()
    deadline = time.monotonic() + 5
    while sched.running and time.monotonic() < deadline:  # stop is requested before the round ends
        time.sleep(0.001)
    llm.gate.set()
    closer.join(5)
    assert a.done.is_set() and b.done.is_set()
    assert a.trace.error == b.trace.error == "server shutting down"
    assert not sched.running


def test_a_loop_setting_the_backend_cannot_honour_fails_at_startup():
    from kair_runtime.llm.base import BackendError

    with pytest.raises(BackendError, match="cannot ban repeated n-grams"):
        Scheduler(ScriptedLLM(echo_kair), WordOverlap(), LoopConfig(no_repeat_ngram=24))
