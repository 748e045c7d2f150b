"""The step and answer grammars of the structured mode (`loop.structured: true`).

Built from the one step layout (kair_runtime/layout.py) in the EBNF dialect xgrammar compiles
(the engine vLLM uses by default, and the hf backend's logits processor), so a grammar means the
same on every backend:

    step_grammar("kr", GrammarBounds())   # <index>...</index><reasoning>... Judgment: x</reasoning><query>..</query>
    answer_grammar(GrammarBounds())       # a short answer: a few words

What the grammar allows, the parser reads as a valid step, with no fallback (tested on every
format in tests/kair_runtime/test_grammar.py), and what training replies write it allows too,
so a tuned student is not pushed off what it learned. Free text is words of letters (ASCII,
Latin, Greek, Cyrillic: "Pál Gábor") and digits, separated by single spaces or the joiners
- ' . & – ("Jean-Luc", "U.S.A", "AT&T", "1914–18"), by ". " in the index and query, by ", "
where the layout has no comma of its own, and in the reasoning also by "; ". After its first
word a phrase's words may be framed: "(2011 film)", '"The Eagle"', "Splash!", "Jr.". A reasoning
word may end in ":" unless it ends in "nt" ("still missing: X"; never "Judgment:"), and the
reasoning may end in a stop. There is no newline, tag, arrow, and outside the reasoning no colon
or semicolon, so text cannot end a section, start a label or header, or split an item. What the
parser drops or reads as "no query" is left out: the layout's placeholder items (a copied
template), an index header word as a K&F keyword, and "none"-like text as the query of an
insufficient step. A sufficient step's query is NO_QUERY. An answer is any printable text but
"<", from a letter, digit, "$", "(" to a letter, digit, ")" or "%" ("J. T. Petty", "$268 million").

Everything that loops is bounded (GrammarBounds): entries per index section, words per entry
part, words of the reasoning, the query and the answer, and characters per word, so every
output is at most `longest(grammar)` bytes. Each generated token is at least one byte, so the
loop gives a structured call that many tokens (or step_max_tokens, if more): a repetition loop
ends in a valid step, never at the token cap. Where that passes the model's context, the
context caps the call (hf here, vLLM itself); no real output comes near it. Which bounds a
student's training replies need: `step_needs` / `answer_needs`, whose maxima data_gen.sft
records as `loop_bounds` in the SFT data's stats.json.
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
from kair_runtime.records import Index

# Letters beyond ASCII, so names are spelled as the documents spell them ("Pál Gábor", "Fårö",
# "Alû"): Latin-1 and Latin Extended-A/B (less the signs x and /), Greek and Cyrillic; each is
# 2 bytes in UTF-8, which `longest` counts.
_LETTERS = "À-ÖØ-öø-ɏͰ-ϿЀ-ӿ"
_ALNUM = f"[A-Za-z0-9{_LETTERS}]"
_ALNUM_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# A reasoning word may end in ":" ("still missing: X", "next: X") unless it ends in "nt", so that
# no word of the reasoning reads as the parser's judgment label ("Judgment:", "prejudgement:").
_NOT_T = f"[A-SU-Za-su-z0-9{_LETTERS}]"
_NOT_N = f"[A-MO-Za-mo-z0-9{_LETTERS}]"
# An answer word is any run of printable characters but "<" (no tag); the answer starts with a
# letter or digit and ends with one (or ")" or "%"), so that extract_answer, which strips an
# "Answer:" prefix, quotes and a final period, never reads it as empty.
_ANSWER_CHAR = "[^ \\t\\n\\r<]"
_ANSWER_START = f"[A-Za-z0-9{_LETTERS}$£€(]"
_ANSWER_END = f"[A-Za-z0-9{_LETTERS})%]"
# Between words with no space: "Jean-Luc", "O'Brien", "U.S.A", "AT&T", "2022-01-22" (3 words),
# "1914–1918" (an en dash).
JOINERS = ("-", "'", ".", "&", "–")


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
            other = "".join(c for c in _ALNUM_CHARS if c not in taken) + _LETTERS
            if left >= 0:
                alts.append(f"[{other}] {_ALNUM}{{0,{left}}}")
            if prefix and prefix not in words:
                alts.append('""')  # the word ends here
            body = " | ".join(f"({a})" for a in alts)
            self.names[key] = self.add(f"wx{len(self.names)}", body) if alts else None
        return self.names[key]

    def framed_word(self) -> str:
        """A word after the first of a phrase may open with "(", '"' or "$" and close with ")",
        '"', "!", "?", "%" or ".": "Always (2011 film)", 'Eddie "The Eagle" Edwards', "Splash!",
        "Smithers Jr.". The first word may not, so a phrase's excluded sequences ("none" as a
        query) stay excluded."""
        return self.add("fword", f'[("$]? {self.word()} [)"!?%.]?')

    def colon_word(self) -> str:
        """A framed word, or one that ends in ":" and not in "nt" (see _NOT_T)."""
        n = self.word_chars
        colon = (f'({_ALNUM}{{0,{n - 1}}} {_NOT_T} ":") | ({_ALNUM}{{0,{max(n - 2, 0)}}} {_NOT_N} [tT] ":") '
                 f'| ([tT] ":")')
        return self.add("cword", f"{self.framed_word()} | {colon}")

    def phrase(self, tag: str, max_words: int, excluded: set[tuple[str, ...]], seps: tuple[str, ...] = (" ",),
               colons: bool = False) -> str:
        """1..max_words words joined by `seps` or a joiner, whose lower-cased words (joined by
        single spaces) are none of `excluded`: a trie over the excluded word sequences.
        colons: a word may end in ":" (the reasoning; needs no excluded sequences)."""
        seps = tuple(dict.fromkeys(seps + JOINERS))
        sep = " | ".join(_lit(s) for s in seps)
        if colons:
            if excluded:
                raise ValueError("a phrase with colons has no excluded sequences")
            word = self.colon_word()
            return self.add(f"{tag}_phrase", f"{word} (({sep}) {word}){{0,{max_words - 1}}}")
        word, later = self.word(), self.framed_word()
        free = lambda n: f"(({sep}) {later}){{0,{n}}}" if n > 0 else '""'

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
            fact = rules.phrase(f"{fmt}_fact", b.entry_words, ECHO_PHRASES, (" ", ". "))
            item.append(f"{fact} ({_lit(section.part_sep)} {fact}){{0,{b.max_entries - 1}}}")
        else:  # a K&F keyword that is a header word would open a new section
            excluded = ECHO_PHRASES | (HEADER_PHRASES if section.part_sep else set())
            # ", " inside a part only where items are a line each (in a one-line list it separates items)
            seps = (" ", ". ") if section.inline else (" ", ". ", ", ")
            item.append(rules.phrase(f"{fmt}_{i}_{k}", b.entry_words, excluded, seps))
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
    reasoning = rules.phrase("reasoning", b.reasoning_words, set(), (" ", ", ", ". ", "; "), colons=True)
    query = rules.phrase("query", b.query_words, NO_QUERY_PHRASES, (" ", ". ", ", "))
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
                # the reasoning's last sentence may end in a stop before the judgment
                out.append(f"({reasoning} [.!?]{{0,2}} \" \")?" if p.name != "index" else f"({index})")
        return " ".join(out)

    per_judgment = " | ".join(f"({fill((Slot(JUDGMENT_TAG),) + tail, j)})" for j in JUDGMENTS)
    return rules.text(f"{fill(head, None)} ({per_judgment})")


def answer_grammar(bounds: GrammarBounds | None = None) -> str:
    """A short answer: 1..answer_words words of at most word_chars printable characters (no "<"),
    single spaces between them, starting and ending with a letter or digit (see _ANSWER_CHAR)."""
    b = bounds or GrammarBounds()
    rules = _Rules(b.word_chars)
    wc = b.word_chars
    word = rules.add("aword", f"{_ANSWER_CHAR}{{1,{wc}}}")
    first = rules.add("afirst", f"{_ANSWER_START} {_ANSWER_CHAR}{{0,{wc - 1}}}")
    last = rules.add("alast", f"{_ANSWER_CHAR}{{0,{wc - 1}}} {_ANSWER_END}")
    only = rules.add("aonly", f"({_ANSWER_START} {_ANSWER_CHAR}{{0,{max(wc - 2, 0)}}} {_ANSWER_END}) | {_ALNUM}")
    if b.answer_words == 1:
        return rules.text(only)
    middle = f'(" " {word}){{0,{b.answer_words - 2}}}' if b.answer_words > 2 else '""'
    return rules.text(f'{only} | ({first} {middle} " " {last})')


# ---------------------------------------------------------------- the bounds an output needs

_WORD = re.compile(f"[A-Za-z0-9{_LETTERS}]+")


def _counted_words(text: str) -> list[str]:
    """Words as the step grammar counts them: runs of letters and digits (joiners separate them)."""
    return _WORD.findall(text)


def step_needs(index: Index, reasoning: str, query: str | None) -> dict[str, int]:
    """The smallest loop.max_* bounds (LoopConfig names) under which the step grammar has room
    for this step's index, reasoning and query: what a tuned student's outputs need when they
    look like its training replies (data_gen.sft records the maxima over its data)."""
    parts = (index.keywords + [p for rel in index.relations for p in rel] + index.facts
             + [kf[0] for kf in index.keyword_facts] + [f for kf in index.keyword_facts for f in kf[1]])
    entries = [len(index.keywords), len(index.relations), len(index.facts), len(index.keyword_facts),
               *(len(kf[1]) for kf in index.keyword_facts)]
    words = [w for text in (*parts, reasoning, query or "") for w in _counted_words(text)]
    return {"max_index_entries": max(entries),
            "max_entry_words": max((len(_counted_words(p)) for p in parts), default=0),
            "max_reasoning_words": len(_counted_words(reasoning)),
            "max_query_words": len(_counted_words(query or "")),
            "max_word_chars": max((len(w) for w in words), default=0)}


def answer_needs(answer: str) -> dict[str, int]:
    """The same for an answer: its space-separated words and the longest of them."""
    words = answer.split()
    return {"max_answer_words": len(words), "max_word_chars": max((len(w) for w in words), default=0)}


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
        elif kind == "cls":  # its widest character in UTF-8 (ranges are listed by their ends)
            body = text[1:-1].encode().decode("unicode_escape").encode("latin-1").decode()
            n = 4 if body.startswith("^") else max(len(c.encode()) for c in body)
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
