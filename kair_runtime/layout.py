"""The step layout: what one step's output looks like, defined once for every index format.

    <index>
    Keywords: keyword, keyword          (the index, as the format's `linearize` writes it)
    Relationships:
    head -> relation -> tail
    </index>
    <reasoning>... Judgment: sufficient or insufficient</reasoning>
    <query>the next search query, or none</query>

The "none" format (the w/o-index ablation) has no <index> section. Everything that writes or
reads this layout takes it from here:

- the reply-layout block the init and update prompts end with (`$layout`, filled in by
  prompts.py before the prompt version is hashed): `StepLayout.block`;
- the SFT target renderer (output_format.py): `StepLayout.render`;
- the parser's section tags, judgment label and words, the "none" query, and the placeholders it
  drops as a copied template (parser.py): the constants below and `template_echoes`.

The index body inside <index> is each format's `SECTIONS` (kair_runtime/index.py), which its
`linearize` writes. The decoding grammar (kair_runtime/grammar.py) is built from the same data:
`StepLayout.skeleton` (the literal text between the slots, in order), `StepLayout.sections`,
`JUDGMENTS`, `STOP_JUDGMENT` and `NO_QUERY`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kair_runtime.index import INDEX_FORMATS, SECTIONS, IndexSection, get_format, norm_key
from kair_runtime.records import Index

# The sections, by tag. The judgment has no section of its own in the layout: it closes the
# reasoning as "Judgment: <word>" (the parser also reads a <judgment> section some models write).
INDEX_TAG, REASONING_TAG, QUERY_TAG = "index", "reasoning", "query"
JUDGMENT_TAG = "judgment"
JUDGMENT_LABEL = "Judgment"
JUDGMENTS = ("sufficient", "insufficient")  # stop, search on
STOP_JUDGMENT = JUDGMENTS[0]  # its step's query is NO_QUERY (see `render`); the other's is a search
NO_QUERY = "none"  # the query of a sufficient step

# What the prompts show in place of a step's own reasoning, judgment and query.
REASONING_PLACEHOLDER = "..."
JUDGMENT_PLACEHOLDER = " or ".join(JUDGMENTS)
QUERY_PLACEHOLDER = f"the next search query, or {NO_QUERY}"


# The placeholder items the prompts' layout block shows, per format.
EXAMPLES: dict[str, Index] = {
    "kr": Index("kr", keywords=["keyword", "keyword"], relations=[["head", "relation", "tail"]]),
    "text": Index("text", summary="a few sentences"),
    "keywords": Index("keywords", keywords=["keyword", "keyword"]),
    "facts": Index("facts", facts=["fact", "fact"]),
    "kf": Index("kf", keyword_facts=[["keyword", ["fact", "fact"]]]),
    "none": Index("none"),
}

# Placeholders the parser has dropped since it first looked for template echoes, though no
# prompt's layout ever showed them: variants of a copied layout ("keyword 1, keyword 2", a lone
# "head", "keyword: fact"). Kept, so that outputs are read as before.
LEGACY_ECHO_ITEMS = frozenset({"keyword 1", "keyword 2", "head", "keyword: fact"})
LEGACY_ECHO_QUERIES = frozenset({"the next search query", "next search query"})


@dataclass(frozen=True)
class Slot:
    """A place in the layout's skeleton that a step's own text fills."""

    name: str  # INDEX_TAG, REASONING_TAG, JUDGMENT_TAG or QUERY_TAG


@dataclass(frozen=True)
class StepLayout:
    format: str
    sections: tuple[IndexSection, ...]
    example: Index  # the placeholder index the prompts show

    @property
    def expects_index(self) -> bool:
        return getattr(get_format(self.format), "expects_index", True)

    @property
    def tags(self) -> tuple[str, ...]:
        return ((INDEX_TAG,) if self.expects_index else ()) + (REASONING_TAG, QUERY_TAG)

    @property
    def skeleton(self) -> tuple[str | Slot, ...]:
        """The layout as literal text and slots, in order: what `write` fills and what a grammar
        is built from (a slot's text: the index body, the reasoning and, when there is one, the
        space after it, one of JUDGMENTS, the query or NO_QUERY)."""
        index = (f"<{INDEX_TAG}>\n", Slot(INDEX_TAG), f"\n</{INDEX_TAG}>\n") if self.expects_index else ()
        return index + (f"<{REASONING_TAG}>", Slot(REASONING_TAG), f"{JUDGMENT_LABEL}: ", Slot(JUDGMENT_TAG),
                        f"</{REASONING_TAG}>\n<{QUERY_TAG}>", Slot(QUERY_TAG), f"</{QUERY_TAG}>")

    def write(self, index_text: str, reasoning: str, judgment: str, query: str) -> str:
        """The skeleton filled with written texts; an empty reasoning leaves the judgment alone."""
        values = {INDEX_TAG: index_text, REASONING_TAG: f"{reasoning} " if reasoning else "",
                  JUDGMENT_TAG: judgment, QUERY_TAG: query}
        return "".join(values[part.name] if isinstance(part, Slot) else part for part in self.skeleton)

    @property
    def block(self) -> str:
        """What the init and update prompts show after "Reply in exactly this layout:"."""
        return self.write(get_format(self.format).linearize(self.example), REASONING_PLACEHOLDER,
                          JUDGMENT_PLACEHOLDER, QUERY_PLACEHOLDER)

    def render(self, index: Index, reasoning: str, judgment: str, next_query: str | None) -> str:
        """One step's output in the layout: the SFT target the parser reads back unchanged. The
        reasoning's whitespace is collapsed (one line), and a sufficient step's query is NO_QUERY."""
        check_judgment(judgment)
        query = next_query if judgment != STOP_JUDGMENT and next_query else NO_QUERY
        return self.write(get_format(self.format).linearize(index), " ".join(reasoning.split()), judgment, query)


def check_judgment(judgment: str) -> None:
    if judgment not in JUDGMENTS:
        raise ValueError(f"judgment must be 'sufficient' or 'insufficient', not {judgment!r}")


LAYOUTS: dict[str, StepLayout] = {name: StepLayout(name, SECTIONS[name], EXAMPLES[name]) for name in INDEX_FORMATS}


def step_layout(format_name: str) -> StepLayout:
    """The layout of a format, by any name `get_format` accepts ("k&r" too)."""
    return LAYOUTS[get_format(format_name).name]


def _relation_line(triple: list[str]) -> str:
    return get_format("kr").linearize(Index("kr", relations=[triple])).splitlines()[-1]


# A model that copies the layout verbatim has not written an index, judged or asked anything: the
# parser drops these items (norm_key'd), relations and queries, and records the echo.
ECHO_RELATIONS = tuple(tuple(r) for ex in EXAMPLES.values() for r in ex.relations)
ECHO_ITEMS = frozenset(
    norm_key(x) for ex in EXAMPLES.values()
    for x in ex.keywords + ex.facts + [k for k, _ in ex.keyword_facts] + [f for _, fs in ex.keyword_facts for f in fs]
    + ([ex.summary] if ex.summary else []) + [_relation_line(r) for r in ex.relations]
) | LEGACY_ECHO_ITEMS
ECHO_QUERIES = frozenset({norm_key(QUERY_PLACEHOLDER)}) | LEGACY_ECHO_QUERIES
