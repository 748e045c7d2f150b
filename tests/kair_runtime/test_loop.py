"""The KAIR loop with a deterministic LLM and a small lexical retriever."""

from __future__ import annotations

import dataclasses

import pytest

from kair_runtime.config import LoopConfig
from kair_runtime.index import INDEX_UPDATE_RULES, get_format
from kair_runtime.llm.base import BackendDeadError, BackendError, Completion, SamplingParams
from kair_runtime.llm.scripted import ScriptedLLM, echo_kair
from kair_runtime.loop import (ANSWER, STEP, KairLoop, extract_answer, final_docs_for, generate_isolated,
                               record_failure)
from kair_runtime.records import Question, Trace
from lexical import WordOverlap

QUESTIONS = [Question(id=f"q{i}", question=q, answers=["x"]) for i, q in enumerate([
    "Lost! is a song by a British rock band formed in what year?",
    "Which city was the band behind Wonderwall formed in?",
    "Was Blur formed before Coldplay?",
    "What album did Coldplay release in 2008?",
    "Which band is older, Oasis or Blur?",
    "Where is the capital of England?",
    "Who sang Viva la Vida?",
    "Name a song by Oasis.",
    "When was Oasis formed?",
    "zzz qqq nothing matches this",
])]


def without_times(tr: Trace) -> dict:
    d = tr.to_dict()
    d.pop("wall_time_s")
    for s in d["steps"]:
        s.pop("wall_time_s")
    return d


def test_batched_run_equals_one_at_a_time():
    cfg = LoopConfig(max_steps=4, top_k=3)
    batched_llm = ScriptedLLM(echo_kair)
    batched = KairLoop(batched_llm, WordOverlap(), cfg).run(QUESTIONS)
    single = [KairLoop(ScriptedLLM(echo_kair), WordOverlap(), cfg).run_one(q) for q in QUESTIONS]
    assert [without_times(t) for t in batched] == [without_times(t) for t in single]
    # The first round sends every question in one LLM call.
    assert batched_llm.calls[0] == len(QUESTIONS)
    stops = {t.stop_reason for t in batched}
    assert stops <= {"sufficient", "max_steps"} and len(stops) == 2  # the hash splits them


def test_round_size_bounds_the_batch_and_keeps_order():
    cfg = LoopConfig(max_steps=3, top_k=2, round_size=3)
    llm, ret = ScriptedLLM(echo_kair), WordOverlap()
    traces = KairLoop(llm, ret, cfg).run(QUESTIONS)
    assert [t.question.id for t in traces] == [q.id for q in QUESTIONS]
    assert max(llm.calls) <= 3 and max(ret.calls) <= 3
    full = KairLoop(ScriptedLLM(echo_kair), WordOverlap(), dataclasses.replace(cfg, round_size=64)).run(QUESTIONS)
    assert [without_times(t) for t in traces] == [without_times(t) for t in full]


def test_step_records_follow_the_paper_algorithm():
    cfg = LoopConfig(max_steps=4, top_k=3)
    tr = KairLoop(ScriptedLLM(echo_kair), WordOverlap(), cfg).run_one(QUESTIONS[0])
    assert tr.steps[0].query == QUESTIONS[0].question  # D_1 = Retriever(q0)
    assert "Retrieved documents" in tr.steps[0].prompt[-1]["content"]  # init prompt
    for prev, step in zip(tr.steps, tr.steps[1:]):
        assert prev.judgment == "insufficient"
        assert step.query == prev.next_query  # D_t = Retriever(q_{t-1})
        content = step.prompt[-1]["content"]
        assert "Your previous index" in content and prev.next_query in content  # o_{t-1} is shown
    last = tr.steps[-1]
    assert (last.judgment == "sufficient") == (tr.stop_reason == "sufficient")
    assert len(tr.steps) <= 4
    # The answer prompt holds the union of retrieved docs, deduplicated, first-seen order.
    union = tr.all_passages()
    ids = [p.id for s in tr.steps for p in s.retrieved]
    assert [p.id for p in union] == list(dict.fromkeys(ids))
    final = tr.final_prompt[-1]["content"]
    positions = [final.index(f"] {p.title}:") for p in union]
    assert positions == sorted(positions)
    assert "Relationships:" in final  # the final index (Eq. 6)
    assert tr.answer == extract_answer(tr.final_output)


def test_trace_json_roundtrip():
    tr = KairLoop(ScriptedLLM(echo_kair), WordOverlap(), LoopConfig(max_steps=2)).run_one(QUESTIONS[1])
    assert Trace.from_json(tr.to_json()).to_dict() == tr.to_dict()


