"""Benchmark loaders, registered by name: official files in, `Question` records out.

    hotpotqa          `_id, question, answer, type, level, supporting_facts, context`
    musique           `id, question, answer, answer_aliases, paragraphs, question_decomposition`
    2wikimultihopqa   `_id, question, answer, type, context, supporting_facts, evidences` (alias 2wiki)
    bamboogle         `idx, question, answer` (no paragraphs: open retrieval)
    flashrag          FlashRAG's uniform `{id, question, golden_answers, metadata}`

A file is a JSON array or jsonl, told apart by its first non-space character, read as UTF-8 (a
BOM at the start is dropped) by kair_runtime.jsonl. Every Question
keeps the gold annotations in `metadata`, under the same keys for every benchmark that has them:

    context                [{title, text}]   the question's own paragraphs (for closed corpora)
    supporting_titles      [title]           gold paragraph titles, in annotation order
    supporting_paragraphs  [{title, text}]   gold paragraphs whose text the record contains
    supporting_facts       [[title, sent]]   HotpotQA / 2Wiki sentence-level evidence
    supporting_sentences   [{title, sent_idx, text}]  those sentences, where the context has them
    decomposition          MuSiQue sub-questions {id, question, answer, paragraph_support_idx, title}
    evidences              2Wiki [subject, relation, object] triples
    type / level           question type (MuSiQue: the hop type from the id, e.g. "3hop1")

A malformed record raises `DatasetError` naming the file and line (record index for a JSON
array); with `skip_malformed=True` it is skipped and listed in `LoadResult.skipped`.
A Bamboogle record without `idx` gets its 1-based position in the file as id. A record with keys of
another benchmark's schema (`SIGNATURES`) is malformed: the file was named as the wrong benchmark,
and so is one whose question is blank or not text (records.question_problem) or that has no gold answer.
Two records with one id, or a file with no question, raise `DatasetError` (even in skip mode).

`hub=True` (needs internet) reads hub copies instead: hotpotqa/hotpot_qa (distractor) and
dgslibisey/MuSiQue, rebuilt into the official schema, and FlashRAG's copies of 2Wiki and
Bamboogle, whose metadata is kept as FlashRAG wrote it (not the keys above).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from kair_runtime.errors import UserError
from kair_runtime.jsonl import BadLine, JsonlError, iter_json_records
from kair_runtime.records import Question, question_problem

log = logging.getLogger(__name__)


class DatasetError(UserError, ValueError):
    pass


class MalformedRecord(ValueError):
    """Raised by a parser with the reason only; the reader adds where it happened."""


Parser = Callable[[dict[str, Any], int], Question]  # (record, 1-based position) -> Question
HubRows = Callable[[str], list[dict[str, Any]]]  # split -> rows, in the schema `hub_schema` parses


@dataclass(frozen=True)
class BenchmarkLoader:
    """A registry entry: how one benchmark's files are found and parsed (what a config names
    is eval.specs.DatasetSpec)."""

    name: str
    parse: Parser
    files: dict[str, tuple[str, ...]]  # split -> its files under the shared data dir, read in order
    has_paragraphs: bool = True
    hub: HubRows | None = None
    hub_schema: str | None = None  # the loader that parses the hub rows; None: this one


DATASETS: dict[str, BenchmarkLoader] = {}
ALIASES: dict[str, str] = {}
SPLIT_ALIASES = {"validation": "dev", "val": "dev"}


def register(name: str, files: dict[str, tuple[str, ...]], aliases: tuple[str, ...] = (), has_paragraphs: bool = True,
             hub: HubRows | None = None, hub_schema: str | None = None) -> Callable[[Parser], Parser]:
    def add(parse: Parser) -> Parser:
        DATASETS[name] = BenchmarkLoader(name, parse, files, has_paragraphs, hub, hub_schema)
        for alias in aliases:
            ALIASES[alias] = name
        return parse
    return add


def get_spec(name: str) -> BenchmarkLoader:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in DATASETS:
        raise KeyError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS) + sorted(ALIASES)}")
    return DATASETS[key]


# ---------------------------------------------------------------- reading files


def shared_data_dir() -> Path:
    """KAIR_SHARED_DATA, else `../shared/data` next to the repository root."""
    env = os.environ.get("KAIR_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"


def dataset_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Yield (location, record) from a JSON array or a jsonl file (kair_runtime.jsonl's reading
    rules: UTF-8, a BOM dropped, errors naming file and line). A jsonl line that is not JSON
    comes through as a MalformedRecord in place of the record, so skip mode can count it."""
    try:
        for where, rec in iter_json_records(path, keep_bad=True):
            yield where, MalformedRecord(rec.reason) if isinstance(rec, BadLine) else rec
    except JsonlError as e:
        raise DatasetError(str(e)) from None


