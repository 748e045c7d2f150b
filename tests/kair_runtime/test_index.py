"""The five index formats: linearize/parse round trips, merging, Eq. 7, and lenient parsing."""

from __future__ import annotations

import pytest

from kair_runtime.index import (
    INDEX_FORMATS,
    clean_item,
    empty_index,
    get_format,
    has_index_header,
    index_size,
    norm_key,
    parse_relation_line,
)
from kair_runtime.records import Index

# One realistic index per format, with values that stress the cleaners (parentheses, digits
# with commas and dots, hyphens, "!").
SAMPLES = {
    "kr": Index(format="kr", keywords=["Lost!", "Coldplay", "1996", "Viva la Vida (album)", "1,204 metres"],
                relations=[["Lost!", "is a song by", "Coldplay"], ["Coldplay", "formed in", "1996"],
                           ["Casimir Doyle-Ash", "born in", "Ostremere"]]),
    "text": Index(format="text", summary="Lost! is a song by Coldplay, a band formed in London in 1996."),
    "keywords": Index(format="keywords", keywords=["Lost!", "Coldplay", "3.5 million", "Doyle-Ash"]),
    "facts": Index(format="facts", facts=["Lost! is a song by Coldplay", "Coldplay was formed in 1996",
                                          "The mine employed 1,100 men (at its peak)"]),
    "kf": Index(format="kf", keyword_facts=[["Coldplay", ["British rock band", "formed in 1996"]],
                                            ["Lost!", ["song by Coldplay"]], ["1996", []]]),
    "none": Index(format="none"),  # the "w/o Index" ablation
}


def test_every_registered_format_has_a_sample():
    assert set(INDEX_FORMATS) == set(SAMPLES)
    assert {"kr", "text", "keywords", "facts", "kf"} <= set(INDEX_FORMATS)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_linearize_then_parse_is_the_same_index(name):
    fmt = INDEX_FORMATS[name]
    text = fmt.linearize(SAMPLES[name])
    assert fmt.parse(text) == SAMPLES[name]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_empty_index_round_trips_and_is_empty(name):
    fmt = INDEX_FORMATS[name]
    empty = empty_index(name)
    assert empty.is_empty() and empty.format == name
    assert fmt.parse(fmt.linearize(empty)).is_empty()


@pytest.mark.parametrize("name", sorted(set(SAMPLES) - {"none"}))
def test_linearized_index_is_recognised_as_an_index(name):
    assert has_index_header(INDEX_FORMATS[name].linearize(SAMPLES[name]))
    assert not has_index_header("Lost! is a song by Coldplay.\nIt came out in 2008.")


def test_kr_linearization_is_eq7():
    text = get_format("k&r").linearize(Index(
        format="kr", keywords=["Lost!", "Coldplay", "1996"],
        relations=[["Lost!", "is a song by", "Coldplay"], ["Coldplay", "formed in", "1996"]]))
    assert text == ("Keywords: Lost!, Coldplay, 1996\n"
                    "Relationships:\n"
                    "Lost! -> is a song by -> Coldplay\n"
                    "Coldplay -> formed in -> 1996")


def test_aliases_resolve_and_unknown_names_fail_clearly():
    assert get_format("K&R").name == "kr" and get_format("K&F").name == "kf"
    assert get_format("summary").name == "text" and get_format("Fact").name == "facts"
    with pytest.raises(KeyError, match="unknown index format 'graph'"):
        get_format("graph")


def test_kr_merge_dedupes_by_case_and_whitespace_keeping_first_order():
    kr = get_format("kr")
    prev = Index(format="kr", keywords=["Coldplay", "Lost!"], relations=[["Lost!", "is a song by", "Coldplay"]])
    new = Index(format="kr", keywords=["coldplay", "  Lost! ", "1996", "COLDPLAY"],
                relations=[["lost!", "is a  song by", "coldplay"], ["Coldplay", "formed in", "1996"]])
    merged = kr.merge(prev, new)
    assert merged.keywords == ["Coldplay", "Lost!", "1996"]
    assert merged.relations == [["Lost!", "is a song by", "Coldplay"], ["Coldplay", "formed in", "1996"]]


def test_list_merges_keep_first_spelling_and_order():
    kw = get_format("keywords").merge(Index(format="keywords", keywords=["Mount Corran"]),
                                      Index(format="keywords", keywords=["mount  corran", "Ambrose Tull"]))
    assert kw.keywords == ["Mount Corran", "Ambrose Tull"]
    facts = get_format("facts").merge(Index(format="facts", facts=["Tull climbed Corran in 1846"]),
                                      Index(format="facts", facts=["TULL CLIMBED CORRAN IN 1846", "Corran is 1,204 m"]))
    assert facts.facts == ["Tull climbed Corran in 1846", "Corran is 1,204 m"]


def test_kf_merge_joins_facts_under_one_keyword():
    kf = get_format("kf")
    merged = kf.merge(Index(format="kf", keyword_facts=[["Coldplay", ["British band"]]]),
                      Index(format="kf", keyword_facts=[["coldplay", ["british  band", "formed in 1996"]],
                                                        ["Lost!", ["a song"]]]))
    assert merged.keyword_facts == [["Coldplay", ["British band", "formed in 1996"]], ["Lost!", ["a song"]]]


