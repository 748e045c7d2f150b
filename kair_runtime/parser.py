"""Parse one step's model output into index, reasoning, judgment and next query.

The canonical layout the prompts ask for (kair_runtime/layout.py, where its tags, judgment words
and placeholders are defined) is

    <index>...</index>
    <reasoning>... Judgment: sufficient|insufficient</reasoning>
    <query>next query</query>

Real models (a 135M one especially) drop closing tags, change case, wrap things in markdown
fences, or skip sections. `parse_step_output` accepts all of that, never raises, and records in
`fallbacks` every repair it had to make so that format validity can be counted.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass, field

from kair_runtime.index import norm_key, IndexFormat, apply_index_update, get_format, has_index_header
from kair_runtime.records import (
    FALLBACK_INDEX_MISSING,
    FALLBACK_JUDGMENT_MISSING,
    FALLBACK_JUDGMENT_UNCLEAR,
    FALLBACK_OUTPUT_TRUNCATED,
    FALLBACK_QUERY_MISSING,
    FALLBACK_TEMPLATE_ECHO,
    Index,
)
from kair_runtime.layout import (
    ECHO_ITEMS, ECHO_QUERIES, ECHO_RELATIONS, INDEX_TAG, JUDGMENT_TAG, JUDGMENTS, NO_QUERY,
    QUERY_TAG, REASONING_TAG,
)

# The layout's tags, and the spellings models write for them: "judgement", "next query".
JUDGMENT_WORD = rf"{JUDGMENT_TAG}|judgement"
_TAG_NAMES = rf"{INDEX_TAG}|{REASONING_TAG}|{JUDGMENT_WORD}|{QUERY_TAG}|next[ _]{QUERY_TAG}"
_OPEN = re.compile(rf"<\s*({_TAG_NAMES})\s*>", re.IGNORECASE)
_CLOSE = re.compile(rf"<\s*/\s*({_TAG_NAMES})\s*>", re.IGNORECASE)
# Whitespace inside one line. The line-start patterns below must not let `\s` run across
# newlines: with MULTILINE, `^\s*` retried at every line start of N blank lines is cubic.
_WS = r"[^\S\n]"
_FENCE = re.compile(rf"^{_WS}*```[\w-]*{_WS}*$", re.MULTILINE)
# Plain-label fallbacks for models that write "Reasoning:" instead of tags. Each optional run is
# written so that only one split of the line can match it (no `\s*[#*]*\s*`), which keeps a
# failed match linear in the line.
_LABEL = re.compile(
    rf"^{_WS}*(?:[#*]+{_WS}*)?({INDEX_TAG}|{REASONING_TAG}|{JUDGMENT_WORD}|(?:next{_WS}+)?{QUERY_TAG})"
    rf"{_WS}*(?:[*]+{_WS}*)?[:：]",
    re.IGNORECASE | re.MULTILINE,
)
# "No query" in words: no [further|more|new] [search] query|queries [[is|are] needed]. One home
# for the phrasing: this regex and the grammar's phrases a query may not be (kair_runtime.grammar)
# are both built from these slots ("" marks an optional slot).
NO_QUERY_SLOTS = (("no",), ("", "further", "more", "new"), ("", "search"), ("query", "queries"),
                  ("", "needed", "is needed", "are needed"))
NO_QUERY_PHRASINGS = tuple(" ".join(w for w in p if w) for p in itertools.product(*NO_QUERY_SLOTS))


def _slots_pattern(slots: tuple[tuple[str, ...], ...]) -> str:
    parts = []
    for i, slot in enumerate(slots):
        alts = "|".join(r"\s+".join(map(re.escape, w.split())) for w in slot if w)
        sep = r"\s+" if i else ""
        parts.append(f"(?:{sep}(?:{alts}))" + ("?" if "" in slot else ""))
    return "".join(parts)


_NO_QUERY = re.compile(rf"^({NO_QUERY}|n/?a|null|-+|{_slots_pattern(NO_QUERY_SLOTS)})\.?$", re.IGNORECASE)
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
    if INDEX_TAG not in out:
        first = min([m.start() for m in opens] + [m.start() for m in _LABEL.finditer(text)] + [len(text)])
        preamble = text[:first].strip()
        if has_index_header(preamble):
            out[INDEX_TAG] = preamble
    return out


def _split_labels(text: str, skip: list[tuple[int, int, str | None]] = ()) -> dict[str, str]:
    """Sections marked by plain labels at line starts; a body ends at the next label or tag.
    Labels inside a `skip` span are ignored, unless the span was left open and is another kind."""
    starts = [a for a, _, _ in skip]  # the spans are disjoint and in order

    def skipped(m: re.Match) -> bool:
        i = bisect.bisect_right(starts, m.start()) - 1
        if i < 0:
            return False
        a, b, open_name = skip[i]
        return m.start() < b and open_name in (None, _canonical(m.group(1)))

    marks = [m for m in _LABEL.finditer(text) if not skipped(m)]
    out: dict[str, str] = {}
    for i, m in enumerate(marks):
        name = _canonical(m.group(1))
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        tag = _ANY_TAG.search(text, m.end(), end)
        body = text[m.end(): tag.start() if tag else end]
        if name == JUDGMENT_TAG:
            body = m.group(0).split(":", 1)[0] + ":" + body  # keep the label for judgment parsing
        out.setdefault(name, body.strip())
    return out


def _canonical(tag: str) -> str:
    tag = tag.lower().replace(" ", "_")
    if tag.startswith("judg"):
        return JUDGMENT_TAG
    if tag.endswith(QUERY_TAG):
        return QUERY_TAG
    return tag


# ---------------------------------------------------------------- the judgment
#
# A judgment is read clause by clause. A clause can say the knowledge is enough ("sufficient",
# "enough", "adequate") or that it is not ("insufficient", "we still need more", "more evidence is
# required"). Stopping on a misread "not enough" ends the search early, while continuing on a
# misread "enough" costs one retrieval, so any clause that reads as insufficient decides, and a
# sufficiency word only means "enough" when nothing around it takes that back:
#   - a negation or limitation anywhere in its clause, before the word or after it ("sufficient
#     information has not been found", "sufficient for the first hop only", "sufficient to say we
#     cannot answer yet"), unless that negation denies a need instead ("nothing is missing",
#     "we do not need more");
#   - a hedge or condition before it ("may be sufficient", "once we find the year it will be");
#   - a later clause of its sentence that opens with a negation or a contrast and limits it
#     ("Sufficient: no", "enough for the singer but not his birthplace");
#   - a "No." answering a question about it ("Is the information sufficient? No.").

# How much text a judgment is read from: a few sentences of a reasoning the prompts ask to keep
# to one or two (step outputs are 256-512 tokens), so a runaway output costs no more to judge.
_JUDGMENT_WINDOW = 4_000
JUDGMENT_LABEL_PATTERN = re.compile(rf"(?:{JUDGMENT_WORD})[*_ \t]*[:：]", re.IGNORECASE)  # "**Judgment**: x" too
# The reply layout's placeholder ("sufficient or insufficient", either order, "/" or "|" for "or"),
# copied verbatim: the model has not judged anything.
_EITHER = "|".join(JUDGMENTS)
_JUDGMENT_ECHO = re.compile(rf"[\W_]*(?:{_EITHER})\s*(?:or|/|\|)\s*(?:{_EITHER})[\W_]*")
# Asides that would otherwise cut a negation off from its word ("do not, however, give enough").
_ASIDE = re.compile(r",\s*(?:however|though|therefore|unfortunately|in fact|so far|currently|also)\s*,")
_SENTENCE = re.compile(r"[^.!?;\n]+[.!?;\n]*")
# Clause breaks, kept by the split (one group) so that a contrast can be told from a comma.
_CONTRASTS = ("but", "however", "although", "though", "whereas", "while")
_CLAUSE_BREAK = re.compile(r"([,:(){}\[\]—–]|\s-\s|\b(?:" + "|".join(_CONTRASTS) + r")\b)")
_SUFFICIENT = re.compile(r"\b(?:sufficient(?:ly)?|enough|adequate(?:ly)?)\b")
_INSUFFICIENT = re.compile(r"\b(?:insufficient(?:ly)?|inadequate(?:ly)?|not\s+yet|yet\s+to)\b")
_NEED_MORE = re.compile(
    r"\b(?:still\s+)?(?:need|needs|needed|require|requires|required)\s+(?:more|further|additional|another|other|"
    r"to\s+(?:find|search|retrieve|look|know|learn|identify|determine|confirm|verify|check))\b"
    r"|\b(?:more|further|additional)\s+(?:\w+\s+){0,3}?(?:is\s+|are\s+)?(?:still\s+)?(?:needed|required|necessary)\b"
    r"|\bstill\s+(?:need|needs|require|requires|missing|lack|lacks|lacking|unknown|unclear)\b"
)
# Only read where the text is the judgment itself (after a "Judgment:" label or in a
# <judgment> tag); in free reasoning these words are about the documents, not the decision.
_STATEMENT_NEG = re.compile(
    r"\b(?:missing|lack|lacks|lacking|absent|incomplete|unknown|unclear|uncertain|unanswerable)\b"
    r"|\b(?:cannot|can't|can\s+not|unable\s+to|not\s+able\s+to|impossible\s+to)\s+(?:yet\s+)?(?:be\s+)?"
    r"(?:answer|determin|confirm|identif|tell|know|conclude|verify|find)"
)
_STATEMENT_POS = re.compile(r"\b(?:complete|answerable)\b|\b(?:can|could)\s+(?:now\s+)?(?:be\s+)?(?:answer|determin)")
_TERSE = re.compile(r"[\W_]*(yes|no)\b(?!\s+\w)")  # "Yes." / "No, the year is missing" but not "No further..."
# A negation right before a "need more" or "missing" cancels it ("no more information is
# needed", "we do not need further searches", "nothing is missing").
_NEGATION = re.compile(r"\b(?:not|no|never|nor|neither|nothing|none|without|hardly|barely|"
                       r"dont|doesnt|didnt|isnt|arent|wasnt|werent|havent|hasnt|wont)\b|n't\b")
# Anywhere in a clause, these keep a sufficiency word in it from meaning "enough": negations, and
# absence, failure and limits of scope or degree.
_LIMIT = re.compile(
    _NEGATION.pattern + r"|\b(?:cannot|can\s+not|unable|fail(?:s|ed|ing)?\s+to|lack(?:s|ed|ing)?|missing|absent|"
    r"unknown|unclear|uncertain|unavailable|unanswered|unconfirmed|unverified|only|partial(?:ly)?|partly|"
    r"incomplete(?:ly)?|yet|except|excluding|apart\s+from|part\s+of|(?:first|one|single)\s+(?:hop|step)|"
    r"far\s+from|less\s+than|almost|nearly)\b"
)
# Hedges and conditions count only before the word ("may be sufficient", "if we knew the year, it
# would be sufficient"): after it they usually say what the knowledge decides ("enough to tell
# whether he was born there").
_HEDGE = re.compile(r"\b(?:may|might|would|possibly|perhaps|whether|if|once|until|unless)\b")
# A negation that denies a need or a gap affirms the knowledge ("no further search", "no doubt",
# "not only", "do not need", "nothing is missing", "no passage is lacking"): what may follow it,
# right away or after at most two words. Bounded and over disjoint classes, so linear.
_DENIED_NEED = re.compile(
    r"[^\w'.!?;]*(?:(?:any|an?|the)\s+)?(?:more|further|additional|other|else|extra|only|just|merely|"
    r"doubts?|question|ambiguity|gaps?|conflicts?|contradictions?|problems?|issues?)\b"
    r"|(?:[^\w'.!?;]+[\w']+){0,2}?[^\w'.!?;]+(?:need(?:s|ed|ing)?|requir(?:e|es|ed|ing)|necessary|missing|"
    r"lack(?:s|ing)?|absent|left|remain(?:s|ing)?|unknown|unclear|uncertain)\b"
)
# How a later clause that takes a sufficiency claim back opens ("Sufficient: no", "enough for the
# singer, not his birthplace", "sufficient, yet the year is missing").
_TAKE_BACK = re.compile(r"[^\w']*(?:not|no|none|never|neither|nor|without|yet|except|only)\b")


def parse_judgment(text: str, statement: bool = False) -> str | None:
    """"sufficient", "insufficient", or None when `text` does not decide.

    The last `Judgment:` label wins over words elsewhere: its line, else the text after it.
    `statement` says the whole text is the judgment (a <judgment> section), so terse answers
    ("Yes.", "No, the year is missing") and "missing"/"cannot answer" count there too."""
    last = None
    for last in JUDGMENT_LABEL_PATTERN.finditer(text):
        pass
    if last is None:
        # Asked for at the end of the reasoning: its last sentences decide.
        return _judge(text[-_JUDGMENT_WINDOW:], statement)
    after = text[last.end():last.end() + _JUDGMENT_WINDOW].lstrip()
    line = after.split("\n", 1)[0]
    return _judge(line, True) or _judge(after, False)


def _judge(text: str, statement: bool) -> str | None:
    text = _ASIDE.sub(" ", text.lower().replace("’", "'").replace("‘", "'"))
    if _JUDGMENT_ECHO.fullmatch(text):
        return None
    sufficient = False
    asked = False  # the previous sentence asked whether the knowledge is enough
    for sentence in _SENTENCE.finditer(text):
        sentence = sentence.group()
        if sentence.rstrip().endswith("?"):
            # "Is the year given?" asserts nothing, but a terse answer may follow it.
            asked = _judge_sentence(sentence, statement, False) == "sufficient"
            continue
        verdict = _judge_sentence(sentence, statement, asked)
        asked = False
        if verdict == "insufficient":
            return verdict
        sufficient = sufficient or verdict == "sufficient"
    return "sufficient" if sufficient else None


def _judge_sentence(sentence: str, statement: bool, answers: bool) -> str | None:
    """`answers` says the sentence follows a question whether the knowledge is enough, so a terse
    "Yes."/"No." answers it, as it does wherever the text is the judgment itself."""
    claimed = False  # a clause so far said "enough"; a later one may take it back
    if (statement or answers) and (terse := _TERSE.match(sentence)):
        if terse.group(1) == "no":
            return "insufficient"
        claimed = True
    pieces = _CLAUSE_BREAK.split(sentence)  # clause, break, clause, break, ...
    for brk, clause in zip([""] + pieces[1::2], pieces[::2]):
        if claimed and (brk in _CONTRASTS or _TAKE_BACK.match(clause)) and _limited(clause):
            return "insufficient"
        verdict = _judge_clause(clause, statement)
        if verdict == "insufficient":
            return verdict
        claimed = claimed or verdict == "sufficient"
    return "sufficient" if claimed else None


def _judge_clause(clause: str, statement: bool) -> str | None:
    if _INSUFFICIENT.search(clause):
        return "insufficient"
    negatives = [_NEED_MORE] + ([_STATEMENT_NEG] if statement else [])
    positives = [_SUFFICIENT] + ([_STATEMENT_POS] if statement else [])
    found = None
    for cue in negatives:
        for m in cue.finditer(clause):
            if not _negated_just_before(clause, m.start()):
                return "insufficient"
            found = "sufficient"  # "no more is needed"
    hedge = _HEDGE.search(clause)
    limited = None  # read once, and only for a clause that claims enough
    for cue in positives:
        for m in cue.finditer(clause):
            if limited is None:
                limited = _limited(clause)
            if limited or (hedge and hedge.start() < m.start()):
                return "insufficient"
            found = "sufficient"
    return found


def _limited(clause: str) -> bool:
    """Whether the clause holds a negation or limitation that is not itself denied: a negation
    followed by a need ("no further search is needed"), or a gap word under a negation ("nothing
    is missing") affirms rather than limits."""
    for m in _LIMIT.finditer(clause):
        if _NEGATION.fullmatch(m.group()):
            if not _DENIED_NEED.match(clause, m.end()):
                return True
        elif not _negated_just_before(clause, m.start()):
            return True
    return False


def _negated_just_before(clause: str, at: int) -> bool:
    """A negation among the three words before `at` ("no further", "do not need", "nothing is")."""
    before = clause[max(0, at - 40):at].split()[-3:]
    return any(_NEGATION.fullmatch(w.strip("*_\"'`")) or w.endswith("n't") for w in before)


# A small model that copies the reply layout verbatim has not written an index: the layout's
# placeholder items (layout.ECHO_ITEMS, ECHO_RELATIONS) are dropped and the echo recorded, so
# format validity is not inflated by parroting.
def drop_placeholders(index: Index) -> tuple[Index, bool]:
    """The index without items copied from the prompt's reply template; True if any were."""
    keep = lambda x: norm_key(x) not in ECHO_ITEMS
    cleaned = Index(
        format=index.format,
        keywords=[k for k in index.keywords if keep(k)],
        relations=[r for r in index.relations if tuple(norm_key(x) for x in r) not in ECHO_RELATIONS],
        facts=[f for f in index.facts if keep(f)],
        keyword_facts=[[k, [f for f in fs if keep(f)]] for k, fs in index.keyword_facts if keep(k)],
        summary="" if norm_key(index.summary) in ECHO_ITEMS else index.summary,
    )
    return cleaned, cleaned != index


def clean_query(text: str) -> str:
    for line in text.splitlines():
        line = _QUERY_PREFIX.sub("", line, count=1)
        line = line.strip().strip("\"'`“”*").strip()
        if line:
            return "" if _NO_QUERY.match(line) or norm_key(line) in ECHO_QUERIES else line
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


# Step outputs are generated with step_max_tokens of 256-512 (a few thousand characters); an
# output 10x that is a runaway model or a broken upstream. Only its head is parsed (and the cut
# recorded), which bounds the parse of any output, whatever its size, to a few milliseconds.
MAX_OUTPUT_CHARS = 32_768


def parse_step_output(raw: str, format_name: str, previous: Index, question: str,
                      index_update: str = "merge") -> ParsedStep:
    """The step's `index` is the loop's index after this step: what the model wrote applied to
    `previous` by `index_update` (index.py's contract). Never raises on what the model wrote; an
    unknown `format_name` or `index_update` is the caller's bug and raises."""
    fmt = get_format(format_name)
    apply_index_update(format_name, previous, previous, index_update)  # the caller's bug raises here
    try:
        raw = raw if isinstance(raw, str) else str(raw)
        if len(raw) <= MAX_OUTPUT_CHARS:
            return _parse(raw, fmt, previous, question, index_update)
        step = _parse(raw[:MAX_OUTPUT_CHARS], fmt, previous, question, index_update)
        step.fallbacks.append(FALLBACK_OUTPUT_TRUNCATED)
        return step
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

    body = sections.get(INDEX_TAG)
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

    reasoning = sections.get(REASONING_TAG, "")
    judgment_src = sections.get(JUDGMENT_TAG)
    judgment = parse_judgment(judgment_src, statement=True) if judgment_src is not None else None
    if judgment is None and reasoning:
        judgment = parse_judgment(reasoning)
    if judgment is None:
        # Undecided is never "sufficient": the loop searches on, and the step counts as a repair.
        judgment = "insufficient"
        written = judgment_src is not None or JUDGMENT_LABEL_PATTERN.search(reasoning)
        fallbacks.append(FALLBACK_JUDGMENT_UNCLEAR if written else FALLBACK_JUDGMENT_MISSING)

    next_query: str | None = None
    if judgment == "insufficient":
        next_query = clean_query(sections.get(QUERY_TAG, ""))
        if not next_query:
            next_query = fallback_query(question, index)
            fallbacks.append(FALLBACK_QUERY_MISSING)
    return ParsedStep(index=index, reasoning=reasoning, judgment=judgment, next_query=next_query,
                      fallbacks=fallbacks)
