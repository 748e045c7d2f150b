"""The structured mode: what the step grammar allows, the parser reads as a valid step.

Two checks per index format: xgrammar's matcher on hand-written strings (rendered steps pass;
a copied template, too many entries, a "none" search query fail), and the tiny random-weight
model sampled at temperature 1 under the grammar (every output parses with no fallback).
"""

from __future__ import annotations

import pytest

from kair_runtime.config import ConfigError, LoopConfig
from kair_runtime.grammar import GrammarBounds, answer_grammar, longest, step_grammar
from kair_runtime.layout import LAYOUTS
from kair_runtime.llm.base import BackendError, SamplingParams
from kair_runtime.llm.scripted import ScriptedLLM, echo_kair
from kair_runtime.loop import KairLoop
from kair_runtime.parser import parse_step_output
from kair_runtime.records import Index, Question
from lexical import WordOverlap

xgr = pytest.importorskip("xgrammar", reason="the structured extra: pip install 'kair[structured]'")

FORMATS = sorted(LAYOUTS)
SMALL = GrammarBounds(max_entries=3, entry_words=4, reasoning_words=8, query_words=4, answer_words=4)
# What the random-weight model samples from runs to the bounds: these keep its outputs short.
TINY = GrammarBounds(max_entries=2, entry_words=2, reasoning_words=3, query_words=2, answer_words=2, word_chars=4)
FULL = Index("any", keywords=["Paris", "Jean-Luc O'Brien"], relations=[["Paris", "capital of", "France"]],
             facts=["Paris is in France"], keyword_facts=[["Paris", ["capital of France", "AT&T office"]]],
             summary="Paris is the capital, it is big. It has 2 million people")


def _index(fmt: str, **kw) -> Index:
    return Index(fmt, **{k: v for k, v in vars(FULL).items() if k != "format"} | kw)


@pytest.fixture(scope="module")
def accepts():
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo(["<eos>"], stop_token_ids=[0]))

    def accepts(grammar: str, text: str) -> bool:
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar), terminate_without_stop_token=True)
        return matcher.accept_string(text) and matcher.is_completed()

    return accepts


@pytest.mark.parametrize("fmt", FORMATS)
def test_rendered_steps_are_accepted_and_parse_clean(fmt, accepts):
    layout, grammar = LAYOUTS[fmt], step_grammar(fmt)
    for judgment, query in (("insufficient", "Eiffel tower height"), ("sufficient", None)):
        text = layout.render(_index(fmt), "The capital is named. It is big", judgment, query)
        assert accepts(grammar, text), text
        step = parse_step_output(text, fmt, Index(fmt), "q")
        assert step.fallbacks == [] and step.judgment == judgment


def test_every_no_query_phrasing_the_parser_knows_is_not_a_query_the_grammar_allows(accepts):
    """The parser and the grammar share one definition of "no query" (parser.NO_QUERY_SLOTS):
    each of its phrasings reads as no query and the grammar refuses it in the query slot."""
    from kair_runtime.grammar import NO_QUERY_PHRASES
    from kair_runtime.parser import NO_QUERY_PHRASINGS, clean_query

    phrasings = list(NO_QUERY_PHRASINGS)
    assert len(phrasings) == 64 and "no further search queries are needed" in phrasings
    layout, grammar = LAYOUTS["kr"], step_grammar("kr", SMALL)
    for phrase in phrasings:
        assert clean_query(phrase) == "" and clean_query(phrase.capitalize() + ".") == "", phrase
        assert tuple(phrase.split()) in NO_QUERY_PHRASES, phrase
    for phrase in phrasings[::7]:  # the grammar check compiles a matcher per text: a sample
        assert not accepts(grammar, layout.render(_index("kr"), "reasoning", "insufficient", phrase)), phrase


