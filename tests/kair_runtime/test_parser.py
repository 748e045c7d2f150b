"""parse_step_output on what real small models write, then property tests: it never raises and
always returns a usable step (a judgment, a query iff insufficient, an index that only grows)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kair_runtime.index import INDEX_FORMATS, empty_index, get_format, norm_key
from kair_runtime.parser import clean_query, parse_judgment, parse_step_output, split_sections
from kair_runtime.records import FORMAT_FALLBACKS, Index

Q0 = 'In what year was the band that recorded "Paper Lanterns on the Quellan" formed?'
KR_BODY = """Keywords: Paper Lanterns on the Quellan, The Glass Herons, 1987
Relationships:
Paper Lanterns on the Quellan -> is a song by -> The Glass Herons
The Glass Herons -> formed in -> 1987"""
KR_INDEX = Index(format="kr", keywords=["Paper Lanterns on the Quellan", "The Glass Herons", "1987"],
                 relations=[["Paper Lanterns on the Quellan", "is a song by", "The Glass Herons"],
                            ["The Glass Herons", "formed in", "1987"]])
CANONICAL = f"""<index>
{KR_BODY}
</index>
<reasoning>The song is by the Glass Herons, who formed in 1987. Judgment: sufficient</reasoning>
<query>none</query>"""
INSUFFICIENT = f"""<index>
{KR_BODY}
</index>
<reasoning>The song is by the Glass Herons but the documents do not give their founding year. Judgment: insufficient</reasoning>
<query>When was the Glass Herons band formed?</query>"""
# Outputs of SmolLM2-135M-Instruct (sampled at temperature 0.7) on the demo's init prompts, trimmed.
SMOLLM_ECHO = f"""Question: {Q0.replace("Quellan", "Quell")}

Synthesized with the document:
The Glass Herons: The Glass Herons are a folk-rock band formed in Brennock in 1987.

The Glass Herons: The Glass Herons are a folk-rock band formed in Brennock in 1987."""
SMOLLM_TEXT = """The Glass Herons: The Glass Herons are a folk-rock band formed in Brennock in 1987.
<query>The Glass Herons: The Glass Herons are a folk-rock band formed in 1987.

Question: What is the next document related to the Glass Herons?

Summary: A few sentences"""
SMOLLM_PROSE = 'Refer to the document, and the answer is "the next search query, or none"'


def parse(raw: str, fmt: str = "kr", previous: Index | None = None, question: str = Q0):
    return parse_step_output(raw, fmt, previous if previous is not None else empty_index(fmt), question)


# ---------------------------------------------------------------- layouts

def test_canonical_layout():
    p = parse(CANONICAL)
    assert p.index == KR_INDEX
    assert p.judgment == "sufficient" and p.next_query is None and p.fallbacks == []
    assert p.reasoning.endswith("Judgment: sufficient")


def test_canonical_insufficient_gives_the_query():
    p = parse(INSUFFICIENT)
    assert p.judgment == "insufficient" and p.next_query == "When was the Glass Herons band formed?"
    assert p.fallbacks == []


def test_missing_closing_tags():
    raw = f"<index>\n{KR_BODY}\n<reasoning>No year yet. Judgment: insufficient\n<query>Glass Herons formation year"
    p = parse(raw)
    assert p.index == KR_INDEX and p.judgment == "insufficient"
    assert p.next_query == "Glass Herons formation year" and p.fallbacks == []


@pytest.mark.parametrize("tags", [("INDEX", "REASONING", "QUERY"), ("Index", "Reasoning", "Query"),
                                  ("iNdEx", "reasoninG", "QuerY"), ("index ", " reasoning", "next_query")])
def test_tag_case_and_spacing(tags):
    i, r, q = tags
    raw = f"<{i}>\n{KR_BODY}\n</{i}>\n<{r}>Judgment: Insufficient</{r}>\n< {q} >Glass Herons founded</ {q}>"
    p = parse(raw)
    assert p.index == KR_INDEX and p.judgment == "insufficient" and p.next_query == "Glass Herons founded"
    assert p.fallbacks == []


@pytest.mark.parametrize("fence", ["```", "```xml", "```text"])
def test_markdown_fences_around_everything(fence):
    p = parse(f"{fence}\n{INSUFFICIENT}\n```")
    assert p.index == KR_INDEX and p.next_query == "When was the Glass Herons band formed?" and p.fallbacks == []


def test_bullets_numbering_and_bold_inside_the_index():
    raw = """<index>
