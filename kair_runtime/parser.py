"""Parse one step's model output into index, reasoning, judgment and next query.

The canonical layout the prompts ask for is

    <index>...</index>
    <reasoning>... Judgment: sufficient|insufficient</reasoning>
    <query>next query</query>

Real models (a 135M one especially) drop closing tags, change case, wrap things in markdown
fences, or skip sections. `parse_step_output` accepts all of that, never raises, and records in
`fallbacks` every repair it had to make so that format validity can be counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kair_runtime.index import norm_key, IndexFormat, apply_index_update, get_format, has_index_header
from kair_runtime.records import (
    FALLBACK_INDEX_MISSING,
    FALLBACK_JUDGMENT_MISSING,
    FALLBACK_QUERY_MISSING,
    FALLBACK_TEMPLATE_ECHO,
    Index,
)

TAGS = ("index", "reasoning", "judgment", "query")
_OPEN = re.compile(r"<\s*(index|reasoning|judgment|judgement|query|next[ _]query)\s*>", re.IGNORECASE)
_CLOSE = re.compile(r"<\s*/\s*(index|reasoning|judgment|judgement|query|next[ _]query)\s*>", re.IGNORECASE)
_FENCE = re.compile(r"^\s*```[\w-]*\s*$", re.MULTILINE)
# Plain-label fallbacks for models that write "Reasoning:" instead of tags.
_LABEL = re.compile(
    r"^\s*[#*]*\s*(index|reasoning|judg(?:e)?ment|(?:next\s+)?query)\s*[*]*\s*[:：]", re.IGNORECASE | re.MULTILINE
)
_INSUFFICIENT = re.compile(
    r"\b(insufficient|not\s+(?:yet\s+)?(?:sufficient|enough)|need(?:s)?\s+more)\b", re.IGNORECASE
)
_SUFFICIENT = re.compile(r"\b(sufficient|enough\s+information)\b", re.IGNORECASE)
_JUDGMENT_LABEL = re.compile(r"judg(?:e)?ment[*_\s]*[:：]\s*(.*)", re.IGNORECASE)  # "**Judgment**: x" too
_NO_QUERY = re.compile(
    r"^(none|n/?a|null|-+|no\s+(?:further\s+|more\s+|new\s+)?(?:search\s+)?quer(?:y|ies)(?:\s+(?:is\s+|are\s+)?needed)?)\.?$",
    re.IGNORECASE,
)
# Numbering or a "Query:" label before the query text; a query that starts with a year keeps it.
_QUERY_PREFIX = re.compile(r"^\s*(?:[-*•]+\s*|\d{1,2}[.)]\s+)*(?:(?:next\s+)?(?:search\s+)?query\s*[:：])?\s*",
                           re.IGNORECASE)
_ANY_TAG = re.compile(f"{_OPEN.pattern}|{_CLOSE.pattern}", re.IGNORECASE)


@dataclass
class ParsedStep:
    index: Index
    reasoning: str
    judgment: str  # "sufficient" | "insufficient"
    next_query: str | None
    fallbacks: list[str] = field(default_factory=list)


def split_sections(raw: str) -> dict[str, str]:
    """Return the text of each tagged section. A section runs to its closing tag, or else to the
    next opening tag, or else to the end. The first occurrence of a tag wins. Sections with no
    tag are filled from plain labels ("Query: ..."), and an untagged index that opens the output
    ("Keywords: ..." before the first tag or label) is taken as the index."""
    text = _FENCE.sub("", raw)
    opens = list(_OPEN.finditer(text))
    out: dict[str, str] = {}
    spans: list[tuple[int, int, str | None]] = []  # (start, end, name if never closed)
    for i, m in enumerate(opens):
        name = _canonical(m.group(1))
        end = opens[i + 1].start() if i + 1 < len(opens) else len(text)
        close = _CLOSE.search(text, m.end(), end)
        body_end = close.start() if close else end
        spans.append((m.start(), body_end, None if close else name))
        out.setdefault(name, text[m.end(): body_end].strip())
    # A label inside a closed section belongs to it ("Judgment:" in <reasoning>...</reasoning>);
    # in a section left open, a label of another kind ("Query:") starts that kind.
    for name, body in _split_labels(text, skip=spans).items():
        out.setdefault(name, body)
    if "index" not in out:
        first = min([m.start() for m in opens] + [m.start() for m in _LABEL.finditer(text)] + [len(text)])
        preamble = text[:first].strip()
        if has_index_header(preamble):
            out["index"] = preamble
    return out


def _split_labels(text: str, skip: list[tuple[int, int, str | None]] = ()) -> dict[str, str]:
    """Sections marked by plain labels at line starts; a body ends at the next label or tag.
    Labels inside a `skip` span are ignored, unless the span was left open and is another kind."""
    def skipped(m: re.Match) -> bool:
        return any(a <= m.start() < b and open_name in (None, _canonical(m.group(1))) for a, b, open_name in skip)

    marks = [m for m in _LABEL.finditer(text) if not skipped(m)]
    out: dict[str, str] = {}
    for i, m in enumerate(marks):
        name = _canonical(m.group(1))
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        tag = _ANY_TAG.search(text, m.end(), end)
        body = text[m.end(): tag.start() if tag else end]
        if name == "judgment":
            body = m.group(0).split(":", 1)[0] + ":" + body  # keep the label for judgment parsing
        out.setdefault(name, body.strip())
    return out


def _canonical(tag: str) -> str:
    tag = tag.lower().replace(" ", "_")
    if tag.startswith("judg"):
        return "judgment"
    if tag.endswith("query"):
        return "query"
    return tag


def parse_judgment(text: str) -> str | None:
    """"insufficient" wins over "sufficient" (it contains it); an explicit `Judgment:` label wins
    over words elsewhere in the reasoning."""
    labelled = _JUDGMENT_LABEL.findall(text)
    candidates = [labelled[-1]] if labelled else [text]
    for c in candidates:
        if _INSUFFICIENT.search(c):
            return "insufficient"
        if _SUFFICIENT.search(c):
            return "sufficient"
    return None


# The reply layout in the prompts uses these words as placeholders. A small model that copies
# the layout verbatim has not written an index: the items are dropped (and the echo recorded),
# so format validity is not inflated by parroting.
_PLACEHOLDER_ITEMS = frozenset({"keyword", "keyword 1", "keyword 2", "fact", "head", "a few sentences",
                                "keyword: fact", "head -> relation -> tail"})
_PLACEHOLDER_QUERIES = frozenset({"the next search query, or none", "the next search query", "next search query"})


def drop_placeholders(index: Index) -> tuple[Index, bool]:
    """The index without items copied from the prompt's reply template; True if any were."""
    keep = lambda x: norm_key(x) not in _PLACEHOLDER_ITEMS
    cleaned = Index(
        format=index.format,
        keywords=[k for k in index.keywords if keep(k)],
        relations=[r for r in index.relations if [norm_key(x) for x in r] != ["head", "relation", "tail"]],
        facts=[f for f in index.facts if keep(f)],
        keyword_facts=[[k, [f for f in fs if keep(f)]] for k, fs in index.keyword_facts if keep(k)],
        summary="" if norm_key(index.summary) in _PLACEHOLDER_ITEMS else index.summary,
    )
    return cleaned, cleaned != index