# ---------------------------------------------------------------- field checks


def _get(rec: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in rec:
        raise MalformedRecord(f"missing key {key!r}")
    value = rec[key]
    if not isinstance(value, kind):
        raise MalformedRecord(f"key {key!r} should be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _text(rec: dict[str, Any], key: str) -> str:
    value = _get(rec, key, (str, int, float))
    return str(value)


def _titled_sentences(context: Any, key: str = "context") -> list[tuple[str, list[str]]]:
    """HotpotQA / 2Wiki `[[title, [sentence, ...]], ...]`."""
    if not isinstance(context, list):
        raise MalformedRecord(f"key {key!r} should be a list of [title, [sentences]]")
    out = []
    for i, item in enumerate(context):
        ok = (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
              and isinstance(item[1], list) and all(isinstance(s, str) for s in item[1]))
        if not ok:
            raise MalformedRecord(f"{key}[{i}] should be [title, [sentences]], got {str(item)[:80]!r}")
        out.append((item[0], item[1]))
    return out


def _facts(rec: dict[str, Any]) -> list[list[Any]]:
    facts = _get(rec, "supporting_facts", list)
    for i, fact in enumerate(facts):
        if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[0], str) and isinstance(fact[1], int)):
            raise MalformedRecord(f"supporting_facts[{i}] should be [title, sentence_index], got {fact!r}")
    return [[t, s] for t, s in facts]


# Keys that only one benchmark's records have: a record carrying another benchmark's keys is that
# benchmark's, and parsing it with this loader would give silently wrong questions (a HotpotQA
# file read as Bamboogle loses its ids and paragraphs; a 2Wiki file read as HotpotQA joins its
# sentences without spaces).
SIGNATURES: dict[str, frozenset[str]] = {
    "hotpotqa": frozenset({"_id", "context", "supporting_facts"}),
    "2wikimultihopqa": frozenset({"evidences", "entity_ids"}),
    "musique": frozenset({"paragraphs", "question_decomposition"}),
    "flashrag": frozenset({"golden_answers"}),
    "ircot": frozenset({"question_text", "answers_objects", "contexts"}),  # IRCoT's processed files
}


def _not_foreign(rec: dict[str, Any], own: str, allowed: frozenset[str] = frozenset()) -> None:
    """Refuse a record that has keys of another benchmark's schema (`allowed`: keys this one shares)."""
    for other, keys in SIGNATURES.items():
        found = sorted((keys - allowed) & rec.keys())
        if other != own and found:
            raise MalformedRecord(f"has {', '.join(map(repr, found))}, keys of the {other} schema, not {own}'s; "
                                  f"name the dataset the file belongs to")


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _sentence_level_gold(context: list[tuple[str, list[str]]], facts: list[list[Any]],
                         joiner: str) -> dict[str, Any]:
    """Gold annotations shared by HotpotQA and 2Wiki: titles, paragraphs, sentences.

    A supporting title can be absent from the record's context (HotpotQA dev has such
    records); it stays in `supporting_titles` but has no paragraph or sentence."""
    titles = _unique([t for t, _ in facts])
    wanted = set(titles)
    paragraphs = {(t, joiner.join(s)): None for t, s in context if t in wanted}  # dedupe, keep order
    sentences = []
    for title, idx in facts:
        for t, sents in context:
            if t == title and 0 <= idx < len(sents):
                sentences.append({"title": title, "sent_idx": idx, "text": sents[idx].strip()})
                break
    return {
        "context": [{"title": t, "text": joiner.join(s)} for t, s in context],
        "supporting_facts": facts,
        "supporting_titles": titles,
        "supporting_paragraphs": [{"title": t, "text": x} for t, x in paragraphs],
        "supporting_sentences": sentences,
    }


