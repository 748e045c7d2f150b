"""OpenAIBackend against a real local HTTP server speaking the chat completions API."""

from __future__ import annotations

import socket

import pytest
from openai_test_server import OpenAITestServer, answer_for

from kair_runtime.config import LLMConfig
from kair_runtime.llm import LLM, BackendError, SamplingParams, build_llm
from kair_runtime.grammar import answer_grammar
from kair_runtime.llm.openai import OpenAIBackend


def _chat(text: str) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def test_batch_answers_in_order_with_usage_counts():
    prompts = [_chat(f"question number {i} about Paris") for i in range(12)]
    with OpenAITestServer(delay_s=0.05) as server:
        llm = build_llm(LLMConfig(backend="openai", base_url=server.base_url, model="kair", concurrency=4))
        assert isinstance(llm, LLM)
        out = llm.generate(prompts, SamplingParams(max_tokens=50))
    assert [c.text for c in out] == [answer_for(p, 50, [])[0] for p in prompts]
    assert [c.completion_tokens for c in out] == [len(c.text.split()) for c in out]
    assert out[3].prompt_tokens == len("Be brief. question number 3 about Paris".split())
    assert {c.finish_reason for c in out} == {"stop"}
    # Requests overlapped, but never more than the configured concurrency.
    assert 1 < server.max_in_flight <= 4


def test_sampling_params_are_sent_and_honoured():
    s = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=3, seed=11, stop=("never",))
    with OpenAITestServer() as server:
        (short,) = OpenAIBackend(server.base_url, "kair").generate([_chat("one two three four five")], s)
        (stopped,) = OpenAIBackend(server.base_url, "kair").generate(
            [_chat("alpha beta gamma")], SamplingParams(max_tokens=10, stop=("gamma", "beta")))
    body = server.requests[0]
    assert body["model"] == "kair" and body["messages"][-1]["content"] == "one two three four five"
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"], body["stop"]) == \
        (0.7, 0.9, 3, 11, ["never"])
    assert "seed" not in server.requests[1]
    assert short.text == "echo: one two" and short.finish_reason == "length"
    assert stopped.text == "echo: alpha " and stopped.finish_reason == "stop"


