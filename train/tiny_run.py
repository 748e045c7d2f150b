"""Inputs for the tiny CPU training run (configs/train/tiny-cpu.yaml): a random-init model and
KAIR-shaped SFT data, both made locally in a second or two.

    python -m train.tiny_run runs/tiny && python -m train.sft --config configs/train/tiny-cpu.yaml

writes `runs/tiny/model` (train/tiny_model.py, Qwen2 layout by default) and `runs/tiny/sft`, a
DatasetDict (train from the demo train questions, validation from the dev ones) plus the same rows
as `sft_train.jsonl` / `sft_validation.jsonl`. The examples are silver trajectories built from the
demo questions' gold chains, rendered with the runtime's own prompts and output layout: step 1
reads the first hop's passage and asks for the next hop, step 2 reads the second and is
sufficient, then the answer. Real SFT data comes from data_gen; this only has its shape.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kair_runtime.demo_data import load_demo_corpus, load_demo_questions
from kair_runtime.output_format import render_step_output
from kair_runtime.prompts import PromptSet
from kair_runtime.records import Index, Question, ScoredPassage, SFTExample


def _keywords(relations: list[list[str]]) -> list[str]:
    seen: dict[str, None] = {}
    for head, _, tail in relations:
        seen.setdefault(head)
        seen.setdefault(tail)
    return list(seen)


def silver_examples(q: Question, passages: dict[str, ScoredPassage], prompts: PromptSet) -> list[SFTExample]:
    """The init / update / answer examples of one demo question's gold two-hop chain."""
    hops = q.metadata["decomposition"]
    evidences = [list(map(str, e)) for e in q.metadata["evidences"]]
    docs = [[passages[h["passage_id"]]] for h in hops]
    out, index, reasoning, query = [], Index(format=prompts.format), "", q.question
    for step, hop_docs in enumerate(docs, 1):
        last = step == len(docs)
        rels = evidences if last else evidences[:step]
        new_index = Index(format=prompts.format, keywords=_keywords(rels), relations=rels)
        next_query = None if last else hops[step]["question"]
        new_reasoning = (f"The documents answer every hop: {hops[-1]['answer']}." if last else
                         f"{hops[step - 1]['answer']} is known; the next hop is still missing.")
        prompt = (prompts.init(q.question, hop_docs) if step == 1 else
                  prompts.update(q.question, hop_docs, index, reasoning, query))
        target = render_step_output(new_index, new_reasoning, "sufficient" if last else "insufficient", next_query)
        out.append(SFTExample(messages=prompt + [{"role": "assistant", "content": target}], question_id=q.id,
                              kind="init" if step == 1 else "update", step=step, source="annotations"))
        index, reasoning, query = new_index, new_reasoning, next_query or query
    answer_prompt = prompts.answer(q.question, [d for ds in docs for d in ds], index)
    out.append(SFTExample(messages=answer_prompt + [{"role": "assistant", "content": q.answers[0]}],
                          question_id=q.id, kind="answer", source="annotations"))
    return out


def demo_sft_examples(split: str, index_format: str = "kr") -> list[SFTExample]:
    prompts = PromptSet.load(index_format)
    passages = {p.id: ScoredPassage(id=p.id, title=p.title, text=p.text, score=1.0) for p in load_demo_corpus()}
    return [ex for q in load_demo_questions(split) for ex in silver_examples(q, passages, prompts)]


def write_demo_sft(out_dir: str | Path, index_format: str = "kr") -> Path:
    """Write the demo SFT data as a DatasetDict (train, validation) and as jsonl; returns out_dir."""
    from datasets import Dataset, DatasetDict

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    splits = {}
    for name, demo_split in (("train", "train"), ("validation", "dev")):
        rows = [ex.to_dict() for ex in demo_sft_examples(demo_split, index_format)]
        (out / f"sft_{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        # `extra` is free-form per row; keep it as JSON text so every row has one schema.
        splits[name] = Dataset.from_list([{**r, "extra": json.dumps(r["extra"])} for r in rows])
    DatasetDict(splits).save_to_disk(str(out))
    return out


def prepare(out_dir: str | Path, family: str = "qwen2") -> dict[str, Path]:
    from train.tiny_model import build_tiny_chat_model

    root = Path(out_dir)
    return {"model": build_tiny_chat_model(root / "model", family=family), "sft": write_demo_sft(root / "sft")}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Build the tiny model and demo SFT data for configs/train/tiny-cpu.yaml.")
    p.add_argument("out_dir", nargs="?", default="runs/tiny")
    p.add_argument("--family", default="qwen2", choices=["qwen2", "llama"])
    args = p.parse_args(argv)
    for name, path in prepare(args.out_dir, args.family).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
