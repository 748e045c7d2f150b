"""The sufficiency judgment as real instruct models phrase it: terse, verbose, negated, hedged,
with both words, in markdown, or not at all. Misreading "not enough" as enough stops the search
early, so every negated or hedged phrasing must read as insufficient; a text that decides
nothing is None, and the step records it as a repair instead of stopping."""

from __future__ import annotations

import time

import pytest

from kair_runtime.index import empty_index
from kair_runtime.parser import parse_judgment, parse_step_output
from kair_runtime.records import FORMAT_FALLBACKS

SUFFICIENT = [
    "sufficient",
    "Sufficient.",
    "Judgment: sufficient",
    "**Judgment:** Sufficient",
    "**Judgment**: SUFFICIENT",
    "### Judgment\nThe retrieved documents provide enough information to answer the question.",
    "Judgment: yes",
    "Judgment: Yes.",
    "The documents contain sufficient evidence: the band formed in 1987.",
    "We now have enough information to answer the question.",
    "The information is adequate to determine the answer.",
    "Judgment: sufficient. No further search is needed.",
    "Judgment: sufficient, nothing is missing.",
    "Document 2 does not mention the year, but document 3 provides enough information.",
    "Judgment: The question can now be answered.",
    "We do not need more information. Judgment: sufficient",
    "The first document alone was insufficient, but the second gives the year. Judgment: sufficient",
    "Is the information sufficient? Judgment: yes",
    "Judgment:\nThe information is sufficient.",
    # Issue 29: a negation or limit near the word that denies a need or a gap, not the knowledge.
    "Nothing is missing; the knowledge is sufficient.",
    "The information is sufficient and nothing is missing.",
    "The retrieved passages are sufficient to answer: yes",
    "The documents provide enough information, so no further search is needed.",
    "We have enough information and do not need to search further.",
    "We don't need more searching since the information is sufficient.",
    "No further search is needed because the information is sufficient.",
    "The knowledge is sufficient without any further retrieval.",
    "There is no doubt the information is sufficient.",
    "The passages are sufficient with no ambiguity about the birthplace.",
    "The evidence is not only sufficient but conclusive.",
    "The documents provide enough detail, and no information is missing.",
    "The information is adequate; nothing remains unknown.",
    "Judgment: sufficient (no further query needed)",
    "Judgment: Sufficient - nothing else is required.",
    "Although the first passage lacks the year, the second is sufficient.",
    "The information is sufficient to determine whether he was born in Bergen.",
    "The information is sufficient: Maren Volk was born in Bergen.",
    "Sufficient information is now available.",
    "The documents are sufficient for both hops.",
    "Is the information sufficient? Yes.",
    "Sufficient? Yes, both hops are covered.",
]
INSUFFICIENT = [
    "insufficient",
    "Insufficient.",
    "Judgment: insufficient",
    "**Judgment:** Insufficient",
    "Judgment: no",
    "Judgment: No, the founding year is missing.",
    "Judgment: I do not have enough information",
    "The documents don't provide enough information.",
    "The documents don’t provide enough information.",  # a typographic apostrophe
    "lacking sufficient evidence",
    "The passages lack sufficient detail about the founding year.",
    "There is not enough information to answer.",
    "The information is not sufficient; once we find the founding year it will be sufficient.",
    "Judgment: not yet sufficient",
    "We still need the founding year.",
    "We need more information about the band.",
    "More information is needed to determine the year.",
    "Additional documents are required.",
    "The information may not be sufficient.",
    "The evidence is only partially sufficient.",
    "The documents are not fully sufficient to answer.",
    "Without the founding year, the information is insufficient.",
    "I am unable to find enough information in the documents.",
    "The retrieved documents fail to provide sufficient detail.",
    "It is unclear whether the information is sufficient.",
    "The documents do not, however, give sufficient information.",
    "It looked sufficient at first. Judgment: insufficient",
    "Judgment: Insufficient - once we find the year it will be sufficient.",
    "Judgment: cannot answer yet",
    "Judgment: the founding year is still unknown",
    "Judgment: insufficient (we have yet to find the year, which is not enough)",
    "Judgment: NOT SUFFICIENT",
    "If we knew the year, the information would be sufficient.",
    # Issue 29: the negation or limit after the sufficiency word, or in a later clause.
    "Sufficient information has not been found.",
    "Sufficient information is not available yet.",
    "Enough information is not provided.",
    "Sufficient information was not found in the passages.",
    "Enough evidence has never been given for the birthplace.",
    "Sufficient information cannot be found in these documents.",
    "Sufficient information is missing.",
    "Sufficient information is lacking.",
    "Enough detail is unavailable.",
    "Judgment: Enough information is not available.",
    "The information is no longer sufficient.",
    "Sufficient: no.",
    "Judgment: Sufficient: no",
    "Sufficient - no.",
    "Sufficient evidence: none.",
    "Sufficient (not really).",
    "The retrieved passages are sufficient to answer: no",
    "We have enough to identify the singer but not his birthplace.",
    "Enough, but not for the birthplace.",
    "We have enough for the singer, not for his birthplace.",
    "Enough is known about the singer but nothing about his birthplace.",
    "The documents give enough detail about the band, but the year is missing.",
    "The information is sufficient, although the birthplace is unknown.",
    "The passages are sufficient, yet the birthplace is not mentioned.",
    "We have adequate information, however the birthplace is not given.",
    "The knowledge is sufficient for the first hop only; the birthplace is not mentioned.",
    "The information is sufficient only for the first hop.",
    "Judgment: sufficient for the singer only",
    "Sufficient for the first hop.",
    "The documents are sufficient for part of the question.",
    "The passages are sufficient partially.",
    "The information is sufficient except for the birthplace.",
    "The information is sufficient to say we cannot answer yet.",
    "The passages give enough to say the answer is unknown.",
    "Is the information sufficient? No.",
    "Sufficient? No, the birthplace is missing.",
    "Enough information? No.",
]
UNDECIDED = [
    "",
    "The band is the Glass Herons.",
    "Judgment: sufficient or insufficient",  # the reply layout's placeholder, copied
    "Judgment: sufficient/insufficient",
    "Is the information sufficient?",
    "Judgment: see above",
    "Judgment: not sure",
    "The birthplace is not mentioned.",  # a negation with no sufficiency word decides nothing
    "Is the information sufficient? The band formed in 1987.",  # no answer to the question
]


