"""The step and answer grammars of the structured mode (`loop.structured: true`).

Built from the one step layout (kair_runtime/layout.py) in the EBNF dialect xgrammar compiles
(the engine vLLM uses by default, and the hf backend's logits processor), so a grammar means the
same on every backend:

    step_grammar("kr", GrammarBounds())   # <index>...</index><reasoning>... Judgment: x</reasoning><query>..</query>
    answer_grammar(GrammarBounds())       # a short answer: a few words

What the grammar allows, the parser reads as a valid step, with no fallback (tested on every
format in tests/kair_runtime/test_grammar.py). Free text is words of letters and digits
separated by single spaces or the joiners - ' . & ("Jean-Luc", "U.S.A", "AT&T"; and ", " where
the layout has no comma of its own); it has no newline, tag, colon, semicolon or arrow, so it cannot end a section,
start a label or header, or split an item. What the parser drops or reads as "no query" is left
out: the layout's placeholder items (a copied template), an index header word as a K&F keyword,
and "none"-like text as the query of an insufficient step. A sufficient step's query is NO_QUERY.

Everything that loops is bounded (GrammarBounds): entries per index section, words per entry
part, words of the reasoning, the query and the answer, and characters per word, so every
output is at most `longest(grammar)` characters. Each generated token is at least one character,
so the loop gives a structured call that many tokens (or step_max_tokens, if more): a repetition
loop ends in a valid step, never at the token cap.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from kair_runtime.index import has_index_header
from kair_runtime.layout import (
    ECHO_ITEMS, ECHO_QUERIES, JUDGMENT_TAG, JUDGMENTS, NO_QUERY, QUERY_TAG, STOP_JUDGMENT, IndexSection,
    Slot, step_layout,
)
from kair_runtime.parser import NO_QUERY_PHRASINGS, clean_query

_ALNUM = "[A-Za-z0-9]"
_ALNUM_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Between words with no space: "Jean-Luc", "O'Brien", "U.S.A", "AT&T", "2022-01-22" (3 words).
JOINERS = ("-", "'", ".", "&")


@dataclass(frozen=True)
class GrammarBounds:
    """What may repeat in one output (loop.max_index_entries etc. in LoopConfig)."""

    # 6 keywords and 6 relations of <= 6 words a part, 40 words of reasoning, 12 of query: a
    # K&R step is at most 3,514 characters (longest), a typical one ~100-250 tokens.
    max_entries: int = 6  # items per index section (K&F: also facts per keyword)
    entry_words: int = 6  # words per item part (a keyword, a fact, a relation's head...)
    reasoning_words: int = 40
    query_words: int = 12
    answer_words: int = 12
    word_chars: int = 16  # letters or digits in a word between joiners ("Schwarzenegger": 14)

    def __post_init__(self) -> None:
        for name in ("max_entries", "entry_words", "reasoning_words", "query_words", "answer_words", "word_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"grammar bound {name} must be at least 1, got {getattr(self, name)}")


def _lit(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _ci(char: str) -> str:
    """One character, either case."""
    return f"[{char.lower()}{char.upper()}]" if char.isalpha() else _lit(char)


def _ci_word(word: str) -> str:
    return " ".join(_ci(c) for c in word)


class _Rules:
    """A grammar under construction: named rules, each defined once."""

    def __init__(self, word_chars: int) -> None:
        self.word_chars = word_chars
        self.rules: dict[str, str] = {}
        self.names: dict[tuple, str] = {}  # word_except's (words, prefix) -> rule name

    def add(self, name: str, body: str) -> str:
        if self.rules.setdefault(name, body) != body:
            raise AssertionError(f"rule {name} defined twice differently")
        return name

    def text(self, root: str) -> str:
        return f"root ::= {root}\n" + "".join(f"{k} ::= {v}\n" for k, v in self.rules.items())

    # -------------------------------------------------------- words

    def word(self) -> str:
        return self.add("word", f"{_ALNUM}{{1,{self.word_chars}}}")

    def word_except(self, words: frozenset[str], prefix: str = "") -> str | None:
        """A word whose lower case is none of `words` (letters/digits only): a trie over them.
        `prefix` is the word written so far, equal (in any case) to a prefix of some of them.
        None: no such word goes on from `prefix` (it is excluded and as long as a word may be)."""
        self.word()
        key = (words, prefix)
        if key not in self.names:
            nexts = sorted({w[len(prefix)] for w in words if w.startswith(prefix) and len(w) > len(prefix)})
            left = self.word_chars - len(prefix) - 1  # characters still free after the next one
            kids = [(c, self.word_except(words, prefix + c)) for c in nexts] if left >= 0 else []
            alts = [f"{_ci(c)} {kid}" for c, kid in kids if kid]
            taken = {c for n in nexts for c in (n.lower(), n.upper())}
            other = "".join(c for c in _ALNUM_CHARS if c not in taken)
            if left >= 0 and other:
                alts.append(f"[{other}] {_ALNUM}{{0,{left}}}")
            if prefix and prefix not in words:
                alts.append('""')  # the word ends here
            body = " | ".join(f"({a})" for a in alts)
            self.names[key] = self.add(f"wx{len(self.names)}", body) if alts else None
        return self.names[key]

    def phrase(self, tag: str, max_words: int, excluded: set[tuple[str, ...]], seps: tuple[str, ...] = (" ",)) -> str:
        """1..max_words words joined by `seps` or a joiner, whose lower-cased words (joined by
        single spaces) are none of `excluded`: a trie over the excluded word sequences."""
        word = self.word()
        seps = tuple(dict.fromkeys(seps + JOINERS))
        sep = " | ".join(_lit(s) for s in seps)
        free = lambda n: f"(({sep}) {word}){{0,{n}}}" if n > 0 else '""'

        def node(path: tuple[str, ...]) -> str:
            name = self.add(f"{tag}_{len(self.rules)}", "")  # filled below, after its children
            kids = sorted({e[len(path)] for e in excluded if e[:len(path)] == path and len(e) > len(path)
                           and len(e[len(path)]) <= self.word_chars})
            left = max_words - len(path) - 1
            alts = [f"{self.word_except(frozenset(kids))} {free(left)}"]
            for kid in kids:
                here = path + (kid,)
                after = ['""'] if here not in excluded else []
                if left > 0:
                    after.append(f'" " {node(here)}')
                    # another separator or a joiner leaves the excluded sequences
                    others = " | ".join(_lit(s) for s in seps if s != " ")
                    after.append(f"({others}) {word} {free(left - 1)}")
                if after:
                    alts.append(f"{_ci_word(kid)} ({' | '.join(after)})")
            self.rules[name] = " | ".join(f"({a})" for a in alts)
            return name

        return node(())


# What the parser drops or reads as no query, as word sequences a phrase must not be.
def _words(text: str) -> tuple[str, ...]:
    return tuple(text.lower().split())


def _expressible(texts) -> set[tuple[str, ...]]:
    """The texts free text can spell (letters, digits and spaces), as word sequences."""
    return {_words(t) for t in texts if all(w.isalnum() for w in _words(t)) and _words(t)}


ECHO_PHRASES = _expressible(ECHO_ITEMS)
# Header words: a K&F keyword that is one would open a new index section.
_HEADER_WORDS = ["key", "keyword", "keywords", "words", "and", "facts", "fact", "relation", "relations",
                 "relationship", "relationships", "summary", "text"]
HEADER_PHRASES = {p for n in (1, 2, 3, 4) for p in itertools.product(_HEADER_WORDS, repeat=n)
                  if has_index_header(" ".join(p) + ": x")}
# "none"-like queries, as the parser reads them (clean_query gives "" for them): the parser's own
# no-query phrasings, kept where clean_query reads them as no query.
_NO_QUERY_CANDIDATES = [NO_QUERY, "na", "null", *NO_QUERY_PHRASINGS]
NO_QUERY_PHRASES = _expressible(c for c in _NO_QUERY_CANDIDATES if not clean_query(c)) | _expressible(ECHO_QUERIES)


def _section(rules: _Rules, fmt: str, i: int, section: IndexSection, b: GrammarBounds) -> str:
    """One index section as `linearize` writes it: the header, then 1..max_entries items in the
    first section, 0..max_entries in later ones (a K&R index may have no relation yet). A section
    without an item separator holds one item: the text summary, a few sentences' words."""
    header = _lit(section.header)
    if not section.sep:
        body = rules.phrase(f"{fmt}_summary", b.max_entries * b.entry_words, ECHO_PHRASES, (" ", ", ", ". "))
        return f"{header} \" \" {body}"
    parts = section.item.split("{}")
    item = [_lit(parts[0])] if parts[0] else []
    for k, text in enumerate(parts[1:]):
        if section.part_sep and k == 1:  # a keyword's facts
            fact = rules.phrase(f"{fmt}_fact", b.entry_words, ECHO_PHRASES)
            item.append(f"{fact} ({_lit(section.part_sep)} {fact}){{0,{b.max_entries - 1}}}")
        else:  # a K&F keyword that is a header word would open a new section
            excluded = ECHO_PHRASES | (HEADER_PHRASES if section.part_sep else set())
            item.append(rules.phrase(f"{fmt}_{i}_{k}", b.entry_words, excluded))
        if text:
            item.append(_lit(text))
    entry = rules.add(f"{fmt}_entry{i}", " ".join(item))
    sep, low = _lit(section.sep), 1 if i == 0 else 0
    if section.inline:
        items = f"{entry} ({sep} {entry}){{0,{b.max_entries - 1}}}"
        return f"{header} \" \" {items}" if low else f"{header} (\" \" {items})?"
    return f"{header} ({sep} {entry}){{{low},{b.max_entries}}}"