def clean_query(text: str) -> str:
    for line in text.splitlines():
        line = _QUERY_PREFIX.sub("", line, count=1)
        line = line.strip().strip("\"'`“”*").strip()
        if line:
            return "" if _NO_QUERY.match(line) or norm_key(line) in _PLACEHOLDER_QUERIES else line
    return ""


def fallback_query(question: str, index: Index) -> str:
    """q0 plus the newest anchor: the last relation's tail (or last keyword/fact key)."""
    tail = ""
    if index.relations:
        tail = index.relations[-1][2]
    elif index.keyword_facts:
        tail = index.keyword_facts[-1][0]
    elif index.keywords:
        tail = index.keywords[-1]
    return f"{question} {tail}".strip()


def parse_step_output(raw: str, format_name: str, previous: Index, question: str,
                      index_update: str = "merge") -> ParsedStep:
    """The step's `index` is the loop's index after this step: what the model wrote applied to
    `previous` by `index_update` (index.py's contract). Never raises on what the model wrote; an
    unknown `format_name` or `index_update` is the caller's bug and raises."""
    fmt = get_format(format_name)
    apply_index_update(format_name, previous, previous, index_update)  # the caller's bug raises here
    try:
        return _parse(raw if isinstance(raw, str) else str(raw), fmt, previous, question, index_update)
    except Exception as e:  # the contract is "never raises": record the bug instead
        return ParsedStep(
            index=previous, reasoning="", judgment="insufficient",
            next_query=fallback_query(question, previous),
            fallbacks=[FALLBACK_INDEX_MISSING, FALLBACK_JUDGMENT_MISSING, FALLBACK_QUERY_MISSING,
                       f"parser_error:{type(e).__name__}"],
        )


def _parse(raw: str, fmt: IndexFormat, previous: Index, question: str, index_update: str) -> ParsedStep:
    sections = split_sections(raw)
    fallbacks: list[str] = []

    body = sections.get("index")
    parsed = fmt.parse(body) if body is not None else None
    if parsed is not None:
        parsed, echoed = drop_placeholders(parsed)
        if echoed:
            fallbacks.append(FALLBACK_TEMPLATE_ECHO)
    if not getattr(fmt, "expects_index", True):
        index = previous  # the no-index ablation: nothing to parse, nothing missing
    elif parsed is None or parsed.is_empty():
        index = previous
        fallbacks.append(FALLBACK_INDEX_MISSING)
    else:
        index = apply_index_update(fmt.name, previous, parsed, index_update)

    reasoning = sections.get("reasoning", "")
    judgment_src = sections.get("judgment")
    if judgment_src is not None:
        judgment = parse_judgment(judgment_src) or parse_judgment(reasoning)
    else:
        judgment = parse_judgment(reasoning) if reasoning else None
    if judgment is None:
        judgment = "insufficient"
        fallbacks.append(FALLBACK_JUDGMENT_MISSING)

    next_query: str | None = None
    if judgment == "insufficient":
        next_query = clean_query(sections.get("query", ""))
        if not next_query:
            next_query = fallback_query(question, index)
            fallbacks.append(FALLBACK_QUERY_MISSING)
    return ParsedStep(index=index, reasoning=reasoning, judgment=judgment, next_query=next_query,
                      fallbacks=fallbacks)
