"""The step layout has one definition (kair_runtime/layout.py): the prompts show it, the renderer
writes it, the parser reads it back and knows its placeholders, on every index format."""

import shutil

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from kair_runtime.index import INDEX_FORMATS, apply_index_update, get_format, has_index_header, norm_key
from kair_runtime.layout import ECHO_ITEMS, ECHO_QUERIES, ECHO_RELATIONS, LAYOUTS, StepLayout, step_layout
from kair_runtime.output_format import render_step_output
from kair_runtime.parser import parse_step_output
from kair_runtime.prompts import PromptSet, default_prompt_dir
from kair_runtime.records import (
    FALLBACK_INDEX_MISSING, FALLBACK_JUDGMENT_UNCLEAR, FALLBACK_QUERY_MISSING, FALLBACK_TEMPLATE_ECHO, Index,
)

FORMATS = sorted(INDEX_FORMATS)
TAIL = "<reasoning>... Judgment: sufficient or insufficient</reasoning>\n<query>the next search query, or none</query>"
# The blocks the prompt files spelled out before the layout had one home (commit 7302913).
OLD_BLOCKS = {
    "kr": "<index>\nKeywords: keyword, keyword\nRelationships:\nhead -> relation -> tail\n</index>\n" + TAIL,
    "text": "<index>\nSummary: a few sentences\n</index>\n" + TAIL,
    "keywords": "<index>\nKeywords: keyword, keyword\n</index>\n" + TAIL,
    "facts": "<index>\nFacts:\n- fact\n- fact\n</index>\n" + TAIL,
    "kf": "<index>\nKeywords and facts:\nkeyword: fact; fact\n</index>\n" + TAIL,
    "none": TAIL,
}


def test_every_format_has_a_layout_and_aliases_find_it():
    assert sorted(LAYOUTS) == FORMATS
    assert step_layout("K&R") is LAYOUTS["kr"]
    assert LAYOUTS["none"].tags == ("reasoning", "query") and LAYOUTS["kr"].tags == ("index", "reasoning", "query")


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_prompts_show_the_block_the_files_spelled_out(fmt):
    assert step_layout(fmt).block == OLD_BLOCKS[fmt]
    prompts = PromptSet.load(fmt)
    for role in ("init", "update"):
        assert prompts.templates[role].endswith("Reply in exactly this layout:\n" + OLD_BLOCKS[fmt] + "\n")
        assert "$layout" not in prompts.templates[role]


def test_a_prompt_copy_with_the_block_written_out_has_the_same_version(tmp_path):
    copy = tmp_path / "prompts"
    shutil.copytree(default_prompt_dir(), copy)
    for path in copy.glob("*/*.txt"):
        path.write_text(path.read_text(encoding="utf-8").replace("$layout", step_layout(path.parent.name).block),
                        encoding="utf-8")
    # An escaped "$$layout" is the literal text "$layout", not the block.
    (copy / "answer.txt").write_text((copy / "answer.txt").read_text(encoding="utf-8") + "$$layout\n", encoding="utf-8")
    for fmt in FORMATS:
        for update in ("merge", "replace"):
            ours, theirs = PromptSet.load(fmt, index_update=update), PromptSet.load(fmt, copy, index_update=update)
            assert {r: theirs.templates[r] for r in ("init", "update")} == {r: ours.templates[r] for r in ("init", "update")}
            assert theirs.version != ours.version  # answer.txt differs ...
    (copy / "answer.txt").write_text((default_prompt_dir() / "answer.txt").read_text(encoding="utf-8"), encoding="utf-8")
    for fmt in FORMATS:
        assert PromptSet.load(fmt, copy).version == PromptSet.load(fmt).version  # ... and only it did


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_copied_block_is_a_template_echo_on_every_format(fmt):
    layout = step_layout(fmt)
    previous = Index(fmt, keywords=["Orvane Optics"], facts=["Ilse Marr founded Orvane Optics"],
                     keyword_facts=[["Orvane Optics", ["founded by Ilse Marr"]]], summary="Ilse Marr founded it.",
                     relations=[["Orvane Optics", "founded by", "Ilse Marr"]])
    p = parse_step_output(layout.block, fmt, previous, "Who founded Orvane Optics?")
    expected = {FALLBACK_JUDGMENT_UNCLEAR, FALLBACK_QUERY_MISSING}
    if layout.expects_index:
        expected.add(FALLBACK_INDEX_MISSING)
    # kf's placeholder line "keyword: fact; fact" reads as a "Keyword:" header (index.py _HEADER),
    # so kf.parse finds no items before the placeholders are looked at: the copy is an invalid
    # step all the same, only without the template_echo mark.
    if layout.expects_index and fmt != "kf":
        expected.add(FALLBACK_TEMPLATE_ECHO)
    assert set(p.fallbacks) == expected
    assert p.index == previous and p.judgment == "insufficient"
    assert p.next_query.startswith("Who founded Orvane Optics?")


