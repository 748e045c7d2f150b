"""The five index formats of the paper (A.3), registered by name.

Each format knows how to linearize an `Index` for the prompt (Eq. 7 for K&R), parse one out of
the body of a model's `<index>` section, and merge the model's updated index into the previous
one. How a step's index becomes the loop's index is the loop setting `index_update`
(`apply_index_update`, with the sentence the update prompt says about it). Parsing is lenient (bullets, numbering, `->`/`→`/`|` separators, quotes, stray prose) and
never raises; an index it cannot read comes back empty and the caller decides the fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Protocol

from kair_runtime.records import Index


class IndexFormat(Protocol):
    name: str
    title: str  # how the paper names it

    def linearize(self, index: Index) -> str: ...
    def parse(self, body: str) -> Index: ...
    def merge(self, previous: Index, new: Index) -> Index: ...


INDEX_FORMATS: dict[str, IndexFormat] = {}
_ALIASES = {"k&r": "kr", "k&f": "kf", "keyword": "keywords", "fact": "facts", "summary": "text"}


def register_format(cls: type) -> type:
    INDEX_FORMATS[cls.name] = cls()
    return cls


def get_format(name: str) -> IndexFormat:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in INDEX_FORMATS:
        raise KeyError(f"unknown index format {name!r}; choose one of {sorted(INDEX_FORMATS)}")
    return INDEX_FORMATS[key]


# The index-evolution contract (Eq. 8-9: the model writes I_t; the update is incremental). In every
# format the model writes its updated index; `loop.index_update` says what the loop keeps:
#   merge   I_t = I_{t-1} + what the model wrote: nothing it leaves out is lost, repeats collapse
#           (a text summary keeps the previous sentences it does not repeat);
#   replace I_t = what the model wrote: it may drop what no longer matters.
# Either way an index the model did not write (or that cannot be read) leaves I_{t-1} in place, as a
# recorded fallback (parser.py). The update prompts say the rule in these words ($index_rule):
INDEX_UPDATE_RULES = {
    "merge": "Items of your previous index that you leave out are kept.",
    "replace": "The index you write replaces the previous one: write it whole, keeping what still matters.",
}


def apply_index_update(format_name: str, previous: Index, written: Index, update: str) -> Index:
    if update == "replace":
        return replace(written)
    if update == "merge":
        return get_format(format_name).merge(previous, written)
    raise ValueError(f"index_update must be one of {', '.join(INDEX_UPDATE_RULES)}, got {update!r}")


def empty_index(format_name: str) -> Index:
    return Index(format=get_format(format_name).name)


def index_size(index: Index) -> dict[str, int]:
    """Counts for the paper's Fig 4c (index size per step)."""
    return {
        "keywords": len(index.keywords) + len(index.keyword_facts),
        "relations": len(index.relations),
        "facts": len(index.facts) + sum(len(fs) for _, fs in index.keyword_facts),
        "summary_words": len(index.summary.split()),
    }


# ---------------------------------------------------------------- text helpers

# A numbering mark ("1.", "2)", "(3)") only counts when text follows it, so "1996." and
# "3.5 million" keep their digits.
_BULLET = re.compile(r"^\s*(?:[-*•+–]+|(?:\d{1,3}[.)]|\(\d{1,3}\))(?=\s+\S))\s*")
_EDGE_PUNCT = "\"'`“”‘’*[](){}<>.,;: \t"
_BRACKETS = {"(": ")", "[": "]", "{": "}"}
_OPENERS = {c: o for o, c in _BRACKETS.items()}
_SPACE = re.compile(r"\s+")
# Relation separators real models emit: ->, -->, =>, →, ⟶, ➔, |; " - " only when none of those is there.
# Bare separators: the parts are stripped by clean_item, and `\s*` around a separator that never
# comes is retried from every space of a long run (quadratic).
_REL_SPLIT = re.compile(r"-{1,2}>|=>|→|⟶|➔|\|")
_ARROW = re.compile(r"-{1,2}>|=>|→|⟶|➔")
_DASH_SPLIT = re.compile(r"(?<!\s)\s+[-–—]\s+")
# A list comma, but not the thousands comma of "1,204".
_LIST_SPLIT = re.compile(r";|(?<!\d),|,(?!\d)")