def test_garbage_model_output_finishes_every_question_with_counted_fallbacks():
    garbage = ScriptedLLM(lambda m: "I think the answer is maybe something??")
    traces = KairLoop(garbage, WordOverlap(), LoopConfig(max_steps=3)).run(QUESTIONS)
    for tr in traces:
        assert tr.error is None and tr.stop_reason == "max_steps" and len(tr.steps) == 3
        for s in tr.steps:
            assert not s.parsed_ok
            assert {"index_missing", "judgment_missing", "query_missing"} <= set(s.fallbacks)
            assert s.next_query.startswith(tr.question.question)
        assert tr.answer  # the answer call still ran


def test_backend_error_is_isolated_to_its_question():
    def flaky(messages):
        if "Wonderwall" in messages[-1]["content"]:
            raise RuntimeError("prompt too long for this model")
        return echo_kair(messages)

    traces = KairLoop(ScriptedLLM(flaky), WordOverlap(), LoopConfig(max_steps=2)).run(QUESTIONS)
    failed = [t for t in traces if t.error]
    assert failed and all("prompt too long" in t.error and t.stop_reason == "error" for t in failed)
    ok = [t for t in traces if not t.error]
    assert ok and all(t.answer for t in ok)
    assert len(traces) == len(QUESTIONS)


def test_one_bad_prompt_in_a_large_batch_costs_a_few_calls_not_one_per_prompt():
    calls = []

    class OneBad:
        name = "one-bad"

        def generate(self, prompts, sampling):
            calls.append(len(prompts))
            if any("q37" in p[-1]["content"] for p in prompts):
                raise ValueError("prompt q37 is longer than max_model_len")
            return [Completion(text=p[-1]["content"]) for p in prompts]

    prompts = [[{"role": "user", "content": f"q{i}."}] for i in range(64)]
    out = generate_isolated(OneBad(), prompts, SamplingParams())
    assert isinstance(out[37], ValueError)
    assert [c.text for i, c in enumerate(out) if i != 37] == [f"q{i}." for i in range(64) if i != 37]
    assert len(calls) <= 1 + 2 * 6 and sum(calls) <= 64 * 3  # halving: 13 calls, not 1 + 64


def test_a_dead_backend_stops_the_run_instead_of_failing_every_question():
    calls = []

    def dies(messages):
        calls.append(1)
        if len(calls) > 3:
            raise BackendDeadError("vllm:x: the vLLM engine died")
        return echo_kair(messages)

    with pytest.raises(BackendDeadError, match="engine died"):
        KairLoop(ScriptedLLM(dies), WordOverlap(), LoopConfig(max_steps=2)).run(QUESTIONS)
    assert len(calls) <= 5  # the batch, then one isolated retry: no call per remaining question


def test_empty_retrieval_is_recorded():
    tr = KairLoop(ScriptedLLM(echo_kair), WordOverlap(), LoopConfig(max_steps=1)).run_one(QUESTIONS[-1])
    assert tr.steps[0].retrieved == []
    assert "retrieval_empty" in tr.steps[0].fallbacks
    assert "no documents were retrieved" in tr.steps[0].prompt[-1]["content"]


@pytest.mark.parametrize("fmt", ["kr", "text", "keywords", "facts", "kf"])
def test_every_index_format_runs(fmt):
    tr = KairLoop(ScriptedLLM(echo_kair), WordOverlap(), LoopConfig(index_format=fmt, max_steps=2)).run_one(QUESTIONS[0])
    assert tr.index_format == fmt and tr.steps[0].index.format == fmt


def test_events_stream_steps_then_answer():
    loop = KairLoop(ScriptedLLM(echo_kair), WordOverlap(), LoopConfig(max_steps=3))
    events = []
    state = loop.start(QUESTIONS[0], on_event=lambda kind, tr, step: events.append((kind, step and step.step)))
    while not state.answered:
        loop.advance([state])
    assert events[-1] == ("answer", None)
    assert [e[1] for e in events[:-1]] == list(range(1, len(state.trace.steps) + 1))


@pytest.mark.parametrize("raw,expected", [
    ("Coldplay", "Coldplay"), ("Answer: 1996.", "1996"), ("  \n\"Paris\"\nbecause...", "Paris"),
    ("<answer>yes</answer>", "yes"), ("The answer is: Blur", "Blur"), ("", ""),
])
def test_extract_answer(raw, expected):
    assert extract_answer(raw) == expected