def step_grammar(format_name: str, bounds: GrammarBounds | None = None) -> str:
    """The grammar of one step's output in `format_name`'s layout."""
    b = bounds or GrammarBounds()
    layout = step_layout(format_name)
    rules = _Rules(b.word_chars)
    index = " ".join(f"{_lit(chr(10)) + ' ' if i else ''}{_section(rules, layout.format, i, s, b)}"
                     for i, s in enumerate(layout.sections))
    reasoning = rules.phrase("reasoning", b.reasoning_words, set(), (" ", ", ", ". "))
    query = rules.phrase("query", b.query_words, NO_QUERY_PHRASES)
    skeleton = layout.skeleton
    cut = next(k for k, p in enumerate(skeleton) if isinstance(p, Slot) and p.name == JUDGMENT_TAG)
    head, tail = skeleton[:cut], skeleton[cut + 1:]

    def fill(parts, judgment: str | None) -> str:
        out = []
        for p in parts:
            if not isinstance(p, Slot):
                out.append(_lit(p))
            elif p.name == QUERY_TAG:
                out.append(_lit(NO_QUERY) if judgment == STOP_JUDGMENT else query)
            elif p.name == JUDGMENT_TAG:
                out.append(_lit(judgment))
            else:  # the reasoning slot holds its text and the space after it, or nothing
                out.append(f"({reasoning} \" \")?" if p.name != "index" else f"({index})")
        return " ".join(out)

    per_judgment = " | ".join(f"({fill((Slot(JUDGMENT_TAG),) + tail, j)})" for j in JUDGMENTS)
    return rules.text(f"{fill(head, None)} ({per_judgment})")