@pytest.mark.parametrize("fmt", FORMATS)
def test_what_the_parser_repairs_is_rejected(fmt, accepts):
    layout, grammar = LAYOUTS[fmt], step_grammar(fmt, SMALL)
    render = lambda index, judgment="insufficient", query="Eiffel tower": layout.render(
        index, "reasoning", judgment, query)
    assert not accepts(grammar, layout.block)  # the copied template
    for query in ("none", "None", "NA", "no further queries needed", "the next search query"):
        text = render(_index(fmt), query=query)
        assert not accepts(grammar, text), text
        assert parse_step_output(text, fmt, Index(fmt), "q").fallbacks, text  # the parser repairs it
    assert not accepts(grammar, render(_index(fmt), judgment="sufficient").replace("none", "Eiffel"))
    assert not accepts(grammar, render(_index(fmt)).replace("Judgment: insufficient", "Judgment: maybe"))
    if not layout.expects_index:
        return
    too_many = _index(fmt, keywords=list("ABCD"), relations=[["A", "r", "B"]] * 4, facts=list("ABCD"),
                      keyword_facts=[[k, ["f"]] for k in "ABCD"], summary=" ".join(["w"] * 13))
    assert not accepts(grammar, render(too_many))
    echo = _index(fmt, keywords=["keyword"], relations=[["head", "relation", "tail"]], facts=["fact"],
                  keyword_facts=[["keyword", ["fact"]]], summary="a few sentences")
    assert not accepts(grammar, render(echo))
    assert parse_step_output(render(echo), fmt, Index(fmt), "q").fallbacks  # echo (or, K&F, a header)
    assert not accepts(grammar, render(_index(fmt, keywords=["a; b"], facts=["a: b"], summary="a\nb",
                                              keyword_facts=[["a", ["b: c"]]], relations=[["a", "b->c", "d"]])))
    if fmt == "kf":  # a keyword that is a header word would open another section
        assert not accepts(grammar, render(_index(fmt, keyword_facts=[["Summary", ["x"]]])))


def test_answer_grammar_is_a_short_answer(accepts):
    grammar = answer_grammar(SMALL)
    assert accepts(grammar, "Paris") and accepts(grammar, "Jean-Luc Godard, 1930")
    assert not accepts(grammar, "Paris\n") and not accepts(grammar, "a b c d e") and not accepts(grammar, "")
    # Answers as the gold strings spell them: any printable characters but a tag's "<".
    for gold in ("J. T. Petty", "$268 million", "200,000", "Fårö", "Mr. Fix-It", "17%", "Love & War",
                 "Thelma Hopkins (athlete)", "A Nightmare 4: The", "Don'T Freak Me"):
        assert accepts(grammar, gold), gold
    # Never one that extract_answer reads as empty (an "Answer:" prefix, quotes, a lone stop) or a tag.
    for empty in ("Answer:", "''", '"x"', ".", "x <b>", "Answer -"):
        assert not accepts(grammar, empty), empty


def test_step_text_is_spelled_as_training_replies_spell_it(accepts):
    """What silver replies write, which the grammar must not force a tuned student away from:
    letters beyond ASCII, a title's parentheses, "missing: X", "Jr.; ", a reasoning ending in a stop."""
    grammar = step_grammar("kr", GrammarBounds())
    step = ("<index>\nKeywords: Alû, Always (2011 film), Waylon J. Smithers Jr.\nRelationships:\n"
            "Leland, North Carolina -> in or around -> Maximum Overdrive\n</index>\n<reasoning>The documents "
            "give Alû related to Lilu; Waylon Smithers Jr.; but the next piece is still missing: Always (2011 film). "
            "Judgment: insufficient</reasoning>\n<query>Always (2011 film), Pál Gábor</query>")
    assert accepts(grammar, step)
    assert parse_step_output(step, "kr", Index("kr"), "q").fallbacks == []
    # No reasoning word reads as the judgment label: a colon never follows a word ending in "nt".
    for label in ("Judgment:", "prejudgement:", "JUDGMENT:"):
        assert not accepts(grammar, step.replace("missing:", label)), label
    assert not accepts(grammar, step.replace("Keywords: Alû", "Keywords: (none)"))  # a first word is plain


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kair_runtime.llm.hf import HFBackend

    return HFBackend(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                     AutoTokenizer.from_pretrained(tiny_model_dir), batch_size=3)