class SamplingLog(ScriptedLLM):
    """The scripted LLM, keeping the sampling settings of every call."""

    bans_repeated_ngrams = True  # its replies are scripted: there is nothing to ban, only settings to pass on

    def __init__(self, respond):
        super().__init__(respond)
        self.seen = []

    def generate(self, prompts, sampling):
        self.seen.append(sampling)
        return super().generate(prompts, sampling)


def test_no_repeat_ngram_reaches_every_step_and_answer_call():
    llm = SamplingLog(echo_kair)
    KairLoop(llm, WordOverlap(), LoopConfig(max_steps=2, top_k=2, no_repeat_ngram=24)).run(QUESTIONS[:3])
    assert {s.max_tokens for s in llm.seen} == {LoopConfig.step_max_tokens, LoopConfig.answer_max_tokens}
    assert {s.no_repeat_ngram for s in llm.seen} == {24}


def test_no_repeat_ngram_on_a_backend_that_cannot_ban_fails_before_any_question():
    with pytest.raises(BackendError, match="scripted cannot ban repeated n-grams"):
        KairLoop(ScriptedLLM(echo_kair), WordOverlap(), LoopConfig(no_repeat_ngram=24))


# One item per format: what a step-1 output writes (A) and what a step-2 output writes instead (B).
ONE_ITEM = {"kr": ("Keywords: Lost!\nRelationships:\nLost! -> is a song by -> Coldplay",
                   "Keywords: 1996\nRelationships:\nColdplay -> formed in -> 1996"),
            "keywords": ("Keywords: Lost!", "Keywords: 1996"),
            "facts": ("Facts:\n- Lost! is a song by Coldplay.", "Facts:\n- Coldplay formed in 1996."),
            "kf": ("Keywords and facts:\nLost!: a song by Coldplay", "Keywords and facts:\nColdplay: formed in 1996"),
            "text": ("Summary: Lost! is a song by Coldplay.", "Summary: Coldplay formed in 1996.")}


@pytest.mark.parametrize("fmt", sorted(ONE_ITEM))
@pytest.mark.parametrize("update", ["merge", "replace"])
def test_index_update_is_one_contract_in_every_format(fmt, update):
    """loop.index_update decides, alike in every format, what the loop keeps of the index the model
    writes, and the update prompt says the same rule. Before, four formats merged and text replaced,
    whatever the prompt said."""
    first, second = ONE_ITEM[fmt]

    def respond(messages):
        step = 1 if "Your previous index" not in messages[-1]["content"] else 2
        return (f"<index>\n{first if step == 1 else second}\n</index>\n"
                f"<reasoning>Judgment: insufficient</reasoning>\n<query>Coldplay formed</query>")
    cfg = LoopConfig(index_format=fmt, max_steps=2, index_update=update)
    tr = KairLoop(ScriptedLLM(respond), WordOverlap(), cfg).run_one(QUESTIONS[0])
    linear = get_format(fmt).linearize(tr.steps[1].index)
    assert ("1996" in linear) and (("Lost!" in linear) == (update == "merge")), linear
    assert INDEX_UPDATE_RULES[update] in tr.steps[1].prompt[-1]["content"]
    assert tr.steps[1].fallbacks == []


def test_iter_run_yields_each_trace_when_answered_and_equals_run():
    cfg = LoopConfig(max_steps=3, top_k=2, round_size=3)
    llm = ScriptedLLM(echo_kair)
    started = []
    it = KairLoop(llm, WordOverlap(), cfg).iter_run(QUESTIONS, on_start=lambda s: started.append(s.trace.question.id))
    first = next(it)
    # Every question was started (and seen by on_start) before the first round; the first trace
    # came back while the later questions had not been sent to the LLM yet.
    assert started == [q.id for q in QUESTIONS]
    assert max(llm.calls) <= 3 and sum(llm.calls) < 3 * len(QUESTIONS)
    order = [first] + list(it)
    assert sorted(t.question.id for t in order) == sorted(q.id for q in QUESTIONS)
    assert [t.question.id for t in order] != [q.id for q in QUESTIONS]  # answer order, not input order
    ran = KairLoop(ScriptedLLM(echo_kair), WordOverlap(), cfg).run(QUESTIONS)
    by_id = {t.question.id: without_times(t) for t in order}
    assert [by_id[t.question.id] for t in ran] == [without_times(t) for t in ran]


