"""`to-sft`: examples byte-equal to the runtime's prompts, canonical targets, the split, the card."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from data_gen.filter import FilterConfig, run_filter
from data_gen.sft import SFTDataConfig, SFTError, build_sft, canonical_output, check_recorded, rebuild_prompts
from data_gen.store import read_trajectories, source_key
from data_gen.teacher import GenerateConfig, SamplingGrid, generate
from kair_runtime.config import LLMConfig, LoopConfig, RuntimeConfig
from kair_runtime.index import empty_index
from kair_runtime.llm.scripted import ScriptedLLM
from kair_runtime.loop import KairLoop
from kair_runtime.parser import parse_step_output
from kair_runtime.prompts import PromptSet

LOOP = LoopConfig(max_steps=3, top_k=3)


@pytest.fixture(scope="module")
def kept_dir(tmp_path_factory, specs, questions, bm25, oracle):
    """Teacher trajectories (one question in a messy, non-canonical layout), filtered."""
    root = tmp_path_factory.mktemp("sft")
    messy = {questions[3].id}
    cfg = GenerateConfig(runtime=RuntimeConfig(llm=LLMConfig(backend="scripted"), loop=LOOP), datasets=specs,
                         sampling=SamplingGrid([0.0, 1.0], samples_per_temperature=1), teacher="oracle-teacher",
                         out_dir=str(root / "teacher"))
    generate(cfg, llm=oracle(messy=messy), retriever=bm25, progress=False)
    run_filter(FilterConfig(trajectories=str(root / "teacher"), out_dir=str(root / "kept")))
    return root / "kept", messy


def sft_cfg(kept, out, **kw) -> SFTDataConfig:
    return SFTDataConfig(runtime=RuntimeConfig(loop=dataclasses.replace(LOOP)), trajectories=str(kept),
                         out_dir=str(out), validation_fraction=0.2, **kw)


def test_no_validation_split_where_none_is_held_out(tmp_path, kept_dir):
    from datasets import load_from_disk

    from data_gen.sft import split_questions

    kept, _ = kept_dir
    stats = build_sft(dataclasses.replace(sft_cfg(kept, tmp_path / "sft"), validation_fraction=0.0))
    ds = load_from_disk(str(tmp_path / "sft" / "dataset"))  # datasets cannot load back an empty split
    assert set(ds) == {"train"} and stats["splits"]["validation"]["examples"] == 0
    assert (tmp_path / "sft" / "validation.jsonl").read_text() == ""
    # A fraction near 1 still leaves a question to train on; one question is never held out.
    assert len(split_questions(["a", "b"], 0.9, seed=0)) == 1 and split_questions(["a"], 0.9, seed=0) == set()


def examples_by_trajectory(out) -> dict[str, list[dict]]:
    rows = [json.loads(line) for name in ("train", "validation") for line in (out / f"{name}.jsonl").open()]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["trajectory"], []).append(r)
    return {k: sorted(v, key=lambda r: r["step"]) for k, v in by.items()}


def replay(trace, outputs, bm25) -> list[list[dict]]:
    """Run the real loop on the trace's question with a model that returns `outputs` in order;
    return the prompts the model received."""
    seen = []

    def respond(messages):
        seen.append(messages)
        return outputs[len(seen) - 1]

    KairLoop(ScriptedLLM(respond), bm25, LOOP).run([trace.question])
    return seen


def test_sft_outputs_split_by_question_and_load(tmp_path, kept_dir):
    from datasets import load_from_disk

    kept, _ = kept_dir
    stats = build_sft(sft_cfg(kept, tmp_path / "sft"))
    traces = read_trajectories(kept)
    ds = load_from_disk(str(tmp_path / "sft" / "dataset"))
    assert set(ds) == {"train", "validation"}
    assert len(ds["train"]) + len(ds["validation"]) == sum(len(t.steps) + 1 for t in traces)
    train_q, val_q = set(ds["train"]["question_id"]), set(ds["validation"]["question_id"])
    assert val_q and not train_q & val_q and len(train_q | val_q) == len({t.question.id for t in traces})
    row = ds["train"][0]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
    assert {"question_id", "kind", "step", "source", "dataset", "sample_id", "prompt_version"} <= set(row)
    assert stats["splits"]["validation"]["questions"] == len(val_q) == 2  # 20% of 9 questions
    # Deterministic: the same seed gives the same split.
    build_sft(sft_cfg(kept, tmp_path / "again"))
    assert set(load_from_disk(str(tmp_path / "again" / "dataset"))["validation"]["question_id"]) == val_q
    card = (tmp_path / "sft" / "README.md").read_text()
    assert "oracle-teacher" in card and f"| validation | {len(ds['validation'])} |" in card
    assert "min_f1" in card and stats["prompt_versions"][0] in card


def test_prompts_rerender_byte_equal_from_the_trace(kept_dir):
    kept, _ = kept_dir
    prompts = PromptSet.load("kr")
    for t in read_trajectories(kept):
        assert check_recorded(t, prompts, "answer") == []
        steps, answer = rebuild_prompts(t, prompts, "answer")
        assert steps == [s.prompt for s in t.steps] and answer == t.final_prompt


def test_loop_fed_the_sft_targets_sends_exactly_the_sft_prompts(tmp_path, kept_dir, bm25):
    kept, messy = kept_dir
    build_sft(sft_cfg(kept, tmp_path / "sft"))
    by = examples_by_trajectory(tmp_path / "sft")
    for t in read_trajectories(kept):
        rows = by[source_key(t)]
        assert [r["kind"] for r in rows] == ["init"] + ["update"] * (len(t.steps) - 1) + ["answer"]
        received = replay(t, [r["messages"][-1]["content"] for r in rows], bm25)
        assert received == [r["messages"][:-1] for r in rows]
        if t.question.id in messy:  # its own reasoning layout went into the teacher's prompts, not these
            assert rows[1]["messages"][:-1] != t.steps[1].prompt
        else:
            assert [r["messages"][:-1] for r in rows] == [s.prompt for s in t.steps] + [t.final_prompt]


def test_recorded_mode_keeps_the_teacher_prompts(tmp_path, kept_dir, bm25):
    kept, messy = kept_dir
    build_sft(sft_cfg(kept, tmp_path / "sft", prompt_source="recorded"))
    by = examples_by_trajectory(tmp_path / "sft")
    t = next(t for t in read_trajectories(kept) if t.question.id in messy)
    rows = by[source_key(t)]
    assert [r["messages"][:-1] for r in rows] == [s.prompt for s in t.steps] + [t.final_prompt]
    # The loop fed the teacher's raw outputs sends the recorded prompts.
    assert replay(t, [s.raw_output for s in t.steps] + [t.final_output], bm25) == [r["messages"][:-1] for r in rows]


def test_targets_are_canonical_and_parse_back_to_the_step(kept_dir):
    kept, messy = kept_dir
    for t in read_trajectories(kept):
        prev = empty_index("kr")
        for s in t.steps:
            target = canonical_output(s)
            parsed = parse_step_output(target, "kr", prev, t.question.question)
            assert (parsed.index, parsed.judgment, parsed.next_query, parsed.fallbacks) == \
                   (s.index, s.judgment, s.next_query, [])
            assert target.startswith("<index>\nKeywords: ") and target.count("Judgment:") == 1
            prev = s.index
        if t.question.id in messy:
            assert t.steps[0].raw_output != canonical_output(t.steps[0])


def test_other_prompt_settings_or_tampered_prompts_are_refused(tmp_path, kept_dir):
    kept, _ = kept_dir
    cfg = sft_cfg(kept, tmp_path / "sft")
    cfg.runtime.loop.max_passage_words = 10
    with pytest.raises(SFTError, match="prompt version"):
        build_sft(cfg)
    traces = read_trajectories(kept)
    bad = copy.deepcopy(traces[0])
    bad.steps[0].prompt[0]["content"] += " "
    with pytest.raises(SFTError, match="differ.*step 1"):
        build_sft(sft_cfg(kept, tmp_path / "sft2"), traces=[bad] + traces[1:])


def test_a_rebuild_killed_half_way_leaves_the_old_folder_whole_and_consistent(tmp_path, kept_dir, monkeypatch):
    from datasets import DatasetDict

    kept, _ = kept_dir
    out = tmp_path / "sft"
    build_sft(sft_cfg(kept, out))
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def killed(self, *args, **kwargs):  # after the jsonl files, before the dataset and the card
        raise KeyboardInterrupt

    monkeypatch.setattr(DatasetDict, "save_to_disk", killed)
    with pytest.raises(KeyboardInterrupt):
        build_sft(sft_cfg(kept, out, seed=7))
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    monkeypatch.undo()
    stats = build_sft(sft_cfg(kept, out, seed=7))
    lines = sum(1 for _ in (out / "train.jsonl").open())
    assert stats["splits"]["train"]["examples"] == lines  # the card and the files agree
    assert not any(p.name.startswith(".sft.") for p in tmp_path.iterdir())
