"""The sufficiency judgment as real instruct models phrase it: terse, verbose, negated, hedged,
with both words, in markdown, or not at all. Misreading "not enough" as enough stops the search
early, so every negated or hedged phrasing must read as insufficient; a text that decides
nothing is None, and the step records it as a repair instead of stopping."""

from __future__ import annotations

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
]
UNDECIDED = [
    "",
    "The band is the Glass Herons.",
    "Judgment: sufficient or insufficient",  # the reply layout's placeholder, copied
    "Judgment: sufficient/insufficient",
    "Is the information sufficient?",
    "Judgment: see above",
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
