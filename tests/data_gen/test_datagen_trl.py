"""The tiny hf model as a teacher, and TRL training one step on the SFT dataset (CPU)."""

from __future__ import annotations

import math

import pytest

from data_gen.filter import FilterConfig, run_filter
from data_gen.sft import SFTDataConfig, build_sft
from data_gen.store import DataSpec, read_trajectories
from data_gen.teacher import GenerateConfig, SamplingGrid, generate
from kair_runtime.config import LLMConfig, LoopConfig, RuntimeConfig

SHORT = dict(max_steps=2, top_k=2, max_passage_words=20)


def test_tiny_hf_model_as_teacher(tmp_path, shared_data, bm25, tiny_model_dir):
    cfg = GenerateConfig(
        runtime=RuntimeConfig(llm=LLMConfig(backend="hf", model=str(tiny_model_dir), device="cpu", batch_size=4),
                              loop=LoopConfig(max_steps=1, top_k=2, max_passage_words=20, step_max_tokens=12,
                                              answer_max_tokens=4)),
        datasets=[DataSpec("musique", limit=2)], sampling=SamplingGrid([0.0, 1.0], samples_per_temperature=1),
        out_dir=str(tmp_path / "teacher"))
    result = generate(cfg, retriever=bm25, progress=False)
    traces = read_trajectories(tmp_path / "teacher")
    assert result.written == len(traces) == 4
    for t in traces:
        assert t.error is None and len(t.steps) == 1 and t.extra["backend"] == "hf"
        assert t.extra["teacher"] == str(tiny_model_dir) and t.extra["llm"].startswith("hf:")
        assert 0 < t.steps[0].completion_tokens <= 12 and t.steps[0].retrieved
    # Random weights write no KAIR layout: every trajectory is rejected, for format reasons.
    report = run_filter(FilterConfig(trajectories=str(tmp_path / "teacher"), out_dir=str(tmp_path / "f")))
    assert report["kept"] == 0 and report["reasons"].get("format:index_missing", 0) >= 1


def test_trl_trains_a_step_on_the_sft_dataset(tmp_path, specs, bm25, oracle, tiny_model_dir):
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    loop = LoopConfig(**SHORT)
    generate(GenerateConfig(runtime=RuntimeConfig(llm=LLMConfig(backend="scripted"), loop=loop), datasets=specs,
                            sampling=SamplingGrid([0.0]), out_dir=str(tmp_path / "teacher")),
             llm=oracle(), retriever=bm25, progress=False)
    run_filter(FilterConfig(trajectories=str(tmp_path / "teacher"), out_dir=str(tmp_path / "kept")))
    build_sft(SFTDataConfig(runtime=RuntimeConfig(loop=LoopConfig(**SHORT)), trajectories=str(tmp_path / "kept"),
                            out_dir=str(tmp_path / "sft"), validation_fraction=0.2))
    ds = load_from_disk(str(tmp_path / "sft" / "dataset"))

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    args = TRLConfig(output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=2, max_length=2048,
                     assistant_only_loss=True, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds["train"], eval_dataset=ds["validation"],
                         processing_class=tok)
    # TRL tokenized every example through the chat template; none lost its assistant turn to truncation.
    assert len(trainer.train_dataset) == len(ds["train"])
    first = trainer.train_dataset[0]
    assert any(label != -100 for label in first["labels"]) and any(label == -100 for label in first["labels"])
    out = trainer.train()
    assert out.global_step == 1 and math.isfinite(out.training_loss)