def test_text_merge_keeps_the_previous_sentences_the_new_summary_does_not_repeat():
    """A summary's items are its sentences: under merge a model that writes only the new part loses
    nothing (before, the newest summary replaced the whole previous one)."""
    text = get_format("text")
    old = Index(format="text", summary="Lost! is a song by Coldplay. Coldplay is a British band.")
    new = Index(format="text", summary="coldplay is a british  band. Coldplay formed in 1996.")
    assert text.merge(old, new).summary == ("Lost! is a song by Coldplay. "
                                            "coldplay is a british  band. Coldplay formed in 1996.")
    assert text.merge(old, Index(format="text")).summary == old.summary


@pytest.mark.parametrize("sep", ["->", "→", "|", "-->", "=>"])
def test_every_separator_parses(sep):
    assert parse_relation_line(f"Lost! {sep} is a song by {sep} Coldplay") == [["Lost!", "is a song by", "Coldplay"]]
    assert parse_relation_line(f"Lost!{sep}is a song by{sep}Coldplay") == [["Lost!", "is a song by", "Coldplay"]]


def test_other_relation_shapes():
    # A chain is split into consecutive triples.
    assert parse_relation_line("Lost! -> song by -> Coldplay -> formed in -> 1996") == [
        ["Lost!", "song by", "Coldplay"], ["Coldplay", "formed in", "1996"]]
    assert parse_relation_line("A -> r -> B; C -> s -> D") == [["A", "r", "B"], ["C", "s", "D"]]
    assert parse_relation_line("(Coldplay, formed in, 1996)") == [["Coldplay", "formed in", "1996"]]
    assert parse_relation_line("Lost! - is a song by - Coldplay") == [["Lost!", "is a song by", "Coldplay"]]
    assert parse_relation_line("| Maren Volk | born in | Kestwick |") == [["Maren Volk", "born in", "Kestwick"]]
    # Hyphens inside names are not separators, and a dangling arrow is not a triple.
    assert parse_relation_line("Jay-Z -> born in -> 1969") == [["Jay-Z", "born in", "1969"]]
    assert parse_relation_line("Coldplay -> formed in") == []
    assert parse_relation_line("just some prose, nothing more") == []


def test_kr_parse_strips_bullets_numbering_quotes_and_markdown():
    body = """**Keywords:** "Lost!", `Coldplay`, 1996.
**Relationships:**
1. "Lost!" -> is a song by -> Coldplay
2) Coldplay → formed in → 1996.
- **Coldplay** -> based in -> London
* Viva la Vida (album) => released in => 2008
(5) Oasis -> formed in -> Manchester
"""
    idx = get_format("kr").parse(body)
    assert idx.keywords == ["Lost!", "Coldplay", "1996"]
    assert idx.relations == [["Lost!", "is a song by", "Coldplay"], ["Coldplay", "formed in", "1996"],
                             ["Coldplay", "based in", "London"], ["Viva la Vida (album)", "released in", "2008"],
                             ["Oasis", "formed in", "Manchester"]]


def test_kr_parse_finds_relations_without_a_header_and_under_keywords():
    body = "Keywords: Coldplay, 1996\nColdplay -> formed in -> 1996\nLost! -> is a song by -> Coldplay"
    idx = get_format("kr").parse(body)
    assert idx.keywords == ["Coldplay", "1996"]
    assert idx.relations == [["Coldplay", "formed in", "1996"], ["Lost!", "is a song by", "Coldplay"]]
    bare = get_format("kr").parse("Here is the index.\nA -> r -> B")
    assert bare.keywords == [] and bare.relations == [["A", "r", "B"]]


def test_kr_parse_of_prose_is_empty():
    assert get_format("kr").parse("I could not find anything useful in these documents.").is_empty()
    assert get_format("kr").parse("").is_empty()


def test_list_formats_without_headers_and_with_bullets():
    assert get_format("keywords").parse("- Coldplay\n- 1996\n- coldplay").keywords == ["Coldplay", "1996"]
    assert get_format("keywords").parse("Key words: Blur; Oasis, 1,100").keywords == ["Blur", "Oasis", "1,100"]
    assert get_format("facts").parse("1. Coldplay formed in 1996.\n2. 3.5 million people live in X.\n\n").facts == [
        "Coldplay formed in 1996", "3.5 million people live in X"]
    assert get_format("text").parse("Coldplay formed\n  in 1996.").summary == "Coldplay formed in 1996."


def test_kf_parse_accepts_inline_and_nested_facts():
    body = "Keywords and facts:\n- Coldplay: British band; formed in 1996\n- Lost!\n    - a song by Coldplay\n    - from 2008"
    idx = get_format("kf").parse(body)
    assert idx.keyword_facts == [["Coldplay", ["British band", "formed in 1996"]],
                                 ["Lost!", ["a song by Coldplay", "from 2008"]]]


def test_clean_item_and_norm_key():
    assert clean_item('  - "Viva la Vida (album)".  ') == "Viva la Vida (album)"
    assert clean_item("(Coldplay)") == "Coldplay"
    assert clean_item("1996.") == "1996"
    assert clean_item("3.5 million") == "3.5 million"
    assert clean_item("12) Blur") == "Blur"
    assert norm_key("  The   Glass Herons ") == norm_key("the glass herons") == "the glass herons"


def test_index_size_counts_each_part():
    assert index_size(SAMPLES["kr"]) == {"keywords": 5, "relations": 3, "facts": 0, "summary_words": 0}
    assert index_size(SAMPLES["kf"]) == {"keywords": 3, "relations": 0, "facts": 3, "summary_words": 0}
    assert index_size(SAMPLES["facts"])["facts"] == 3
    assert index_size(SAMPLES["text"])["summary_words"] == 13
    assert index_size(Index(format="kr")) == {"keywords": 0, "relations": 0, "facts": 0, "summary_words": 0}