PROMPTS = [[{"role": "user", "content": q}] for q in ("Who built it?", "Where is Paris?", "zzz")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_sampled_outputs_parse_with_no_fallback(fmt, hf):
    grammar = step_grammar(fmt, TINY)
    for seed in (0, 1):
        for c in hf.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=300, seed=seed, grammar=grammar)):
            step = parse_step_output(c.text, fmt, Index(fmt), "q")
            assert c.finish_reason == "stop" and step.fallbacks == [], c.text
            assert len(c.text.encode()) <= longest(grammar)
            assert (step.next_query is None) == (step.judgment == "sufficient")


def test_a_repetition_loop_ends_in_a_valid_step(tmp_path):
    """A model that repeats its last token runs to the cap unconstrained; under the grammar the
    bounds end it in a valid step well within the same cap."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kair_runtime.llm.hf import HFBackend
    from train.tiny_model import build_tiny_chat_model

    path = build_tiny_chat_model(tmp_path / "repeater", initializer_range=0.02)
    llm = HFBackend(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path))
    free = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=300))[0]
    assert free.finish_reason == "length"
    out = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=300, grammar=step_grammar("kr", TINY)))[0]
    assert out.finish_reason == "stop" and parse_step_output(out.text, "kr", Index("kr"), "q").fallbacks == []


def test_longest_reads_the_grammar():
    assert longest('root ::= "ab" ("c" | "de"){0,3} x? [0-9]\nx ::= [a-z]{1,4} "\\n"\n') == 2 + 6 + 5 + 1
    with pytest.raises(ValueError, match="unbounded"):
        longest('root ::= "a" [b]*\n')
    # An answer's characters are counted in UTF-8 bytes, as tokens may split them: 3 words of 5
    # characters, the first opening with a sign of up to 3 bytes (€), the last ending in a 2-byte
    # letter, every other character any printable one (up to 4), 2 spaces.
    longest_answer = (3 + 4 * 4) + (5 * 4) + (4 * 4 + 2) + 2
    assert longest(answer_grammar(GrammarBounds(answer_words=3, word_chars=5))) == longest_answer


def test_words_are_bounded_and_joined(accepts):
    # In step text the joiners separate words: a word is at most word_chars letters or digits.
    grammar = step_grammar("kr", GrammarBounds(query_words=4, word_chars=6))

    def query(text: str) -> bool:
        return accepts(grammar, "<index>\nKeywords: x\nRelationships:\n</index>\n<reasoning>Judgment: "
                                f"insufficient</reasoning>\n<query>{text}</query>")

    assert query("Jean-Luc O'Brien") and query("2022-01-22") and query("AT&T")
    assert not query("Schwarzenegger") and not query("1-2-3-4-5")
    assert not query("Jean--Luc") and not query("Paris-")
    # An answer's word is any printable run of at most word_chars characters.
    answer = answer_grammar(GrammarBounds(answer_words=2, word_chars=8))
    assert accepts(answer, "Jean-Luc O'Brien") and accepts(answer, "1914–18")
    assert not accepts(answer, "Schwarzenegger") and not accepts(answer, "2022-01-22")


def test_a_structured_step_is_never_cut_by_the_token_cap(tmp_path):
    """The repeater runs every output to its bounds; with a step cap far below that, the loop
    still gives each structured call its grammar's longest output, so every step ends valid."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kair_runtime.llm.hf import HFBackend
    from train.tiny_model import build_tiny_chat_model

    path = build_tiny_chat_model(tmp_path / "repeater", initializer_range=0.02)
    llm = HFBackend(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path))
    cfg = LoopConfig(max_steps=2, top_k=2, step_max_tokens=8, answer_max_tokens=2, structured=True,
                     max_index_entries=2, max_entry_words=2, max_reasoning_words=3, max_query_words=2,
                     max_answer_words=2, max_word_chars=4)
    loop = KairLoop(llm, WordOverlap(), cfg)
    assert loop.step_sampling.max_tokens == longest(step_grammar("kr", KairLoop.grammar_bounds(cfg))) > 8
    assert loop.answer_sampling.max_tokens == longest(answer_grammar(KairLoop.grammar_bounds(cfg))) > 2
    trace = loop.run_one(Question(id="a", question="Who sang Viva la Vida?", answers=["Coldplay"]))
    assert trace.steps and all(s.parsed_ok and not s.fallbacks for s in trace.steps)
    assert all(8 < s.completion_tokens < loop.step_sampling.max_tokens for s in trace.steps)


