import pytest

from kair_runtime.index import INDEX_FORMATS, empty_index
from kair_runtime.output_format import render_step_output
from kair_runtime.parser import parse_step_output
from kair_runtime.records import Index

INDEXES = {
    "kr": Index("kr", keywords=["Lost!", "Coldplay", "1996"],
                relations=[["Lost!", "is a song by", "Coldplay"], ["Coldplay", "formed in", "1996"]]),
    "text": Index("text", summary="Lost! is a song by Coldplay, a band formed in 1996."),
    "keywords": Index("keywords", keywords=["Lost!", "Coldplay"]),
    "facts": Index("facts", facts=["Lost! is a song by Coldplay", "Coldplay formed in 1996"]),
    "kf": Index("kf", keyword_facts=[["Coldplay", ["formed in 1996", "British rock band"]], ["Lost!", ["a song by Coldplay"]]]),
    "none": Index("none"),
}


@pytest.mark.parametrize("fmt", sorted(INDEX_FORMATS))
@pytest.mark.parametrize("judgment,query", [("insufficient", "When was Coldplay formed?"), ("sufficient", None)])
def test_render_then_parse_is_the_identity(fmt, judgment, query):
    index = INDEXES[fmt]
    raw = render_step_output(index, "The band is Coldplay.", judgment, query)
    parsed = parse_step_output(raw, fmt, empty_index(fmt), "q0")
    assert parsed.fallbacks == []
    assert parsed.index == index
    assert parsed.judgment == judgment and parsed.next_query == query
    assert parsed.reasoning.endswith(f"Judgment: {judgment}")


def test_bad_judgment_is_rejected():
    with pytest.raises(ValueError):
        render_step_output(INDEXES["kr"], "", "maybe", None)
