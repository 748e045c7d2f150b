"""The KAIR loop with a deterministic LLM and a small lexical retriever."""

from __future__ import annotations

import dataclasses

import pytest

from kair_runtime.config import LoopConfig
from kair_runtime.index import INDEX_UPDATE_RULES, get_format
from kair_runtime.llm.base import BackendError
from kair_runtime.llm.scripted import ScriptedLLM, echo_kair
from kair_runtime.loop import KairLoop, extract_answer
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
