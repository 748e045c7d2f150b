"""`kair datagen to-sft`: kept trajectories -> chat examples, exactly as the runtime prompts a model.

Each trajectory gives one example per step and one for the final answer:

    step 1:  PromptSet.init(q0, D_1)                                 -> canonical step output
    step t:  PromptSet.update(q0, D_t, I_{t-1}, R_{t-1}, q_{t-1})    -> canonical step output
    answer:  PromptSet.answer(q0, D_1 ∪ ... ∪ D_k, I_k)              -> the short answer

The assistant turn of a step is the teacher's output normalized to the one canonical layout
(the parsed index, reasoning and query, rendered by kair_runtime.output_format), so the student
learns a single layout that the parser reads back unchanged.

Which reasoning goes into the next update prompt (`prompt_source`):
- "canonical" (default): the reasoning the loop records when a model emits the canonical output,
  i.e. exactly the prompts a student that learned these targets is sent at inference. Running
  the loop with a model that returns the assistant turns reproduces the user turns byte for byte.
- "recorded": the prompts as recorded in the trace (what the teacher was sent). The two are the
  same whenever the teacher's reasoning was already canonical (silver data always is).

Before converting, every recorded prompt is re-rendered from the trace with the PromptSet and
must be byte-equal (`check_recorded`): that catches trajectories generated with other templates
or settings (their prompt_version differs too), which would teach the wrong prompts.

Output, in OUT:
    train.jsonl, validation.jsonl   {"messages": [...], question_id, kind, step, source, ...}
    dataset/                        a datasets.DatasetDict (train, validation) via save_to_disk (no
                                    validation split where none is held out)
    README.md                       the dataset card; stats.json the same figures
The split is by question id (no question in both), deterministic given `seed`.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from data_gen.store import read_trajectories, source_key, trajectory_files
from eval.table import Column, Table, counts_table
from kair_runtime.config import ConfigError, Range, RuntimeConfig, check_range, check_ranges
from kair_runtime.index import empty_index
from kair_runtime.jsonl import atomic_write_jsonl, atomic_write_text
from kair_runtime.rundir import replaced_folder
from kair_runtime.output_format import render_step_output
from kair_runtime.parser import JUDGMENT_WORD, parse_step_output
from kair_runtime.prompts import PromptSet
from kair_runtime.records import Message, SFTExample, Step, Trace

PROMPT_SOURCES = ("canonical", "recorded")


@dataclass
class SFTDataConfig:
    """The `kair datagen to-sft` settings (named apart from TRL's SFTConfig, which configures training)."""

    # Only runtime.loop's prompt settings matter here (prompt_dir, system_prompt,
    # max_passage_words, answer_mode): they must be the ones the trajectories were made with.
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    trajectories: str | None = None  # a filter output folder (kept.jsonl) or any trajectory path
    out_dir: str = "runs/datagen/sft"
    validation_fraction: float = 0.05
    seed: int = 0
    prompt_source: str = "canonical"  # canonical | recorded
    check_recorded: bool = True
    include_answer: bool = True
    # Examples already in this layout to train on too (`kair datagen relabel`'s examples.jsonl):
    # split with the rest by question id; their prompt version must be these settings'.
    extra_examples: list[str] = field(default_factory=list)

    def validate(self, where: str = "") -> None:
        check_ranges(self, {"validation_fraction": HELD_OUT}, where)
        # Any other word would silently convert as "canonical" and be recorded as given.
        check_prompt_source(self.prompt_source, f"{where}.prompt_source" if where else "prompt_source")


HELD_OUT = Range(low=0, high=1, high_open=True)  # validation_fraction: 1 would leave nothing to train on


def check_prompt_source(source: str, key: str = "prompt_source") -> None:
    if source not in PROMPT_SOURCES:
        raise ConfigError(f"{key}={source!r} is not one of {', '.join(PROMPT_SOURCES)}")


class SFTError(ValueError):
    pass


class NotReproducible(SFTError):
    """A trajectory whose canonical form does not parse back the same: skipped and counted."""


# ---------------------------------------------------------------- one step's target

# The parser's judgment label, except that `\s` also spans a newline: the renderer collapses the
# reasoning's whitespace, so a "Judgment\n:" the parser did not read as a label would become one.
_JUDGMENT_LABEL = re.compile(rf"(?:{JUDGMENT_WORD})[*_\s]*[:：]", re.IGNORECASE)


def strip_judgment(reasoning: str) -> str:
    """The reasoning without its closing "Judgment: ..." (the canonical layout adds it back)."""
    marks = list(_JUDGMENT_LABEL.finditer(reasoning))
    if marks:
        reasoning = reasoning[: marks[-1].start()]
    return reasoning.strip().rstrip("*_#").strip()


def canonical_output(step: Step) -> str:
    return render_step_output(step.index, strip_judgment(step.reasoning), step.judgment, step.next_query)


# ---------------------------------------------------------------- prompts from a trace


def prompt_set_for(trace: Trace, cfg: SFTDataConfig, cache: dict[str, PromptSet]) -> PromptSet:
    fmt = trace.index_format
    if fmt not in cache:
        loop = cfg.runtime.loop
        cache[fmt] = PromptSet.for_loop(loop, fmt)
    prompts = cache[fmt]
    recorded = trace.extra.get("prompt_version")
    if recorded and recorded != prompts.version:
        raise SFTError(f"trajectory {source_key(trace)} was made with prompt version {recorded}, but these "
                       f"settings give {prompts.version}: use the runtime.loop prompt_dir / system_prompt / "
                       f"max_passage_words it was generated with")
    return prompts


def rebuild_prompts(trace: Trace, prompts: PromptSet, answer_mode: str,
                    source: str = "recorded") -> tuple[list[list[Message]], list[Message]]:
    """Every step prompt and the answer prompt, rendered from the trace's contents as the loop
    renders them. source "recorded" feeds each update prompt the reasoning the trace recorded;
    "canonical" the reasoning the loop records for the canonical form of that step's output."""
    check_prompt_source(source)
    q0 = trace.question.question
    out: list[list[Message]] = []
    for i, st in enumerate(trace.steps):
        if i == 0:
            out.append(prompts.init(q0, st.retrieved))
            continue
        prev = trace.steps[i - 1]
        reasoning = prev.reasoning if source == "recorded" else canonical_reasoning(trace, i - 1)
        out.append(prompts.update(q0, st.retrieved, prev.index, reasoning, st.query))
    answer = prompts.answer(q0, trace.all_passages(), trace.final_index, answer_mode)
    return out, answer


def canonical_reasoning(trace: Trace, i: int) -> str:
    """What the loop records as step i's reasoning when the model wrote its canonical output;
    the parse must give back the same index, judgment and query, or the trace is not
    reproducible through the loop."""
    st = trace.steps[i]
    before = trace.steps[i - 1].index if i > 0 else empty_index(trace.index_format)
    # The canonical output holds the whole index after the step, which reads back the same under
    # either index_update rule: SFT targets teach the model to write I_t whole.
    parsed = parse_step_output(canonical_output(st), trace.index_format, before, trace.question.question)
    if (parsed.index, parsed.judgment, parsed.next_query) != (st.index, st.judgment, st.next_query) or parsed.fallbacks:
        raise NotReproducible(f"trajectory {source_key(trace)} step {st.step}: its canonical output does not parse back "
                       f"to the same index/judgment/query (fallbacks {parsed.fallbacks})")
    return parsed.reasoning


def check_recorded(trace: Trace, prompts: PromptSet, answer_mode: str) -> list[str]:
    """Where the trace's recorded prompts differ from a re-render (empty: byte-equal)."""
    steps, answer = rebuild_prompts(trace, prompts, answer_mode, "recorded")
    bad = [f"step {st.step}" for st, p in zip(trace.steps, steps) if st.prompt != p]
    if trace.final_prompt and trace.final_prompt != answer:
        bad.append("answer")
    return bad


# ---------------------------------------------------------------- trace -> examples


def trace_examples(trace: Trace, prompts: PromptSet, cfg: SFTDataConfig) -> list[SFTExample]:
    loop = cfg.runtime.loop
    if cfg.check_recorded:
        bad = check_recorded(trace, prompts, loop.answer_mode)
        if bad:
            raise SFTError(f"trajectory {source_key(trace)}: recorded prompts differ from the re-rendered ones at "
                           f"{', '.join(bad)} (other templates, max_passage_words or answer_mode?)")
    if cfg.prompt_source == "recorded":
        step_prompts, answer_prompt = [st.prompt for st in trace.steps], trace.final_prompt
    else:
        step_prompts, answer_prompt = rebuild_prompts(trace, prompts, loop.answer_mode, "canonical")
    source = str(trace.extra.get("teacher", ""))
    meta = example_meta(trace, prompts.version)
    examples = []
    for st, prompt in zip(trace.steps, step_prompts):
        examples.append(SFTExample(messages=list(prompt) + [{"role": "assistant", "content": canonical_output(st)}],
                                   question_id=trace.question.id, kind="init" if st.step == 1 else "update",
                                   step=st.step, source=source, extra=dict(meta)))
    if cfg.include_answer:
        examples.append(SFTExample(messages=list(answer_prompt) + [{"role": "assistant", "content": trace.answer}],
                                   question_id=trace.question.id, kind="answer", step=len(trace.steps) + 1,
                                   source=source, extra=dict(meta)))
    return examples


def example_meta(trace: Trace, prompt_version: str) -> dict[str, Any]:
    """The metadata columns every example of a trajectory carries (ROW_COLUMNS after the first five)."""
    return {"dataset": trace.question.dataset, "sample_id": int(trace.extra.get("sample_id", 0)),
            "trajectory": source_key(trace), "prompt_version": prompt_version, "index_format": trace.index_format}


# The columns of an example row: what example_row writes and extra_examples must hold.
ROW_COLUMNS = ("messages", "question_id", "kind", "step", "source", "dataset", "sample_id", "trajectory",
               "prompt_version", "index_format")


def example_row(ex: SFTExample) -> dict[str, Any]:
    """The flat row trainers read: OpenAI-style `messages` plus scalar metadata columns."""
    return {"messages": ex.messages, "question_id": ex.question_id, "kind": ex.kind, "step": ex.step,
            "source": ex.source, **ex.extra}


def split_questions(ids: list[str], fraction: float, seed: int) -> set[str]:
    """The validation question ids: a seeded shuffle of the sorted ids, so the split does not
    depend on file order. At least one question when fraction > 0 and there are two or more, and
    always at least one left to train on."""
    check_range(fraction, HELD_OUT, "validation_fraction")
    unique = sorted(set(ids))
    random.Random(seed).shuffle(unique)
    n = round(fraction * len(unique))
    if fraction > 0 and len(unique) >= 2:
        n = max(1, n)
    return set(unique[:min(n, len(unique) - 1)])


def build_sft(cfg: SFTDataConfig, traces: list[Trace] | None = None) -> dict[str, Any]:
    """Convert, split, write every output; return the stats (also in stats.json)."""
    from datasets import Dataset, DatasetDict

    if traces is None:
        if not cfg.trajectories:
            raise ConfigError("no trajectories: pass KEPT_DIR or set `trajectories`")
        traces = read_trajectories(cfg.trajectories)
    if not traces:
        raise SFTError("no trajectories to convert")
    cache: dict[str, PromptSet] = {}
    rows, used, skipped = [], [], {}
    for t in traces:
        try:
            rows += [example_row(ex) for ex in trace_examples(t, prompt_set_for(t, cfg, cache), cfg)]
            used.append(t)
        except NotReproducible as e:
            skipped[source_key(t)] = str(e)
    if not rows:
        raise SFTError(f"no trajectory could be converted ({len(skipped)} not reproducible through the loop)")
    extra = extra_rows(cfg, {r["prompt_version"] for r in rows})
    rows += extra
    val_ids = split_questions([t.question.id for t in used] + [r["question_id"] for r in extra],
                              cfg.validation_fraction, cfg.seed)
    splits = {"train": [r for r in rows if r["question_id"] not in val_ids],
              "validation": [r for r in rows if r["question_id"] in val_ids]}
    stats = sft_stats(used, splits, cfg, filter_report(cfg.trajectories), sorted({p.version for p in cache.values()}))
    stats["skipped_not_reproducible"] = skipped
    stats["extra_examples"] = {"files": list(cfg.extra_examples), "by_source": dict(Counter(r["source"] for r in extra))}
    # The jsonl files, the dataset and the card agree after a kill at any point: the folder is
    # built beside the old one and replaces it whole.
    with replaced_folder(cfg.out_dir, "stats.json") as out:
        for name, split_rows in splits.items():
            atomic_write_jsonl(out / f"{name}.jsonl", split_rows)
        dataset = {"train": Dataset.from_list(splits["train"])}
        # No empty split: datasets can neither type an empty list nor load back a saved empty split
        # (validation_fraction 0; train.sft then says there is no validation split).
        if splits["validation"]:
            dataset["validation"] = Dataset.from_list(splits["validation"], features=dataset["train"].features)
        DatasetDict(dataset).save_to_disk(str(out / "dataset"))
        atomic_write_text(out / "stats.json", json.dumps(stats, indent=2, ensure_ascii=False))
        atomic_write_text(out / "README.md", dataset_card(stats))
    return stats


def extra_rows(cfg: SFTDataConfig, versions: set[str]) -> list[dict[str, Any]]:
    """The rows of cfg.extra_examples, checked to have the trajectories' columns and prompts."""
    from kair_runtime.jsonl import iter_json_records

    columns = ROW_COLUMNS
    out = []
    for path in cfg.extra_examples:
        for where, row in iter_json_records(path):
            missing = [c for c in columns if c not in row]
            if missing or set(row) - set(columns):
                raise SFTError(f"{where}: not an example row (missing {missing}, unknown "
                               f"{sorted(set(row) - set(columns))})")
            if row["prompt_version"] not in versions:
                raise SFTError(f"{where}: prompt version {row['prompt_version']} is not the trajectories' "
                               f"({', '.join(sorted(versions))}): it was made with other prompt settings")
            if not row["messages"] or row["messages"][-1].get("role") != "assistant":
                raise SFTError(f"{where}: the last message is not the assistant's target")
            out.append({c: row[c] for c in columns})
    return out


def filter_report(path: str | None) -> dict[str, Any] | None:
    """The filter report next to the input, if the input is a filter output."""
    if not path:
        return None
    folder = trajectory_files(path)[0].parent
    report = folder / "report.json"
    return json.loads(report.read_text(encoding="utf-8")) if report.exists() else None


def sft_stats(traces: list[Trace], splits: dict[str, list[dict]], cfg: SFTDataConfig,
              filt: dict[str, Any] | None, versions: list[str]) -> dict[str, Any]:
    return {
        "trajectories": len(traces),
        "splits": {name: {"examples": len(r), "questions": len({x["question_id"] for x in r}),
                          "by_kind": dict(Counter(x["kind"] for x in r))} for name, r in splits.items()},
        "sources": dict(Counter(str(t.extra.get("teacher", "")) for t in traces)),
        "datasets": dict(Counter(t.question.dataset for t in traces)),
        "index_formats": sorted({t.index_format for t in traces}),
        "prompt_versions": versions,
        "settings": {k: v for k, v in asdict(cfg).items() if k != "runtime"}
                    | {"loop": {k: asdict(cfg.runtime.loop)[k] for k in
                                ("prompt_dir", "system_prompt", "max_passage_words", "answer_mode")}},
        "filter": {k: filt[k] for k in ("settings", "kept", "total", "reasons")} if filt else None,
        "loop_bounds": loop_bounds(traces),
    }


def loop_bounds(traces: list[Trace]) -> dict[str, int]:
    """The structured mode's loop.max_* bounds that leave room for every step and answer of these
    trajectories (kair_runtime.grammar.step_needs): set them when decoding a student trained on
    this data with loop.structured, so that no bound cuts what it learned to write."""
    from kair_runtime.grammar import answer_needs, step_needs

    needs = [step_needs(st.index, st.reasoning, st.next_query) for t in traces for st in t.steps]
    needs += [answer_needs(t.answer) for t in traces]
    keys = dict.fromkeys(k for n in needs for k in n)
    return {k: max(1, max(n.get(k, 0) for n in needs)) for k in keys}


def dataset_card(s: dict[str, Any]) -> str:
    def kind(k: str) -> Column:
        return Column(k, lambda split: str(split[1]["by_kind"].get(k, 0)), "right")

    counts = Table([Column("split", itemgetter(0)),
                    Column("examples", lambda split: str(split[1]["examples"]), "right"),
                    Column("questions", lambda split: str(split[1]["questions"]), "right"),
                    *map(kind, ("init", "update", "answer"))], list(s["splits"].items()))
    teachers = counts_table("teacher", ((k or "(unnamed)", v) for k, v in s["sources"].items()))
    lines = ["# KAIR SFT data", "",
             "Chat examples for supervised fine-tuning of the KAIR loop: one per step (the step prompt and the "
             "canonical step output: index, reasoning with its judgment, next query) and one per final answer. "
             "Prompts are byte-equal to what `kair_runtime` sends at inference.", "",
             "Load with `datasets.load_from_disk('dataset')`, or read `train.jsonl` / `validation.jsonl` "
             "(`{\"messages\": [...]}` rows, for TRL, LlamaFactory or axolotl).", "",
             "## Counts", "", counts.markdown(), "",
             f"From {s['trajectories']} trajectories ({len(s.get('skipped_not_reproducible', {}))} skipped: their "
             f"canonical output did not parse back the same). The split is by question id (no question in both), "
             f"validation fraction {s['settings']['validation_fraction']}, seed {s['settings']['seed']}.", "",
             "## Sources", "", teachers.markdown(), "", counts_table("dataset", s["datasets"].items()).markdown(),
             "", "## Prompts", "",
             f"- index format(s): {', '.join(s['index_formats'])}",
             f"- prompt version(s): {', '.join(s['prompt_versions'])} (`PromptSet.version`)",
             f"- prompt source: {s['settings']['prompt_source']}; loop settings: {s['settings']['loop']}",
             "", "## Structured decoding", "",
             "The loop.max_* bounds that leave the grammar room for every reply here (set them with "
             "`runtime.loop.structured=true` when decoding a student trained on this data):", "",
             "    " + " ".join(f"--set runtime.loop.{k}={v}" for k, v in s["loop_bounds"].items()),
             "", "## Filter", ""]
    f = s["filter"]
    if f:
        lines += [f"Kept {f['kept']} of {f['total']} trajectories with {f['settings']}.", "",
                  counts_table("rejection reason", f["reasons"].items() or [("(none)", 0)]).markdown()]
    else:
        lines.append("No filter report was found next to the input trajectories.")
    return "\n".join(lines) + "\n"