@pytest.mark.parametrize("owned_by", ["vllm", "openai"])
def test_vllm_servers_get_their_own_fields_neutral(owned_by):
    """vLLM fills each sampling field a request leaves out from the model's generation_config (a
    Qwen base's repetition_penalty 1.05, top_k 20): to vLLM every field goes explicit. OpenAI
    refuses fields it does not know: it gets its own only."""
    with OpenAITestServer(owned_by=owned_by) as server:
        llm = OpenAIBackend(server.base_url, "kair")
        llm.generate([_chat("one"), _chat("two")], SamplingParams(max_tokens=4))
        llm.generate([_chat("three")], SamplingParams(max_tokens=4))
    assert server.model_lists == 1  # asked once, not per request
    for body in server.requests:
        assert (body["temperature"], body["top_p"], body["presence_penalty"], body["frequency_penalty"]) == \
            (0.0, 1.0, 0.0, 0.0)
        vllm_fields = {k: body.get(k) for k in ("top_k", "min_p", "repetition_penalty")}
        if owned_by == "vllm":
            assert vllm_fields == {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
        else:
            assert vllm_fields == {"top_k": None, "min_p": None, "repetition_penalty": None}


def test_a_grammar_goes_to_a_vllm_server_in_structured_outputs_and_nowhere_else():
    """vLLM >= 0.12 reads `structured_outputs`; a server that is not vLLM would answer 200 with the
    grammar ignored, so the backend refuses rather than score unconstrained output as structured."""
    grammar = answer_grammar()
    with OpenAITestServer(owned_by="vllm") as server:
        OpenAIBackend(server.base_url, "kair").generate([_chat("one")], SamplingParams(max_tokens=4, grammar=grammar))
        OpenAIBackend(server.base_url, "kair").generate([_chat("two")], SamplingParams(max_tokens=4))
    assert server.requests[0]["structured_outputs"] == {"grammar": grammar}
    assert "structured_outputs" not in server.requests[1]
    with OpenAITestServer(owned_by="openai") as server:
        with pytest.raises(BackendError, match="loop.structured needs a vLLM server"):
            OpenAIBackend(server.base_url, "kair").generate([_chat("one")], SamplingParams(grammar=grammar))
    assert server.requests == []


def test_api_key_comes_from_the_named_env_var(monkeypatch):
    monkeypatch.setenv("KAIR_TEST_KEY", "sekret")
    with OpenAITestServer() as server:
        cfg = LLMConfig(backend="openai", base_url=server.base_url + "/", model="kair",
                        api_key_env="KAIR_TEST_KEY")
        OpenAIBackend.from_config(cfg).generate([_chat("hi")], SamplingParams())
        OpenAIBackend.from_config(LLMConfig(backend="openai", base_url=server.base_url, api_key_env="")
                                  ).generate([_chat("hi")], SamplingParams())
    assert server.headers[0]["Authorization"] == "Bearer sekret"
    assert "Authorization" not in server.headers[1]


def test_retries_503_then_succeeds():
    with OpenAITestServer(fail_first=2) as server:
        llm = OpenAIBackend(server.base_url, "kair", retries=3, backoff_s=0.01)
        (c,) = llm.generate([_chat("hello there")], SamplingParams())
    assert c.text == "echo: hello there"
    assert len(server.requests) == 3  # two 503s, then the answer


def test_gives_up_after_retries_naming_the_url():
    with OpenAITestServer(fail_first=10) as server:
        llm = OpenAIBackend(server.base_url, "kair", retries=2, backoff_s=0.01)
        with pytest.raises(BackendError, match=r"chat/completions failed after 3 attempt\(s\): HTTP 503"):
            llm.generate([_chat("hello")], SamplingParams())
    assert len(server.requests) == 3


def test_4xx_fails_at_once_with_the_server_message():
    with OpenAITestServer() as server:
        llm = OpenAIBackend(server.base_url, "missing-model", retries=3, backoff_s=0.01)
        with pytest.raises(BackendError, match=r"127\.0\.0\.1.*rejected.*HTTP 404.*does not exist"):
            llm.generate([_chat("hello")], SamplingParams())
    assert len(server.requests) == 1  # a client error is not retried


def test_unreachable_server_is_a_clear_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    llm = build_llm(LLMConfig(backend="openai", base_url=url, retries=1, timeout_s=2.0))
    # the first request asks the server what it is (see test_vllm_servers_get_their_own_fields_neutral)
    expected = rf"127\.0\.0\.1:{port}/v1/models failed after 2 attempt\(s\): Connect"
    with pytest.raises(BackendError, match=expected):
        llm.generate([_chat("hello")], SamplingParams())


def test_base_url_is_required():
    with pytest.raises(BackendError, match="llm.base_url is required"):
        build_llm(LLMConfig(backend="openai"))


def test_the_completion_ngram_ban_is_refused_before_any_request():
    with OpenAITestServer() as server:
        with pytest.raises(BackendError, match=r"no_repeat_ngram is implemented by the hf backend only"):
            OpenAIBackend(server.base_url, "kair").generate([_chat("hi")], SamplingParams(no_repeat_ngram=8))
    assert server.requests == []


def test_an_adapter_is_refused_not_silently_dropped():
    """The server applies adapters; an llm.adapter here would otherwise score the base model under
    the adapter's name (kair eval --checkpoints would label N identical runs as N checkpoints)."""
    with pytest.raises(BackendError, match=r"cannot be applied by backend: openai.*--lora-modules"):
        build_llm(LLMConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="kair", adapter="ckpt-10"))