class KnowsItsQuestions:
    """A state-aware LLM: writes echo_kair's output, and logs what the loop tells it per call."""

    name = "aware"

    def __init__(self):
        self.calls = []

    def generate_for(self, kind, states, prompts, sampling):
        self.calls.append((kind, [s.trace.question.id for s in states], [len(s.trace.steps) for s in states],
                           [[p.id for p in s.retrieved] for s in states], sampling.max_tokens))
        return [Completion(echo_kair(p)) for p in prompts]

    def generate(self, prompts, sampling):
        raise AssertionError("the loop must call generate_for when an LLM has it")


def test_generate_for_hook_gets_the_kind_states_and_retrieved_documents():
    cfg = LoopConfig(max_steps=3, top_k=2, step_max_tokens=64, answer_max_tokens=64)
    llm = KnowsItsQuestions()
    traces = KairLoop(llm, WordOverlap(), cfg).run(QUESTIONS)
    plain = KairLoop(ScriptedLLM(echo_kair), WordOverlap(), cfg).run(QUESTIONS)
    for t, p in zip(traces, plain):  # the same trace as with generate(), bar the token counts
        a, b = without_times(t), without_times(p)
        for d in (a, b):
            d["extra"].pop("llm")
            d["extra"].pop("reused_steps", None)  # generate() alone may skip repeated prompts
            d["final_prompt_tokens"] = d["final_completion_tokens"] = 0
            for s in d["steps"]:
                s["prompt_tokens"] = s["completion_tokens"] = 0
        assert a == b
    by_id = {t.question.id: t for t in traces}
    kinds = [k for k, *_ in llm.calls]
    assert set(kinds) == {STEP, ANSWER} and kinds[0] == STEP
    for kind, ids, n_steps, retrieved, _ in llm.calls:
        for qid, n, docs in zip(ids, n_steps, retrieved):
            steps = by_id[qid].steps
            if kind == STEP:  # called before the step is recorded, with its documents already known
                assert docs == [p.id for p in steps[n].retrieved]
            else:
                assert n == len(steps)


def test_failure_and_final_docs_helpers():
    tr = Trace(question=QUESTIONS[0])
    record_failure(tr, BackendError("server down"))
    assert (tr.error, tr.stop_reason) == ("BackendError: server down", "error")
    done = KairLoop(ScriptedLLM(echo_kair), WordOverlap(), LoopConfig(max_steps=2)).run_one(QUESTIONS[0])
    assert final_docs_for(done, None) == done.all_passages()
    assert final_docs_for(done, lambda q, docs: docs[::-1]) == done.all_passages()[::-1]


def stuck(messages):
    """A model stuck on one query: the same index, judgment and query at every step."""
    if "short answer only" in messages[-1]["content"]:
        return "Coldplay"
    return ("<index>\nKeywords: Coldplay\nRelationships:\nLost! -> is a song by -> Coldplay\n</index>\n"
            "<reasoning>Judgment: insufficient</reasoning>\n<query>Coldplay formed</query>")


def test_a_step_repeating_an_earlier_prompt_reuses_its_output_without_a_call():
    """Greedy output is a function of the prompt: once a stuck question's step prompt repeats, the
    loop records the earlier output again instead of asking the model, and the trace is the one
    the model's call would have written."""
    cfg = LoopConfig(max_steps=4, top_k=2)
    llm = ScriptedLLM(stuck)
    traces = KairLoop(llm, WordOverlap(), cfg).run(QUESTIONS[:3])
    # Step 1 (init prompt) and step 2 (update prompt) are new; steps 3 and 4 repeat step 2's
    # prompt (same documents, same index, same query). Then the answer call.
    assert list(llm.calls) == [3, 3, 3]
    assert [t.extra["reused_steps"] for t in traces] == [[3, 4]] * 3
    assert all(t.steps[2].prompt == t.steps[1].prompt and t.steps[3].raw_output == t.steps[1].raw_output
               for t in traces)
    off_llm = ScriptedLLM(stuck)
    off = KairLoop(off_llm, WordOverlap(), dataclasses.replace(cfg, reuse_repeated_steps=False)).run(QUESTIONS[:3])
    assert list(off_llm.calls) == [3, 3, 3, 3, 3]
    for t, o in zip(traces, off):
        a = without_times(t)
        a["extra"].pop("reused_steps")
        assert a == without_times(o)


def test_no_reuse_when_sampling_or_for_a_state_aware_llm():
    sampled = ScriptedLLM(stuck)
    traces = KairLoop(sampled, WordOverlap(), LoopConfig(max_steps=4, top_k=2, temperature=0.7)).run(QUESTIONS[:2])
    assert list(sampled.calls) == [2] * 5 and all("reused_steps" not in t.extra for t in traces)
    assert not KairLoop(KnowsItsQuestions(), WordOverlap(), LoopConfig()).reuses_steps