@pytest.mark.parametrize("text", SUFFICIENT)
def test_sufficient_phrasings(text):
    assert parse_judgment(text) == "sufficient"


@pytest.mark.parametrize("text", INSUFFICIENT)
def test_negated_and_hedged_phrasings_are_insufficient(text):
    assert parse_judgment(text) == "insufficient"


@pytest.mark.parametrize("text", UNDECIDED)
def test_undecided_phrasings(text):
    assert parse_judgment(text) is None


def test_the_table_is_broad():
    assert len(SUFFICIENT) + len(INSUFFICIENT) + len(UNDECIDED) >= 30


@pytest.mark.parametrize("text", ["Yes.", "No, the year is missing.", "The year is missing.", "We cannot answer yet."])
def test_terse_words_count_only_where_the_text_is_the_judgment(text):
    # In free reasoning "no" or "missing" are about the documents; in a <judgment> tag they are the verdict.
    assert parse_judgment(text) is None
    assert parse_judgment(text, statement=True) in {"sufficient", "insufficient"}
    raw = f"<reasoning>The band formed in 1987.</reasoning><judgment>{text}</judgment><query>Glass Herons</query>"
    expected = "sufficient" if text == "Yes." else "insufficient"
    assert parse_step_output(raw, "kr", empty_index("kr"), "q0").judgment == expected


@pytest.mark.parametrize("text", INSUFFICIENT[6:14])
def test_a_negated_judgment_keeps_the_loop_searching(text):
    raw = f"<index>\nKeywords: The Glass Herons\n</index>\n<reasoning>{text}</reasoning>\n<query>Glass Herons founded</query>"
    p = parse_step_output(raw, "kr", empty_index("kr"), "q0")
    assert p.judgment == "insufficient" and p.next_query == "Glass Herons founded" and p.fallbacks == []


@pytest.mark.parametrize("judgment,expected", [
    ("Sufficient information has not been found.", "insufficient"),
    ("Sufficient: no", "insufficient"),
    ("We have enough to identify the singer but not his birthplace.", "insufficient"),
    ("Nothing is missing; the knowledge is sufficient.", "sufficient"),
])
def test_negation_after_the_word_decides_the_step(judgment, expected):
    # Both places a judgment is written: the reasoning's last line, and a <judgment> section.
    for raw in (f"<index>\nKeywords: Maren Volk\n</index>\n<reasoning>{judgment}</reasoning>\n<query>Maren Volk born</query>",
                f"<reasoning>Maren Volk sings.</reasoning><judgment>{judgment}</judgment><query>Maren Volk born</query>"):
        p = parse_step_output(raw, "kr", empty_index("kr"), "q0")
        assert p.judgment == expected
        assert p.next_query == ("Maren Volk born" if expected == "insufficient" else None)
        assert "judgment_unclear" not in p.fallbacks and "judgment_missing" not in p.fallbacks


@pytest.mark.parametrize("unit", ["sufficient, no ", "enough but not ", "no further ", "sufficient? no. ",
                                  "sufficient nothing is ", "not " + " " * 300, "only yet "])
def test_judging_repeated_negations_stays_linear(unit):
    # The negation reading runs over a whole window of hostile text; a super-linear pattern here
    # would take seconds, one parse takes milliseconds.
    text = unit * (1_000_000 // len(unit))
    t0 = time.perf_counter()
    for statement in (False, True):
        assert parse_judgment(text, statement) in {"sufficient", "insufficient", None}
    assert time.perf_counter() - t0 < 5.0


@pytest.mark.parametrize("reasoning,fallback", [
    ("Judgment: maybe", "judgment_unclear"),
    ("... Judgment: sufficient or insufficient", "judgment_unclear"),
    ("The band is the Glass Herons.", "judgment_missing"),
])
def test_an_undecided_judgment_is_a_recorded_repair_never_sufficient(reasoning, fallback):
    raw = f"<index>\nKeywords: The Glass Herons\n</index>\n<reasoning>{reasoning}</reasoning>\n<query>Glass Herons founded</query>"
    p = parse_step_output(raw, "kr", empty_index("kr"), "q0")
    assert p.judgment == "insufficient" and p.next_query == "Glass Herons founded"
    assert p.fallbacks == [fallback] and fallback in FORMAT_FALLBACKS