def test_structured_loop_on_hf_gives_valid_steps(hf):
    cfg = LoopConfig(max_steps=2, top_k=2, step_max_tokens=300, answer_max_tokens=16, temperature=1.0, seed=3,
                     structured=True, max_index_entries=2, max_entry_words=2, max_reasoning_words=3,
                     max_query_words=2, max_answer_words=2, max_word_chars=4)
    questions = [Question(id="a", question="Who sang Viva la Vida?", answers=["Coldplay"]),
                 Question(id="b", question="When was Oasis formed?", answers=["1991"])]
    for trace in KairLoop(hf, WordOverlap(), cfg).run(questions):
        assert trace.steps and all(s.parsed_ok for s in trace.steps)
        assert 0 < len(trace.answer.split()) <= 2


def test_scripted_backend_refuses_the_mode():
    with pytest.raises(BackendError, match="loop.structured"):
        KairLoop(ScriptedLLM(echo_kair), WordOverlap(), LoopConfig(structured=True))
    with pytest.raises(BackendError, match="cannot constrain"):
        ScriptedLLM(echo_kair).generate(PROMPTS, SamplingParams(grammar=answer_grammar()))


def test_config_validates_the_mode():
    LoopConfig(structured=True).validate()
    assert KairLoop.grammar_bounds(LoopConfig()) == GrammarBounds()  # one set of defaults
    with pytest.raises(ConfigError, match="loop.max_entry_words"):
        LoopConfig(structured=True, max_entry_words=0).validate()
    with pytest.raises(ConfigError, match="no_repeat_ngram=0"):
        LoopConfig(structured=True, no_repeat_ngram=3).validate()
    with pytest.raises(ConfigError, match="true or false"):
        LoopConfig(structured="yes").validate()


def test_the_bounds_a_step_needs_are_counted_as_the_grammar_counts():
    from kair_runtime.grammar import answer_needs, step_needs

    index = Index("kr", keywords=["Alû", "Always (2011 film)", "x"],
                  relations=[["Jean-Luc O'Brien", "born in", "Paris"]])
    assert step_needs(index, "The documents give Alû; still missing: Paris.", "Always (2011 film)") == {
        "max_index_entries": 3, "max_entry_words": 4, "max_reasoning_words": 7, "max_query_words": 3,
        "max_word_chars": 9}
    assert answer_needs("Thelma Hopkins (athlete)") == {"max_answer_words": 3, "max_word_chars": 9}


def test_a_structured_call_past_the_context_is_capped_by_it(hf):
    """The grammar's longest output is a bound in bytes, far above real outputs; where it passes
    the model's context, the context caps the call instead of refusing it. A free call is refused."""
    from kair_runtime.llm.hf import HFBackend

    small = HFBackend(hf.model, hf.tokenizer, max_context=96)
    grammar = step_grammar("kr", TINY)
    out = small.generate(PROMPTS[:1], SamplingParams(max_tokens=longest(grammar), grammar=grammar))[0]
    assert out.completion_tokens <= 96
    with pytest.raises(BackendError, match="exceeds the model's context of 96 tokens"):
        small.generate(PROMPTS[:1], SamplingParams(max_tokens=longest(grammar)))