# ---------------------------------------------------------------- the inverse, as a property

# Items the renderer can represent: no list, relation or fact separators, no header or tag
# characters (silver's clean_part makes benchmark text so).
WORD = st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,7}", fullmatch=True)
PHRASE = st.lists(WORD, min_size=1, max_size=4).map(" ".join)
ITEM = PHRASE.filter(lambda x: norm_key(x) not in ECHO_ITEMS)


def items(min_size=0):
    return st.lists(ITEM, min_size=min_size, max_size=4, unique_by=norm_key)


RELATION = st.lists(ITEM, min_size=3, max_size=3).filter(lambda r: tuple(map(norm_key, r)) not in ECHO_RELATIONS)
KF_KEY = ITEM.filter(lambda k: not has_index_header(f"{k}:"))  # "Summary: ..." would open a section


@st.composite
def indexes(draw, fmt: str) -> Index:
    if fmt == "kr":
        index = Index(fmt, keywords=draw(items()),
                      relations=draw(st.lists(RELATION, max_size=3, unique_by=lambda r: tuple(map(norm_key, r)))))
    elif fmt == "text":
        index = Index(fmt, summary=draw(ITEM))
    elif fmt == "keywords":
        index = Index(fmt, keywords=draw(items(1)))
    elif fmt == "facts":
        index = Index(fmt, facts=draw(items(1)))
    elif fmt == "kf":
        keys = draw(st.lists(KF_KEY, min_size=1, max_size=3, unique_by=norm_key))
        index = Index(fmt, keyword_facts=[[k, draw(items())] for k in keys])
    else:
        index = Index(fmt)
    assume(fmt == "none" or not index.is_empty())
    return index


QUERY = PHRASE.filter(lambda q: q.split()[0].lower() not in ("none", "null", "na", "no") and norm_key(q) not in ECHO_QUERIES)


@pytest.mark.parametrize("update", ["merge", "replace"])
@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_parse_of_render_is_the_identity(fmt, update, data):
    index = data.draw(indexes(fmt))
    previous = data.draw(indexes(fmt))
    reasoning = data.draw(st.lists(PHRASE, max_size=3).map(". ".join))
    judgment = data.draw(st.sampled_from(["sufficient", "insufficient"]))
    query = data.draw(QUERY) if judgment == "insufficient" else data.draw(st.none() | QUERY)
    raw = render_step_output(index, reasoning, judgment, query)
    p = parse_step_output(raw, fmt, previous, "q0", index_update=update)
    assert p.fallbacks == []
    assert p.index == apply_index_update(fmt, previous, index, update)
    if update == "replace" or fmt == "none":
        assert p.index == (index if fmt != "none" else previous)
    assert p.judgment == judgment
    assert p.next_query == (query if judgment == "insufficient" else None)
    assert p.reasoning == (f"{' '.join(reasoning.split())} Judgment: {judgment}".strip())


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "none"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_the_sections_describe_what_linearize_writes(fmt, data):
    """What a grammar builder reads (headers, item shapes, separators) is what the renderer writes,
    for indexes whose every section has items."""
    layout: StepLayout = step_layout(fmt)
    index = data.draw(indexes(fmt))
    for s in layout.sections:
        assume(getattr(index, s.field))
    text = []
    for s in layout.sections:
        value = getattr(index, s.field)
        if s.field == "summary":
            written = [value]
        elif s.field == "relations":
            written = [s.item.format(*r) for r in value]
        elif s.field == "keyword_facts":
            written = [s.item.format(k, s.part_sep.join(fs)) for k, fs in value]
        else:
            written = [s.item.format(x) for x in value]
        text.append(f"{s.header} {s.sep.join(written)}" if s.inline else f"{s.header}\n{s.sep.join(written)}")
    assert "\n".join(text) == get_format(fmt).linearize(index)