_STRIPPED_CHARS = _EDGE_PUNCT.translate({ord(c): None for c in "()[]{}"})
_STRIPPED = frozenset(_STRIPPED_CHARS)
_HAS_BRACKET = re.compile(r"[()\[\]{}]")


def _strip_edges(text: str) -> str:
    """Strip quotes, bullets' stars and stray punctuation from both ends, but keep a bracket that
    closes one opened inside ("Viva la Vida (album)")."""
    # Works on a window [lo, hi) with bracket counts kept up to date, so a line of a million
    # brackets is stripped in one pass, not re-counted and re-sliced per bracket.
    if not _HAS_BRACKET.search(text):
        return text.strip(_STRIPPED_CHARS)  # nothing to balance: one strip is the fixed point
    counts = {c: text.count(c) for c in "()[]{}"}
    lo, hi = 0, len(text)
    while True:
        before = (lo, hi)
        while lo < hi and text[lo] in _STRIPPED:
            lo += 1
        while hi > lo and text[hi - 1] in _STRIPPED:
            hi -= 1
        first = text[lo] if lo < hi else ""
        if first in _BRACKETS and counts[first] > counts[_BRACKETS[first]]:
            counts[first] -= 1
            lo += 1
        closer = text[hi - 1] if lo < hi else ""
        opener = _OPENERS.get(closer)
        if opener and counts[closer] > counts[opener]:
            counts[closer] -= 1
            hi -= 1
        first, last = (text[lo], text[hi - 1]) if lo < hi else ("", "")
        if first in _BRACKETS and last == _BRACKETS[first] and hi - lo >= 2:
            counts[first] -= 1
            counts[last] -= 1
            if _balanced(counts):
                lo, hi = lo + 1, hi - 1  # a whole item wrapped in one pair: "(Coldplay)"
            else:
                counts[first] += 1
                counts[last] += 1
        if (lo, hi) == before:
            return text[lo:hi]


def _balanced(counts: dict[str, int]) -> bool:
    return all(counts[o] == counts[c] for o, c in _BRACKETS.items())


def _sentences(text: str) -> list[str]:
    return [s for s in (p.strip() for p in _SENTENCE_END.split(text)) if s]


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def clean_item(text: str) -> str:
    text = text.strip()
    if not text:
        return ""
    text = _BULLET.sub("", text)
    return _strip_edges(_SPACE.sub(" ", text))


def norm_key(text: str) -> str:
    """The dedupe key: case and whitespace do not make a new item."""
    return _SPACE.sub(" ", text).strip(_EDGE_PUNCT).casefold()


def _dedupe(items: list[str], key: Callable[[str], str] = norm_key) -> list[str]:
    seen: set[str] = set()
    out = []
    for it in items:
        k = key(it)
        if k and k not in seen:
            seen.add(k)
            out.append(it)
    return out


def _dedupe_relations(rels: list[list[str]]) -> list[list[str]]:
    seen: set[tuple[str, ...]] = set()
    out = []
    for r in rels:
        k = tuple(norm_key(x) for x in r)
        if all(k) and k not in seen:
            seen.add(k)
            out.append(r)
    return out


_HEADER = re.compile(
    r"^[#*\s]*(keywords?(?:\s+and\s+facts)?|key\s*words|relation(?:ship)?s?|facts?|summary|text)\s*(?:[*]+\s*)?[:：]\s*",
    re.IGNORECASE,
)


def _sections(body: str) -> dict[str, list[str]]:
    """Split an index body into labelled sections ("keywords", "relations", ...) of lines.

    Text after a header on the same line is kept as that section's first line.
    Lines before any header go under "" (the caller may treat them as the default section).
    """
    out: dict[str, list[str]] = {"": []}
    current = ""
    for line in body.splitlines():
        m = _HEADER.match(line)
        if m:
            label = m.group(1).lower().replace(" ", "")
            if label.startswith("keyword") and "fact" in label:
                current = "keyword_facts"
            elif label.startswith("key"):
                current = "keywords"
            elif label.startswith("relation"):
                current = "relations"
            elif label.startswith("fact"):
                current = "facts"
            else:
                current = "summary"
            out.setdefault(current, [])
            rest = line[m.end():]
            if rest.strip():
                out[current].append(rest)
        else:
            out.setdefault(current, []).append(line)
    return out