def answer_grammar(bounds: GrammarBounds | None = None) -> str:
    """A short answer: 1..answer_words words (", " allowed between them)."""
    b = bounds or GrammarBounds()
    rules = _Rules(b.word_chars)
    return rules.text(rules.phrase("answer", b.answer_words, set(), (" ", ", ")))


# ---------------------------------------------------------------- the longest output

_TOKEN = re.compile(r'\s*(?:(?P<lit>"(?:[^"\\]|\\.)*")|(?P<cls>\[(?:[^\]\\]|\\.)*\])|(?P<name>[A-Za-z_]\w*)'
                    r'|(?P<rep>\{\d+(?:,\d*)?\})|(?P<op>[()|?*+]))')


def longest(grammar: str) -> int:
    """The most characters (UTF-8 bytes) any output of `grammar` can have, read from the EBNF text
    this module writes: literals, character classes, rule names, groups, alternatives, `?` and
    `{m,n}`. An unbounded repetition (`*`, `+`, `{m,}`) is an error: such a grammar bounds nothing."""
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines() if line.strip())
    memo: dict[str, int] = {}

    def rule(name: str) -> int:
        if name not in memo:
            toks = [(m.lastgroup, m.group(m.lastgroup)) for m in _TOKEN.finditer(rules[name])]
            memo[name] = _Longest(toks, rule).alternatives()
        return memo[name]

    return rule("root")


class _Longest:
    """One rule body's longest match, by recursive descent over its tokens."""

    def __init__(self, toks: list[tuple[str, str]], rule) -> None:
        self.toks, self.pos, self.rule = toks, 0, rule

    def peek(self) -> tuple[str, str]:
        return self.toks[self.pos] if self.pos < len(self.toks) else ("end", "")

    def alternatives(self) -> int:
        best = self.sequence()
        while self.peek() == ("op", "|"):
            self.pos += 1
            best = max(best, self.sequence())
        return best

    def sequence(self) -> int:
        total = 0
        while self.peek()[0] != "end" and self.peek() not in (("op", "|"), ("op", ")")):
            total += self.item()
        return total

    def item(self) -> int:
        kind, text = self.peek()
        self.pos += 1
        if kind == "lit":
            n = len(text[1:-1].encode().decode("unicode_escape").encode())
        elif kind == "cls":
            n = 1  # the classes written here are ASCII
        elif kind == "name":
            n = self.rule(text)
        elif text == "(":
            n = self.alternatives()
            self.pos += 1  # the ")"
        else:
            raise ValueError(f"unexpected {text!r} in a grammar rule")
        while self.peek()[0] == "rep" or self.peek() in (("op", "?"), ("op", "*"), ("op", "+")):
            kind, text = self.peek()
            self.pos += 1
            high = text[1:-1].split(",")[-1] if kind == "rep" else ("1" if text == "?" else "")
            if not high:
                raise ValueError(f"unbounded repetition {text!r}: the grammar has no longest output")
            n *= int(high)
        return n