**Keywords:** Paper Lanterns on the Quellan, The Glass Herons, 1987.
**Relationships:**
1. "Paper Lanterns on the Quellan" -> is a song by -> The Glass Herons
2. **The Glass Herons** → formed in → 1987
</index>
<reasoning>**Judgment**: sufficient</reasoning>"""
    p = parse(raw)
    assert p.index == KR_INDEX and p.judgment == "sufficient" and p.fallbacks == []


def test_prose_before_and_after():
    raw = f"Sure! Here is the updated index for your question.\n\n{INSUFFICIENT}\n\nI hope this helps. Let me know!"
    p = parse(raw)
    assert p.index == KR_INDEX and p.next_query == "When was the Glass Herons band formed?" and p.fallbacks == []


def test_plain_labels_without_tags():
    raw = f"""Index:
{KR_BODY}
Reasoning: The founding year is not in the documents.
Judgment: insufficient
Query: When was the Glass Herons formed?"""
    p = parse(raw)
    assert p.index == KR_INDEX and p.judgment == "insufficient"
    assert p.next_query == "When was the Glass Herons formed?" and p.fallbacks == []
    assert p.reasoning == "The founding year is not in the documents."


def test_untagged_index_before_labels_is_read():
    # No "Index:" label: the index headers themselves open the output.
    p = parse(f"{KR_BODY}\nReasoning: Enough. Judgment: sufficient")
    assert p.index == KR_INDEX and p.judgment == "sufficient" and p.fallbacks == []


def test_query_label_after_the_tags():
    raw = f"<index>\n{KR_BODY}\n</index>\n<reasoning>Judgment: insufficient</reasoning>\nNext query: Where was Maren Volk born?"
    p = parse(raw)
    assert p.next_query == "Where was Maren Volk born?" and p.fallbacks == []


def test_labels_inside_and_around_tags():
    # Inside a closed <reasoning>, the last "Judgment:" is the one that counts.
    raw = "<reasoning>Judgment: insufficient\nWait, document 2 has it.\nJudgment: sufficient</reasoning>"
    assert parse(raw, previous=KR_INDEX).judgment == "sufficient"
    # A reasoning tag left open, then a plain "Query:" line.
    raw = f"<index>\n{KR_BODY}\n</index>\n<reasoning>No year. Judgment: insufficient\nQuery: Glass Herons founded"
    p = parse(raw)
    assert p.next_query == "Glass Herons founded" and p.fallbacks == []
    # A judgment label between tags, with no reasoning at all.
    p = parse(f"<index>\n{KR_BODY}\n</index>\nJudgment: sufficient\n<query>none</query>")
    assert p.judgment == "sufficient" and p.fallbacks == []


# ---------------------------------------------------------------- missing parts

def test_missing_index_keeps_previous():
    prev = Index(format="kr", keywords=["The Glass Herons"], relations=[["The Glass Herons", "lead singer", "Maren Volk"]])
    p = parse("<reasoning>Judgment: insufficient</reasoning>\n<query>Where was Maren Volk born?</query>", previous=prev)
    assert p.index == prev and p.fallbacks == ["index_missing"]
    assert p.next_query == "Where was Maren Volk born?"


def test_index_of_prose_counts_as_missing():
    prev = Index(format="kr", keywords=["The Glass Herons"])
    p = parse("<index>I found nothing useful.</index><reasoning>Judgment: sufficient</reasoning>", previous=prev)
    assert p.index == prev and p.fallbacks == ["index_missing"] and p.judgment == "sufficient"


def test_missing_judgment_is_insufficient():
    raw = f"<index>\n{KR_BODY}\n</index>\n<reasoning>The band is the Glass Herons.</reasoning>\n<query>Glass Herons founding</query>"
    p = parse(raw)
    assert p.judgment == "insufficient" and p.fallbacks == ["judgment_missing"]
    assert p.next_query == "Glass Herons founding"


@pytest.mark.parametrize("words", ["Judgment: insufficient", "Judgment: Insufficient.", "JUDGMENT: INSUFFICIENT",
                                   "The information is not sufficient.", "This is not yet enough to answer.",
                                   "We need more documents.", "Judgement: insufficient",
                                   "It looked sufficient at first. Judgment: insufficient"])
def test_insufficient_is_never_read_as_sufficient(words):
    assert parse_judgment(words) == "insufficient"
    assert parse(f"<index>\n{KR_BODY}\n</index>\n<reasoning>{words}</reasoning><query>x y</query>").judgment == "insufficient"


def test_labelled_judgment_inside_reasoning_wins_over_earlier_words():
    raw = ("<reasoning>The first document alone was insufficient, but the second gives the year 1987. "
           "Judgment: sufficient</reasoning>")
    p = parse(raw, previous=KR_INDEX)
    assert p.judgment == "sufficient" and p.next_query is None


def test_separate_judgment_tag():
    raw = f"<index>\n{KR_BODY}\n</index>\n<reasoning>They formed in 1987.</reasoning>\n<judgment>Sufficient</judgment>"
    p = parse(raw)
    assert p.judgment == "sufficient" and p.next_query is None and p.fallbacks == []
    raw = "<reasoning>Looks sufficient.</reasoning><judgement>insufficient</judgement><query>more</query>"
    assert parse(raw, previous=KR_INDEX).judgment == "insufficient"


@pytest.mark.parametrize("query", ["", "   ", "none", "None.", "N/A", "null", "-", "No query needed",
                                   "no further query", "No more queries needed."])
def test_empty_or_none_query_while_insufficient_falls_back(query):
    raw = f"<index>\n{KR_BODY}\n</index>\n<reasoning>Judgment: insufficient</reasoning>\n<query>{query}</query>"
    p = parse(raw)
    assert p.judgment == "insufficient"
    assert p.next_query == f"{Q0} 1987"  # q0 plus the newest relation's tail
    assert p.fallbacks == ["query_missing"]


def test_sufficient_judgment_drops_the_query():
    raw = f"<index>\n{KR_BODY}\n</index>\n<reasoning>Judgment: sufficient</reasoning>\n<query>When was it formed?</query>"
    p = parse(raw)
    assert p.judgment == "sufficient" and p.next_query is None and p.fallbacks == []


def test_query_cleaning_keeps_leading_numbers():
    assert clean_query("1987 albums by the Glass Herons") == "1987 albums by the Glass Herons"
    assert clean_query("Query: \"When was the Glass Herons formed?\"") == "When was the Glass Herons formed?"
    assert clean_query("1. Where was Maren Volk born?\n2. When?") == "Where was Maren Volk born?"
    assert clean_query("- **Mount Corran first ascent**") == "Mount Corran first ascent"


# ---------------------------------------------------------------- real tiny-model outputs

def test_tiny_model_echoing_the_question():
    p = parse(SMOLLM_ECHO)
    assert p.index == empty_index("kr") and p.judgment == "insufficient" and p.next_query == Q0
    assert p.fallbacks == ["index_missing", "judgment_missing", "query_missing"]
    prev = Index(format="kr", relations=[["Paper Lanterns on the Quellan", "is a song by", "The Glass Herons"]])
    assert parse(SMOLLM_ECHO, previous=prev).next_query == f"{Q0} The Glass Herons"


def test_tiny_model_outputs_in_other_formats():
    p = parse(SMOLLM_TEXT, "text")
    assert p.fallbacks == ["index_missing", "judgment_missing"] and p.index == empty_index("text")
    assert p.next_query == "The Glass Herons: The Glass Herons are a folk-rock band formed in 1987."
    p = parse(SMOLLM_PROSE, "kf")
    assert p.fallbacks == ["index_missing", "judgment_missing", "query_missing"] and p.next_query == Q0


# ---------------------------------------------------------------- every format

FORMAT_CASES = {
    "kr": (KR_BODY, KR_INDEX),
    "text": ("Summary: The song is by the Glass Herons,\nformed in 1987.",
             Index(format="text", summary="The song is by the Glass Herons, formed in 1987.")),
    "keywords": ("Keywords: Paper Lanterns on the Quellan, The Glass Herons, 1987",
                 Index(format="keywords", keywords=["Paper Lanterns on the Quellan", "The Glass Herons", "1987"])),
    "facts": ("Facts:\n- Paper Lanterns on the Quellan is a song by the Glass Herons\n- The Glass Herons formed in 1987",
              Index(format="facts", facts=["Paper Lanterns on the Quellan is a song by the Glass Herons",
                                           "The Glass Herons formed in 1987"])),
    "kf": ("Keywords and facts:\nThe Glass Herons: folk-rock band; formed in 1987\n1987: founding year",
           Index(format="kf", keyword_facts=[["The Glass Herons", ["folk-rock band", "formed in 1987"]],
                                             ["1987", ["founding year"]]])),
}


@pytest.mark.parametrize("fmt", sorted(FORMAT_CASES))
def test_every_format_parses_and_merges(fmt):
    body, expected = FORMAT_CASES[fmt]
    raw = f"<index>\n{body}\n</index>\n<reasoning>Judgment: insufficient</reasoning>\n<query>Maren Volk</query>"
    p = parse(raw, fmt)
    assert p.index == expected and p.fallbacks == [] and p.next_query == "Maren Volk"
    # A second step merges into the first step's index (text replaces, lists grow).
    again = parse(raw, fmt, previous=p.index)
    assert again.index == expected


def test_no_index_format_never_reports_a_missing_index():
    p = parse("<reasoning>Judgment: insufficient</reasoning><query>Maren Volk</query>", "none")
    assert p.fallbacks == [] and p.index.format == "none"


def test_unknown_format_is_a_caller_error():
    with pytest.raises(KeyError, match="unknown index format"):
        parse_step_output(CANONICAL, "graph", Index(format="kr"), Q0)


def test_split_sections_first_occurrence_wins():
    s = split_sections("<query>first</query><query>second</query><reasoning>r</reasoning>")
    assert s["query"] == "first" and s["reasoning"] == "r"


# ---------------------------------------------------------------- properties

PREVIOUS = {
    "kr": KR_INDEX,
    "text": Index(format="text", summary="The Glass Herons formed in 1987."),
    "keywords": Index(format="keywords", keywords=["The Glass Herons", "1987", "Viva (album)"]),
    "facts": Index(format="facts", facts=["The Glass Herons formed in 1987", "3.5 million people"]),
    "kf": Index(format="kf", keyword_facts=[["The Glass Herons", ["formed in 1987"]], ["Maren Volk", []]]),
    "none": Index(format="none"),
}
FORMATS = sorted(INDEX_FORMATS)


def _keys(index: Index) -> set[tuple]:
    """Everything a list index holds, by normalized key."""
    keys = {("k", norm_key(k)) for k in index.keywords} | {("f", norm_key(f)) for f in index.facts}
    keys |= {("r", tuple(norm_key(x) for x in r)) for r in index.relations}
    for k, fs in index.keyword_facts:
        keys |= {("kf", norm_key(k))} | {("kf", norm_key(k), norm_key(f)) for f in fs}
    return keys


def check_invariants(raw: str, fmt: str, previous: Index, question: str) -> None:
    p = parse_step_output(raw, fmt, previous, question)
    assert p.judgment in {"sufficient", "insufficient"}
    if p.judgment == "insufficient":
        assert isinstance(p.next_query, str) and p.next_query.strip()
    else:
        assert p.next_query is None
    assert p.index.format == get_format(fmt).name
    assert set(p.fallbacks) <= FORMAT_FALLBACKS  # in particular no "parser_error:..." hidden by the catch-all
    if fmt in ("kr", "keywords", "facts", "kf"):
        assert _keys(previous) <= _keys(p.index)


questions = st.text(min_size=1, max_size=40).filter(str.strip)
formats = st.sampled_from(FORMATS)


@st.composite
def previous_and_format(draw):
    fmt = draw(formats)
    return fmt, draw(st.sampled_from([empty_index(fmt), PREVIOUS[fmt]]))


def _random_case(draw, s: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s)))
    return "".join(c.upper() if f else c.lower() for c, f in zip(s, flips))


@st.composite
def mangled_outputs(draw):
    """Outputs built from the pieces models emit, in random order, case and completeness."""
    tag = st.sampled_from(["index", "reasoning", "judgment", "judgement", "query", "next_query"])
    word = st.sampled_from(["Coldplay", "1996", "Maren Volk", "sufficient", "insufficient", "none", "not enough",
                            "Judgment:", "Keywords:", "Relationships:", "Facts:", "Summary:", "Keywords and facts:",
                            "Query:", "Reasoning:", "Index:", "->", "→", "|", "-->", "=>", ";", ",", ":", "-", "1.",
                            "**", "(", ")", "```", "```xml", "\n", "\n- ", "  ", "<", ">", "/"])
    pieces = []
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            name = _random_case(draw, draw(tag))
            pieces.append(draw(st.sampled_from([f"<{name}>", f"</{name}>", f"< {name} >", f"</ {name}>"])))
        elif kind == 1:
            pieces.append(draw(word))
        elif kind == 2:
            pieces.append(draw(st.text(max_size=12)))  # junk, unicode included
        else:
            pieces.append(f"{draw(word)} -> {draw(word)} -> {draw(word)}")
    raw = draw(st.sampled_from(["", " ", "\n"])).join(pieces)
    if raw and draw(st.booleans()):
        raw = raw[: draw(st.integers(0, len(raw)))]  # cut off mid-output, as max_tokens does
    return raw


@settings(max_examples=300, deadline=None)
@given(raw=st.text(), pf=previous_and_format(), question=questions)
def test_arbitrary_text_never_breaks_the_step(raw, pf, question):
    fmt, previous = pf
    check_invariants(raw, fmt, previous, question)


@settings(max_examples=300, deadline=None)
@given(raw=mangled_outputs(), pf=previous_and_format(), question=questions)
def test_mangled_outputs_never_break_the_step(raw, pf, question):
    fmt, previous = pf
    check_invariants(raw, fmt, previous, question)


@settings(max_examples=300, deadline=None)
@given(raw=mangled_outputs(), extra=st.text(max_size=20))
def test_canonical_output_with_junk_inserted(raw, extra):
    # Junk spliced into a good output at a random point still gives a usable step.
    at = len(raw) % (len(INSUFFICIENT) + 1)
    check_invariants(INSUFFICIENT[:at] + raw + extra + INSUFFICIENT[at:], "kr", KR_INDEX, Q0)


@pytest.mark.parametrize("fmt", sorted(FORMAT_CASES))
def test_truncating_a_canonical_output_anywhere(fmt):
    body, expected = FORMAT_CASES[fmt]
    raw = f"<index>\n{body}\n</index>\n<reasoning>Not there yet. Judgment: insufficient</reasoning>\n<query>Maren Volk</query>"
    for cut in range(len(raw) + 1):
        check_invariants(raw[:cut], fmt, empty_index(fmt), Q0)
        check_invariants(raw[:cut], fmt, PREVIOUS[fmt], Q0)
    assert parse(raw, fmt).index == expected  # the whole output is still read exactly


def test_a_copied_reply_template_is_not_a_valid_index():
    from kair_runtime.index import empty_index
    from kair_runtime.parser import parse_step_output

    echo = ("<index>\nKeywords: keyword, keyword\nRelationships:\nhead -> relation -> tail\n</index>\n"
            "<reasoning>... Judgment: sufficient or insufficient</reasoning>\n<query>the next search query, or none</query>")
    p = parse_step_output(echo, "kr", empty_index("kr"), "Who founded Orvane Optics?")
    assert p.index.is_empty()
    assert {"template_echo", "index_missing", "query_missing"} <= set(p.fallbacks)
    real = echo.replace("keyword, keyword", "Orvane Optics, Ilse Marr").replace("head -> relation -> tail", "Orvane Optics -> founded by -> Ilse Marr")
    p = parse_step_output(real, "kr", empty_index("kr"), "Who founded Orvane Optics?")
    assert p.index.keywords == ["Orvane Optics", "Ilse Marr"] and "template_echo" not in p.fallbacks