def has_index_header(body: str) -> bool:
    """Whether some line of `body` opens an index section ("Keywords:", "Relationships:", ...)."""
    return any(_HEADER.match(line) for line in body.splitlines())


def _split_list(lines: list[str]) -> list[str]:
    items = []
    for line in lines:
        items += [c for part in _LIST_SPLIT.split(line) if part and (c := clean_item(part))]
    return items


def is_relation_line(line: str) -> bool:
    """Two arrows make a relation line wherever it stands (even under "Keywords:")."""
    return len(_ARROW.findall(line)) >= 2


def parse_relation_line(line: str) -> list[list[str]]:
    """`A -> rel -> B` is one triple; a chain `A -> r1 -> B -> r2 -> C` gives (A,r1,B), (B,r2,C);
    `A -> r -> B; C -> r -> D` on one line gives two triples."""
    line = clean_item(line)
    if not line:
        return []
    if ";" in line and _REL_SPLIT.search(line):
        segments = [seg for seg in line.split(";") if seg.strip()]
        if len(segments) > 1:
            return [t for seg in segments for t in parse_relation_line(seg)]
    parts = [c for p in _REL_SPLIT.split(line) if p and (c := clean_item(p))]
    if len(parts) < 3:
        parts = [p for p in (clean_item(x) for x in _DASH_SPLIT.split(line)) if p]
    if len(parts) < 3:
        # "(A, rel, B)" tuples are another common shape.
        tup = [clean_item(p) for p in line.strip("()[]").split(",")]
        if len(tup) == 3 and all(tup):
            return [tup]
        return []
    triples = []
    for i in range(0, len(parts) - 2, 2):
        triples.append([parts[i], parts[i + 1], parts[i + 2]])
    return triples


@dataclass(frozen=True)
class IndexSection:
    """One header of an index body and how its items follow it: `linearize` writes an index as its
    format's sections, the step layout (layout.py) and the decoding grammar (grammar.py) read them.

    `item` writes one item with a "{}" per part: a keyword "{}", a fact line "- {}", a relation
    "{} -> {} -> {}", a keyword with its facts "{}: {}" (the facts joined by `part_sep`)."""

    header: str  # the line's label, "Keywords:"
    field: str  # the Index field the section holds
    inline: bool  # items on the header's line after one space, else one item per line below it
    item: str
    sep: str  # between items
    part_sep: str = ""  # between the facts of one keyword (kf)

    def write(self, index: Index) -> str:
        value = getattr(index, self.field)
        if self.field == "summary":
            items = [value]
        elif self.field == "keyword_facts":
            items = [self.item.format(k, self.part_sep.join(fs)) for k, fs in value]
        else:
            items = [self.item.format(*x) if isinstance(x, (list, tuple)) else self.item.format(x) for x in value]
        return f"{self.header}{' ' if self.inline else chr(10)}{self.sep.join(items)}"


_KEYWORDS = IndexSection("Keywords:", "keywords", inline=True, item="{}", sep=", ")
# Each format's index body, in the order written: the one definition of what an index looks like.
SECTIONS: dict[str, tuple[IndexSection, ...]] = {
    "kr": (_KEYWORDS, IndexSection("Relationships:", "relations", inline=False, item="{} -> {} -> {}", sep="\n")),
    "text": (IndexSection("Summary:", "summary", inline=True, item="{}", sep=""),),
    "keywords": (_KEYWORDS,),
    "facts": (IndexSection("Facts:", "facts", inline=False, item="- {}", sep="\n"),),
    "kf": (IndexSection("Keywords and facts:", "keyword_facts", inline=False, item="{}: {}", sep="\n", part_sep="; "),),
    "none": (),
}


def write_sections(format_name: str, index: Index) -> str:
    return "\n".join(s.write(index) for s in SECTIONS[format_name])


# ---------------------------------------------------------------- formats