# ---------------------------------------------------------------- hub copies (need internet)


def _hub_rows(repo: str, split: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Rows of a Hugging Face hub dataset; an offline machine gets a clear error."""
    try:
        import datasets as hf_datasets  # imported here: heavy, and only this path needs it
        return [dict(r) for r in hf_datasets.load_dataset(repo, split=split, **kwargs)]
    except Exception as e:  # the hub raises many kinds (ConnectionError, OfflineModeIsEnabled, ...)
        raise DatasetError(f"could not load {repo!r} split {split!r} from the Hugging Face hub "
                           f"(needs internet and HF_HUB_OFFLINE unset): {type(e).__name__}: {e}") from e


_HUB_SPLITS = {"dev": "validation", "train": "train", "test": "test"}


def _hub_hotpotqa(split: str) -> list[dict[str, Any]]:
    """`hotpotqa/hotpot_qa` distractor stores lists as columns; rebuild the official rows."""
    rows = _hub_rows("hotpotqa/hotpot_qa", _HUB_SPLITS.get(split, split), name="distractor")
    return [{"_id": r["id"], "question": r["question"], "answer": r["answer"], "type": r["type"],
             "level": r["level"],
             "supporting_facts": [list(x) for x in zip(r["supporting_facts"]["title"], r["supporting_facts"]["sent_id"])],
             "context": [[t, list(s)] for t, s in zip(r["context"]["title"], r["context"]["sentences"])]}
            for r in rows]


def _hub_musique(split: str) -> list[dict[str, Any]]:
    return _hub_rows("dgslibisey/MuSiQue", _HUB_SPLITS.get(split, split))  # already the official schema


def _hub_flashrag(folder: str) -> HubRows:
    """FlashRAG's copies: `{id, question, golden_answers, metadata}` per benchmark folder."""
    def rows(split: str) -> list[dict[str, Any]]:
        return _hub_rows("RUC-NLPIR/FlashRAG_datasets", "train", data_files=f"{folder}/{split}.jsonl")
    return rows


# ---------------------------------------------------------------- the loaders


@register("hotpotqa", aliases=("hotpot",), hub=_hub_hotpotqa,
          files={"dev": ("hotpotqa/dev_distractor_500.jsonl",),
                 "train": ("hotpotqa/train_100.json", "hotpotqa/train_499.jsonl")})
def parse_hotpotqa(rec: dict[str, Any], pos: int) -> Question:
    _not_foreign(rec, "hotpotqa")
    context = _titled_sentences(_get(rec, "context", list))
    meta = {"type": rec.get("type", ""), "level": rec.get("level", "")}
    # HotpotQA sentences keep their leading space, so "".join restores the paragraph.
    meta.update(_sentence_level_gold(context, _facts(rec), joiner=""))
    return Question(id=_text(rec, "_id"), question=_get(rec, "question", str), answers=[_text(rec, "answer")],
                    dataset="hotpotqa", metadata=meta)


@register("2wikimultihopqa", aliases=("2wiki", "2wikimqa", "twowiki"),
          files={"dev": ("2wikimultihopqa/dev_164.jsonl",), "train": ("2wikimultihopqa/train_1000.jsonl",)},
          hub=_hub_flashrag("2wikimultihopqa"), hub_schema="flashrag")
def parse_2wiki(rec: dict[str, Any], pos: int) -> Question:
    _not_foreign(rec, "2wikimultihopqa", allowed=SIGNATURES["hotpotqa"])
    context = _titled_sentences(_get(rec, "context", list))
    evidences = _get(rec, "evidences", list)
    for i, ev in enumerate(evidences):
        if not (isinstance(ev, list) and len(ev) == 3):
            raise MalformedRecord(f"evidences[{i}] should be [subject, relation, object], got {ev!r}")
    meta = {"type": rec.get("type", ""), "evidences": [[str(x) for x in ev] for ev in evidences]}
    # 2Wiki sentences carry no leading space, so they are joined with one.
    meta.update(_sentence_level_gold(context, _facts(rec), joiner=" "))
    return Question(id=_text(rec, "_id"), question=_get(rec, "question", str), answers=[_text(rec, "answer")],
                    dataset="2wikimultihopqa", metadata=meta)


@register("musique", hub=_hub_musique,
          files={"dev": ("musique/ans_dev_200.jsonl",), "train": ("musique/train_100.json", "musique/train_300.jsonl")})
def parse_musique(rec: dict[str, Any], pos: int) -> Question:
    _not_foreign(rec, "musique")
    qid = _text(rec, "id")
    paragraphs = _get(rec, "paragraphs", list)
    context, supporting, by_idx = [], [], {}
    for i, p in enumerate(paragraphs):
        if not (isinstance(p, dict) and isinstance(p.get("title"), str) and isinstance(p.get("paragraph_text"), str)):
            raise MalformedRecord(f"paragraphs[{i}] needs string 'title' and 'paragraph_text'")
        para = {"title": p["title"], "text": p["paragraph_text"]}
        context.append(para)
        by_idx[p.get("idx", i)] = para
        if p.get("is_supporting"):
            supporting.append(para)
    decomposition = []
    for i, step in enumerate(_get(rec, "question_decomposition", list)):
        if not (isinstance(step, dict) and "question" in step and "answer" in step):
            raise MalformedRecord(f"question_decomposition[{i}] needs 'question' and 'answer'")
        support = step.get("paragraph_support_idx")
        decomposition.append({"id": step.get("id"), "question": str(step["question"]), "answer": str(step["answer"]),
                              "paragraph_support_idx": support,
                              "title": by_idx[support]["title"] if support in by_idx else None})
    aliases = [str(a) for a in _get(rec, "answer_aliases", list)] if "answer_aliases" in rec else []
    meta = {"type": qid.split("__", 1)[0] if "__" in qid else "", "answerable": rec.get("answerable", True),
            "context": context, "supporting_titles": _unique([p["title"] for p in supporting]),
            "supporting_paragraphs": supporting, "decomposition": decomposition}
    return Question(id=qid, question=_get(rec, "question", str),
                    answers=_unique([_text(rec, "answer"), *aliases]), dataset="musique", metadata=meta)


@register("bamboogle", files={"test": ("bamboogle/test_125.jsonl",)}, has_paragraphs=False,
          hub=_hub_flashrag("bamboogle"), hub_schema="flashrag")
def parse_bamboogle(rec: dict[str, Any], pos: int) -> Question:
    _not_foreign(rec, "bamboogle")
    qid = _text(rec, "idx") if "idx" in rec else str(pos)
    return Question(id=qid, question=_get(rec, "question", str), answers=[_text(rec, "answer")],
                    dataset="bamboogle", metadata={})


@register("flashrag", files={})
def parse_flashrag(rec: dict[str, Any], pos: int) -> Question:
    _not_foreign(rec, "flashrag")
    answers = _get(rec, "golden_answers", list)
    if not answers:
        raise MalformedRecord("'golden_answers' is empty")
    metadata = rec.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise MalformedRecord(f"'metadata' should be an object, got {type(metadata).__name__}")
    return Question(id=_text(rec, "id"), question=_get(rec, "question", str), answers=[str(a) for a in answers],
                    dataset="flashrag", metadata=dict(metadata))


# ---------------------------------------------------------------- public entry points


@dataclass
class LoadResult:
    """The questions loaded, plus every record skipped (`location: reason`), never silently."""

    questions: list[Question]
    skipped: list[str] = field(default_factory=list)
    source: str = ""

    def __iter__(self) -> Iterator[Question]:
        return iter(self.questions)

    def __len__(self) -> int:
        return len(self.questions)

    def __getitem__(self, i: int) -> Question:
        return self.questions[i]


def read_questions(name: str, records: Iterator[tuple[str, Any]], skip_malformed: bool = False,
                   source: str = "", parse: Parser | None = None) -> LoadResult:
    """Parse (location, record) pairs with dataset `name`'s parser (or `parse`, e.g. FlashRAG
    rows of a hub copy); every Question is labelled with `name`'s dataset."""
    spec = get_spec(name)
    parse = parse or spec.parse
    questions, skipped = [], []
    first_at: dict[str, str] = {}
    pos = 0
    for pos, (where, rec) in enumerate(records, 1):
        try:
            if isinstance(rec, MalformedRecord):
                raise rec
            if not isinstance(rec, dict):
                raise MalformedRecord(f"a record should be a JSON object, got {type(rec).__name__}")
            q = parse(rec, pos)
            if not q.answers or not any(a.strip() for a in q.answers):
                raise MalformedRecord("no non-empty gold answer")
            problem = question_problem(q.question)
            if problem:
                raise MalformedRecord(f"the question {problem}")
        except MalformedRecord as e:
            if not skip_malformed:
                raise DatasetError(f"{where}: malformed {spec.name} record: {e}") from None
            skipped.append(f"{where}: {e}")
            continue
        # Not skippable: which of the two is the real question is not ours to guess, and both
        # would share one trace key.
        if q.id in first_at:
            raise DatasetError(f"{where}: duplicate {spec.name} id {q.id!r} (first at {first_at[q.id]})")
        first_at[q.id] = where
        questions.append(q if q.dataset == spec.name else dataclasses.replace(q, dataset=spec.name))
    if not questions:
        found = f"all {pos} record(s) malformed (first: {skipped[0]})" if skipped else "no records (an empty file?)"
        raise DatasetError(f"{source or spec.name}: {found}")
    if skipped:
        log.warning("%s: skipped %d malformed %s record(s); first: %s", source, len(skipped), spec.name, skipped[0])
    return LoadResult(questions, skipped, source)


def split_files(name: str, split: str, root: Path | None = None) -> list[Path]:
    """The files of a local split, in order, under `root` (default: the shared data dir); every
    one must exist (a split read in part would be a silently smaller dataset)."""
    spec = get_spec(name)
    split = SPLIT_ALIASES.get(split, split)
    if split not in spec.files:
        have = ", ".join(sorted(spec.files)) or "none: pass a path"
        raise DatasetError(f"no local {spec.name} split {split!r} (available: {have})")
    root = shared_data_dir() if root is None else Path(root)
    paths = [root / f for f in spec.files[split]]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise DatasetError(f"{', '.join(missing)} not found (part of {spec.name}:{split}): set KAIR_SHARED_DATA to "
                           f"the benchmark data folder, pass a path, or use hub=True on a machine with internet")
    return paths


def load_dataset(name: str, path: str | Path | None = None, split: str = "dev", limit: int | None = None,
                 sample: int | None = None, seed: int = 0, skip_malformed: bool = False,
                 hub: bool = False) -> LoadResult:
    """Load a benchmark as Questions.

    path given: read that file with `name`'s schema. No path: the shared data dir's files for
    `split`, one after the other (an id in two of them is an error, as in one file), or with
    hub=True the Hugging Face hub copy (needs internet).
    limit: the first N. sample: N questions drawn with `seed`, kept in file order.
    """
    if limit is not None and sample is not None:
        raise ValueError("use either limit or sample, not both")
    spec = get_spec(name)
    if hub:
        if spec.hub is None:
            raise DatasetError(f"{spec.name} has no hub copy configured; pass a path")
        split = SPLIT_ALIASES.get(split, split)
        source = f"hub:{spec.name}/{split}"
        records = ((f"{source}[record {i}]", r) for i, r in enumerate(spec.hub(split)))
        parse = get_spec(spec.hub_schema).parse if spec.hub_schema else spec.parse
    else:
        files = [Path(path)] if path is not None else split_files(spec.name, split)
        source, parse = " + ".join(map(str, files)), spec.parse
        records = (pair for f in files for pair in dataset_records(f))
    result = read_questions(spec.name, records, skip_malformed, source, parse)
    try:
        result.questions = subset(result.questions, limit, sample, seed)
    except DatasetError as e:
        raise DatasetError(f"{source}: {e}") from None
    return result


def subset(items: list[Question], limit: int | None = None, sample: int | None = None, seed: int = 0) -> list[Question]:
    if limit is not None:
        if limit < 0:
            raise DatasetError(f"limit must be >= 0, got {limit}")
        return items[:limit]
    if sample is not None:
        if not 0 <= sample <= len(items):
            raise DatasetError(f"cannot sample {sample} of {len(items)} questions")
        keep = sorted(random.Random(seed).sample(range(len(items)), sample))
        return [items[i] for i in keep]
    return items
