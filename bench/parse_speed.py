"""python bench/parse_speed.py [--fuzz 10000] [--seed 0] [--max-bytes 1000000]

Worst-case speed of the step-output parser (kair_runtime/parser.py and the index formats). A model
output is untrusted text: one answer of 2,000 blank lines used to take minutes in the regexes,
on the thread that serves every other request. This parses

  1. pathological shapes: blank lines, spaces, repeated labels/tags/arrows/brackets, unclosed and
     nested tags, long lines without a newline, each repeated to 10 KB, 100 KB and --max-bytes,
     bare and inside an <index> section, in every index format;
  2. --fuzz seeded random outputs recombined from realistic fragments (tags, labels, markdown,
     arrows, judgment lines, unicode, whitespace runs);

and prints, for each part, the count, the exceptions (parser errors included; must be 0),
p50/p99/max parse time and the worst input's shape. The max is of the slowest inputs timed again
(best of 3), so that a preemption on a busy machine is not reported as the parser's worst case. Target: every output up to 1 MB parses in
well under 100 ms.

The shapes and the fuzz generator are also what tests/kair_runtime/test_parser_reliability.py runs.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Iterator

from kair_runtime.index import INDEX_FORMATS, empty_index
from kair_runtime.parser import parse_step_output

FORMATS = sorted(f for f in INDEX_FORMATS if f != "none")
QUESTION = "In what year was the band that recorded the song formed?"

# One unit each, repeated to the wanted size.
SHAPE_UNITS: dict[str, str] = {
    "blank lines": "\n",
    "spaces": " ",
    "tabs and spaces": " \t",
    "whitespace lines": "  \t \n",
    "crlf": "\r\n",
    "unicode spaces": "\u00a0\u3000 ",
    "x without newline": "x",
    "words without newline": "word ",
    "label lines": "Query:\n",
    "bold labels": "**Judgment**:\n",
    "labels on one line": "Reasoning: ",
    "label words without colon": "Query \n",
    "markdown headers": "## \n",
    "stars": "*",
    "hashes and stars": "#* ",
    "open tags": "<index>",
    "close tags": "</reasoning>",
    "spaced tags": "< query >\n",
    "tags then labels": "<reasoning>\nQuery: x\n",
    "label then tag": "Judgment: insufficient <query>",
    "unclosed nested tags": "<index><reasoning><query>",
    "lone angle brackets": "< ",
    "fences": "```\n",
    "fence with spaces": "```xml   \n  ",
    "arrows": " -> ",
    "relation chain": "A -> r -> ",
    "unicode arrows": "→⟶➔",
    "pipes": " | ",
    "dashes": " - ",
    "hyphens": "-",
    "open brackets": "(",
    "closed brackets": "()",
    "mixed brackets": "([{",
    "quotes and punctuation": "\"'`*.,;: ",
    "keywords headers": "Keywords: \n",
    "keywords header words": "Keywords ",
    "list commas": "a, ",
    "keyword facts": "k: f; ",
    "bullets": "- ",
    "numbering": "1. ",
    "judgment words": "not sufficient enough ",
    "need more": "no more information is needed ",
    "judgment labels": "Judgment: ",
    "colons": ":",
    "question marks": "? ",
}


def pathological(unit: str, size: int) -> str:
    return unit * max(1, size // len(unit))


def pathological_inputs(sizes: list[int]) -> Iterator[tuple[str, str]]:
    """(description, text): every shape at every size, bare, inside an <index> section and
    after a canonical opening; a few mixed shapes at the largest size."""
    for name, unit in SHAPE_UNITS.items():
        for size in sizes:
            body = pathological(unit, size)
            yield f"{name} x{len(body) // len(unit)} ({len(body):,} chars)", body
            yield f"<index> + {name} ({len(body):,} chars)", "<index>\n" + body
            yield f"canonical + {name} ({len(body):,} chars)", f"<index>\nKeywords: a, b\n</index>\n<reasoning>{body}"
    big = max(sizes)
    units = list(SHAPE_UNITS.values())
    mixed = "".join(pathological(u, big // len(units)) for u in units)
    yield f"all shapes in turn ({len(mixed):,} chars)", mixed
    yield f"shapes interleaved ({big:,} chars)", "".join(units * (big // sum(map(len, units))))


FRAGMENTS = [
    # tags, in the cases and spacings models produce
    "<index>", "</index>", "<reasoning>", "</reasoning>", "<query>", "</query>", "<judgment>", "</judgment>",
    "<Index>", "</ Index>", "< query >", "<next_query>", "<judgement>", "<", ">", "</", "/>",
    # labels and index headers
    "Index:", "Reasoning:", "Judgment:", "**Judgment:**", "**Judgment**:", "Query:", "Next query:",
    "Keywords:", "Relationships:", "Facts:", "Summary:", "Keywords and facts:", "### Reasoning", "Judgement：",
    # markdown
    "**", "```", "```xml", "#", "- ", "* ", "1. ", "2)", "(3)", "(", ")", "[", "]", "{", "}", "`", "> ",
    # arrows and separators
    "->", "-->", "=>", "→", "⟶", "➔", "|", " - ", ";", ",", ":", "：",
    # judgment lines
    "Judgment: sufficient", "Judgment: insufficient", "Judgment: Sufficient.", "I do not have enough information.",
    "The documents don't provide enough information.", "lacking sufficient evidence", "Judgment: yes", "No.",
    "more information is needed", "sufficient or insufficient", "not yet enough", "nothing is missing",
    # content
    "Coldplay", "1996", "Maren Volk", "The Glass Herons -> formed in -> 1987", "Paper Lanterns on the Quellan",
    "3.5 million", "1,204", "none", "N/A",
    # unicode
    "é", "中文", "Ωμέγα", "🙂", "\u200b", "\u00a0", "\u3000", "\ufeff",
]
WHITESPACE = [" ", "\n", "\t", "\r\n", " \n", "\u00a0"]


def fuzz_output(rng: random.Random) -> str:
    """One output: fragments in random order and case, with whitespace runs of up to a few
    thousand characters between some of them, sometimes cut off as max_tokens does."""
    pieces = []
    for _ in range(rng.randint(0, 120)):
        r = rng.random()
        if r < 0.12:
            pieces.append(rng.choice(WHITESPACE) * rng.choice([1, 2, 10, 100, 1000, 3000]))
        elif r < 0.17:
            pieces.append(rng.choice(FRAGMENTS) * rng.choice([2, 10, 100, 500]))  # a model stuck in a loop
        else:
            frag = rng.choice(FRAGMENTS)
            pieces.append(frag.upper() if rng.random() < 0.1 else frag)
        pieces.append(rng.choice(["", " ", "\n", "\n\n"]))
    raw = "".join(pieces)
    if raw and rng.random() < 0.3:
        raw = raw[: rng.randint(0, len(raw))]
    return raw


def fuzz_inputs(n: int, seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(n):
        yield fuzz_output(rng)


def describe(text: str) -> str:
    """A one-line shape of an input: size, lines, the longest run of one character, its start."""
    longest, char, run = 0, "", 0
    for i, c in enumerate(text):
        run = run + 1 if i and c == text[i - 1] else 1
        if run > longest:
            longest, char = run, c
    return (f"{len(text):,} chars, {text.count(chr(10)):,} newlines, longest run {longest:,} x {char!r}, "
            f"starts {text[:60]!r}")


RETIME = 50  # the slowest inputs are timed again, best of 3: a shared CPU's preemptions are not the parser's


@dataclass
class Timing:
    """Parse times of one set of inputs."""

    times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    slowest: list[tuple[float, str, str, str]] = field(default_factory=list)  # (seconds, label, raw, fmt)

    def add(self, seconds: float, raw: str, fmt: str, label: str) -> None:
        self.times.append(seconds)
        heapq.heappush(self.slowest, (seconds, label, raw, fmt))
        if len(self.slowest) > RETIME:
            heapq.heappop(self.slowest)

    def worst(self) -> tuple[float, str]:
        """The slowest input after re-timing the slowest ones, with its description."""
        retimed = [(min(seconds, *(time_parse(raw, fmt)[0] for _ in range(2))), label or describe(raw))
                   for seconds, label, raw, fmt in self.slowest]
        return max(retimed)

    def line(self, name: str) -> str:
        t = sorted(self.times)
        p99 = t[min(len(t) - 1, int(0.99 * len(t)))]
        worst_s, worst = self.worst()
        return (f"{name:<12} count={len(t):<6} exceptions={len(self.errors)}  p50={statistics.median(t) * 1e3:8.3f} ms  "
                f"p99={p99 * 1e3:8.3f} ms  max={worst_s * 1e3:8.3f} ms (first pass {t[-1] * 1e3:.3f} ms)\n"
                f"{'':<13}worst: {worst}"), worst_s


def time_parse(raw: str, fmt: str) -> tuple[float, str | None]:
    """Seconds to parse `raw`, and the error if the parser failed (a raise, or the parser_error
    its catch-all records)."""
    t0 = time.perf_counter()
    try:
        step = parse_step_output(raw, fmt, empty_index(fmt), QUESTION)
    except Exception as e:  # noqa: BLE001 - counted and reported
        return time.perf_counter() - t0, f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    bugs = [f for f in step.fallbacks if f.startswith("parser_error")]
    return seconds, (bugs[0] if bugs else None)


def run_pathological(sizes: list[int], formats: list[str]) -> Timing:
    timing = Timing()
    for label, raw in pathological_inputs(sizes):
        for fmt in formats:
            seconds, error = time_parse(raw, fmt)
            timing.add(seconds, raw, fmt, f"{label} [{fmt}]")
            if error:
                timing.errors.append(f"{label} [{fmt}]: {error}")
    return timing


def run_fuzz(n: int, seed: int, formats: list[str]) -> Timing:
    timing = Timing()
    for i, raw in enumerate(fuzz_inputs(n, seed)):
        fmt = formats[i % len(formats)]
        seconds, error = time_parse(raw, fmt)
        timing.add(seconds, raw, fmt, f"fuzz #{i} [{fmt}]: {describe(raw)}")
        if error:
            timing.errors.append(f"fuzz #{i} [{fmt}]: {error}")
    return timing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    ap.add_argument("--fuzz", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-bytes", type=int, default=1_000_000)
    args = ap.parse_args()

    for n in (1_000, 2_000):
        seconds, _ = time_parse("\n" * n, "kr")
        print(f"{n:,} blank lines: {seconds * 1e3:.3f} ms")
    sizes = sorted({10_000, 100_000, args.max_bytes})
    patho = run_pathological(sizes, FORMATS)
    line, worst_shape = patho.line("shapes")
    print(line)
    fuzz = run_fuzz(args.fuzz, args.seed, FORMATS)
    line, worst_fuzz = fuzz.line("fuzz")
    print(line)
    for e in (patho.errors + fuzz.errors)[:10]:
        print(f"  exception: {e}")
    worst = max(worst_shape, worst_fuzz)
    ok = not patho.errors and not fuzz.errors and worst < 0.1
    print(f"worst parse {worst * 1e3:.1f} ms; target 0 exceptions and every parse < 100 ms: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