@register_format
class KeywordsRelations:
    name = "kr"
    title = "K&R"

    def linearize(self, index: Index) -> str:
        # No trailing newline under an empty "Relationships:" (the written bytes of every prompt and SFT target).
        return write_sections(self.name, index).rstrip()

    def parse(self, body: str) -> Index:
        sec = _sections(body)
        rel_lines = list(sec.get("relations", []))
        # Relation lines under "Keywords:" or under no header (no "Relationships:") still count.
        kw_lines = sec.get("keywords", [])
        rel_lines += [line for line in kw_lines if is_relation_line(line)]
        keywords = _split_list([line for line in kw_lines if not is_relation_line(line)])
        rel_lines += [line for line in sec.get("", []) if _REL_SPLIT.search(line)]
        relations = [t for line in rel_lines for t in parse_relation_line(line)]
        return Index(format=self.name, keywords=_dedupe(keywords), relations=_dedupe_relations(relations))

    def merge(self, previous: Index, new: Index) -> Index:
        return Index(format=self.name, keywords=_dedupe(previous.keywords + new.keywords),
                     relations=_dedupe_relations(previous.relations + new.relations))


@register_format
class TextSummary:
    name = "text"
    title = "Text"

    def linearize(self, index: Index) -> str:
        return write_sections(self.name, index)

    def parse(self, body: str) -> Index:
        sec = _sections(body)
        lines = sec.get("summary") or [l for k, v in sec.items() for l in v]
        return Index(format=self.name, summary=_SPACE.sub(" ", " ".join(lines)).strip())

    def merge(self, previous: Index, new: Index) -> Index:
        # A summary's items are its sentences: the previous ones the new summary does not repeat
        # come first, then the new summary.
        new_keys = {norm_key(s) for s in _sentences(new.summary)}
        kept = [s for s in _sentences(previous.summary) if norm_key(s) not in new_keys]
        return Index(format=self.name, summary=" ".join(kept + [new.summary.strip()]).strip())


@register_format
class KeywordList:
    name = "keywords"
    title = "Keywords"

    def linearize(self, index: Index) -> str:
        return write_sections(self.name, index)

    def parse(self, body: str) -> Index:
        sec = _sections(body)
        lines = sec.get("keywords") or sec.get("", [])
        return Index(format=self.name, keywords=_dedupe(_split_list(lines)))

    def merge(self, previous: Index, new: Index) -> Index:
        return Index(format=self.name, keywords=_dedupe(previous.keywords + new.keywords))


@register_format
class FactList:
    name = "facts"
    title = "Facts"

    def linearize(self, index: Index) -> str:
        return write_sections(self.name, index)

    def parse(self, body: str) -> Index:
        sec = _sections(body)
        lines = sec.get("facts") or sec.get("", [])
        facts = [clean_item(line) for line in lines]
        return Index(format=self.name, facts=_dedupe([f for f in facts if f]))

    def merge(self, previous: Index, new: Index) -> Index:
        return Index(format=self.name, facts=_dedupe(previous.facts + new.facts))


@register_format
class KeywordFacts:
    name = "kf"
    title = "K&F"

    def linearize(self, index: Index) -> str:
        return write_sections(self.name, index)

    def parse(self, body: str) -> Index:
        sec = _sections(body)
        lines = sec.get("keyword_facts") or sec.get("", []) + sec.get("facts", [])
        pairs: list[list] = []
        for raw in lines:
            nested = raw.startswith((" ", "\t")) and _BULLET.match(raw.lstrip())
            line = clean_item(raw)
            if not line:
                continue
            if nested and pairs:
                pairs[-1][1].append(line)  # an indented bullet under the last keyword
                continue
            key, sep, rest = line.partition(":")
            if not sep:
                pairs.append([line, []])
                continue
            facts = [clean_item(f) for f in rest.split(";")]
            pairs.append([clean_item(key), [f for f in facts if f]])
        return self.merge(Index(format=self.name), Index(format=self.name, keyword_facts=pairs))

    def merge(self, previous: Index, new: Index) -> Index:
        merged: dict[str, list] = {}
        for k, fs in previous.keyword_facts + new.keyword_facts:
            if not norm_key(k):
                continue
            entry = merged.setdefault(norm_key(k), [k, []])
            entry[1] = _dedupe(entry[1] + list(fs))
        return Index(format=self.name, keyword_facts=list(merged.values()))


@register_format
class NoIndex:
    """The "w/o Index" ablation: the loop reasons and writes queries from the documents alone."""

    name = "none"
    title = "w/o Index"
    expects_index = False

    def linearize(self, index: Index) -> str:
        return "(no index)"

    def parse(self, body: str) -> Index:
        return Index(format=self.name)

    def merge(self, previous: Index, new: Index) -> Index:
        return Index(format=self.name)
