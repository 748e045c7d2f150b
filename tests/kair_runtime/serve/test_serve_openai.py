"""OpenAI's API on `kair serve`, driven by the real openai SDK against uvicorn on loopback:
chat completions (plain and streamed, the extra body), /v1/models, errors in OpenAI's shape, and
the Prometheus metrics parsed by prometheus_client's own parser."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from typing import Iterator

import httpx
import pytest

openai = pytest.importorskip("openai", reason="the openai SDK (dev extra) is not installed")
parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client (serve extra) is not installed")

from serve_helpers import GatedLLM, insufficient_kair, serve_config  # noqa: E402
from kair_runtime.config import LLMConfig  # noqa: E402
from kair_runtime.llm.hf import HFBackend  # noqa: E402
from kair_runtime.llm.scripted import ScriptedLLM, echo_kair  # noqa: E402
from kair_runtime.records import Trace  # noqa: E402
from kair_runtime.serve.app import create_app  # noqa: E402
from kair_runtime.serve.thread import BackgroundServer  # noqa: E402
from lexical import WordOverlap  # noqa: E402

Q = "When was the band behind Wonderwall formed?"
KEY = "s3cret"
ADAPTER = "/models/kair-student"  # only named: a scripted stand-in answers for it


@contextmanager
def served(llm=None, *, api_key: str | None = KEY, llm_config: dict | None = None, **server) -> Iterator[BackgroundServer]:
    llm = llm if llm is not None else ScriptedLLM(echo_kair)
    # The config names an adapter on a base (what /v1/models lists); `llm` stands in for it.
    cfg = serve_config(None, llm_config or {"backend": "hf", "model": "base-model", "adapter": ADAPTER}, **server)
    app = create_app(cfg, api_key=api_key, build=lambda: (llm, WordOverlap()))
    with BackgroundServer(app) as server_:
        server_.wait_ready()
        yield server_


def client(server: BackgroundServer, key: str = KEY) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def ask(text: str = Q) -> list[dict]:
    return [{"role": "user", "content": text}]


def same_trace(a: dict, b: dict) -> None:
    """Two traces of one question agree in everything but ids and timings."""
    ta, tb = Trace.from_dict(a), Trace.from_dict(b)
    assert ta.answer == tb.answer and ta.stop_reason == tb.stop_reason
    assert [(s.query, [p.id for p in s.retrieved], s.index, s.reasoning, s.judgment, s.next_query, s.raw_output)
            for s in ta.steps] == [(s.query, [p.id for p in s.retrieved], s.index, s.reasoning, s.judgment,
                                    s.next_query, s.raw_output) for s in tb.steps]
    assert ta.usage == tb.usage and ta.final_index == tb.final_index


def test_a_chat_completion_is_the_loops_answer_with_its_trace_in_kair():
    with served() as server:
        done = client(server).chat.completions.create(
            model="kair-student", messages=[{"role": "system", "content": "Be brief."}, *ask()],
            extra_body={"max_steps": 2, "top_k": 2, "return_trace": True})
        plain = httpx.post(server.url + "/v1/answer", json={"question": Q, "max_steps": 2, "top_k": 2,
                                                             "return_trace": True},
                           headers={"Authorization": f"Bearer {KEY}"}).json()
    assert done.object == "chat.completion" and done.model == "kair-student"
    (choice,) = done.choices
    assert choice.message.role == "assistant" and choice.message.content == plain["answer"]
    assert choice.finish_reason == "stop"
    kair = done.model_extra["kair"]
    assert kair["settings"] == {"index_format": "kr", "top_k": 2, "max_steps": 2}
    assert kair["unused_messages"] == 1  # the system prompt: counted, not read
    assert kair["steps"] and all(s["query"] and s["retrieved"] and s["judgment"] for s in kair["steps"])
    assert kair["index"] == kair["steps"][-1]["index"]
    # usage counts the loop's real tokens: every step and the answer call
    assert done.usage.prompt_tokens == plain["usage"]["prompt_tokens"] > sum(
        s["usage"]["prompt_tokens"] for s in kair["steps"])
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    same_trace(kair["trace"], plain["trace"])


def test_the_stream_sends_each_step_then_the_answer_then_usage_and_done():
    with served(ScriptedLLM(insufficient_kair)) as server:
        chunks = list(client(server).chat.completions.create(
            model="kair-student", messages=ask(), stream=True, stream_options={"include_usage": True},
            extra_body={"max_steps": 3, "return_trace": True}))
        with httpx.stream("POST", server.url + "/v1/chat/completions", json={
                "model": "kair-student", "messages": ask(), "stream": True},
                headers={"Authorization": f"Bearer {KEY}"}) as raw:
            lines = [line for line in raw.iter_lines() if line.startswith("data:")]
        plain = httpx.post(server.url + "/v1/answer", json={"question": Q, "return_trace": True},
                           headers={"Authorization": f"Bearer {KEY}"}).json()
    events = [c.model_extra.get("kair", {}).get("event") for c in chunks]
    assert events == ["start", "step", "step", "step", "answer", None, None]
    assert chunks[0].choices[0].delta.role == "assistant"
    steps = [c.model_extra["kair"]["step"] for c, e in zip(chunks, events) if e == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(c.choices[0].delta.content is None for c, e in zip(chunks, events) if e == "step")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain["answer"]
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == plain["usage"]["prompt_tokens"]
    answer = chunks[4].model_extra["kair"]
    assert [s["query"] for s in answer["steps"]] == [s["query"] for s in steps]
    same_trace(answer["trace"], plain["trace"])
    # without stream_options.include_usage, no usage chunk
    assert lines[-1] == "data: [DONE]" and not any("usage" in json.loads(line[5:]) for line in lines[:-1])


def test_models_lists_the_served_adapter_on_its_base():
    with served() as server:
        (model,) = client(server).models.list().data
    assert model.id == "kair-student" and model.object == "model" and model.owned_by == "kair"
    assert model.model_extra["root"] == ADAPTER and model.model_extra["parent"] == "base-model"


def test_errors_come_in_openais_shape_through_the_sdk():
    with served(max_question_chars=200, max_body_bytes=4096) as server:
        with pytest.raises(openai.AuthenticationError) as e:
            client(server, key="wrong").chat.completions.create(model="kair-student", messages=ask())
        assert e.value.status_code == 401 and e.value.code == "invalid_api_key" and "API key" in e.value.message
        bad = client(server)
        for kwargs, needle in [
            ({"temperature": 0.2}, "temperature: not used by the KAIR loop"),
            ({"max_tokens": 10}, "max_tokens: not used by the KAIR loop"),
            ({"n": 2}, "n: the KAIR loop gives one answer per question"),
            ({"extra_body": {"max_steps": 99}}, "max_steps: must be between 1 and"),
            ({"extra_body": {"index_format": "graph"}}, "index_format: unknown"),
            ({"extra_body": {"max_step": 2}}, "max_step: unknown field"),
            ({"messages": ask("   ")}, "question: must not be empty"),
            ({"messages": [*ask(), {"role": "assistant", "content": "x"}]}, "the last message must be the user's"),
            ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
             "only text parts"),
        ]:
            with pytest.raises(openai.UnprocessableEntityError) as e:
                bad.chat.completions.create(**{"model": "kair-student", "messages": ask(), **kwargs})
            assert needle in e.value.message and e.value.body["type"] == "invalid_request_error", kwargs
        with pytest.raises(openai.NotFoundError, match="not served here") as e:
            bad.chat.completions.create(model="gpt-4o", messages=ask())
        assert e.value.code == "model_not_found"
        with pytest.raises(openai.APIStatusError) as e:
            bad.chat.completions.create(model="kair-student", messages=ask("x" * 5000))
        assert e.value.status_code == 413 and e.value.code == "request_too_large"
        # /v1/answer keeps its own shape
        r = httpx.post(server.url + "/v1/answer", json={"question": ""}, headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 422 and "detail" in r.json()


def test_a_chat_while_loading_is_a_503_in_openais_shape():
    loaded = threading.Event()

    def slow():
        loaded.wait(10)
        return ScriptedLLM(echo_kair), WordOverlap()

    cfg = serve_config(None, {"backend": "scripted"})
    with BackgroundServer(create_app(cfg, build=slow)) as server:
        (listed,) = client(server).models.list().data  # the scripted backend loads no model: it says so
        assert listed.id == "scripted"
        with pytest.raises(openai.InternalServerError) as e:
            client(server).chat.completions.create(model="scripted", messages=ask())
        loaded.set()
    assert e.value.status_code == 503 and e.value.body["code"] == "unavailable" and "loading" in e.value.message


def metric(families: dict, name: str, **labels) -> float:
    """The sum of a sample's values over the series whose labels include `labels`."""
    values = [s.value for f in families.values() for s in f.samples
              if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(values)


def scrape(server: BackgroundServer, key: str | None = KEY) -> dict:
    r = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in parser.text_string_to_metric_families(r.text)}


def test_metrics_count_requests_latency_batches_steps_tokens_and_errors():
    llm = GatedLLM(echo_kair)
    with served(llm) as server:
        sdk = client(server)
        threads = [threading.Thread(target=sdk.chat.completions.create,
                                    kwargs={"model": "kair-student", "messages": ask(f"{Q} ({i})")}) for i in range(3)]
        for t in threads:
            t.start()
        llm.entered.wait(10)
        llm.gate.set()
        for t in threads:
            t.join(30)
        answer = httpx.post(server.url + "/v1/answer", json={"question": Q},
                            headers={"Authorization": f"Bearer {KEY}"}).json()
        httpx.post(server.url + "/v1/answer", json={"question": ""}, headers={"Authorization": f"Bearer {KEY}"})
        assert httpx.get(server.url + "/metrics").status_code == 401  # the key is needed
        m = scrape(server)
    chat_ok = metric(m, "kair_requests_total", route="/v1/chat/completions", status="200")
    assert chat_ok == 3
    assert metric(m, "kair_requests_total", route="/v1/answer", status="200") == 1
    assert metric(m, "kair_requests_total", route="/v1/answer", status="422") == 1
    assert metric(m, "kair_requests_total", route="/metrics", status="401") == 1
    assert metric(m, "kair_request_duration_seconds_count", route="/v1/chat/completions") == 3
    assert metric(m, "kair_time_to_first_step_seconds_count") == 4
    assert metric(m, "kair_questions_total", outcome="ok") == 4
    assert metric(m, "kair_steps_per_question_count") == 4
    assert metric(m, "kair_steps_per_question_sum") >= 4
    assert metric(m, "kair_batch_questions_count") >= 1
    # the first round held the three chats, released together by the gate: a batch of >= 2 questions
    assert metric(m, "kair_batch_questions_bucket", le="1.0") < metric(m, "kair_batch_questions_count")
    assert metric(m, "kair_prompt_tokens_total") > answer["usage"]["prompt_tokens"]
    assert metric(m, "kair_backend_errors_total") == 0


def test_backend_errors_are_counted_and_open_metrics_needs_no_key():
    def broken(messages):
        raise RuntimeError("GPU fell off the bus")

    with served(ScriptedLLM(broken), open_metrics=True) as server:
        with pytest.raises(openai.APIStatusError) as e:
            client(server).chat.completions.create(model="kair-student", messages=ask())
        assert e.value.status_code == 502 and e.value.body["type"] == "server_error"
        m = scrape(server, key=None)
    assert metric(m, "kair_backend_errors_total") == 1
    assert metric(m, "kair_questions_total", outcome="backend_error") == 1
    assert metric(m, "kair_requests_total", route="/v1/chat/completions", status="502") == 1


def test_a_chat_and_an_answer_give_the_same_trace_on_the_tiny_model(tiny_model_dir):
    llm = HFBackend.from_config(LLMConfig(model=str(tiny_model_dir), device="cpu", batch_size=8))
    with served(llm, llm_config={"backend": "hf", "model": str(tiny_model_dir)},
                api_key=None) as server:
        done = client(server, key="none").chat.completions.create(
            model=str(tiny_model_dir), messages=ask(), extra_body={"max_steps": 2, "return_trace": True})
        plain = httpx.post(server.url + "/v1/answer", json={"question": Q, "max_steps": 2, "return_trace": True},
                           timeout=120).json()
    assert done.choices[0].message.content == plain["answer"]
    same_trace(done.model_extra["kair"]["trace"], plain["trace"])


def test_the_readmes_sdk_call_and_curl_run_as_written(capsys):
    import re
    import subprocess
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme[readme.index("### OpenAI clients"):]
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shell = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    with served(api_key=None, llm_config={"backend": "hf", "model": "base", "adapter": "runs/x/checkpoint-N"}) as server:
        exec(python.replace("http://127.0.0.1:8000", server.url), {})
        printed = capsys.readouterr().out.splitlines()
        curl = subprocess.run(shell.replace("127.0.0.1:8000", server.url), shell=True, capture_output=True,
                              text=True, timeout=60)
    assert printed[0] and "start " in printed and "step None" in printed  # the answer, then the stream's events
    assert any(line.startswith("answer ") and len(line) > 7 for line in printed)
    assert curl.returncode == 0, curl.stderr
    body, end = json.JSONDecoder().raw_decode(curl.stdout)  # the chat's JSON, then the metrics text
    assert body["choices"][0]["message"]["content"]
    metrics = curl.stdout[end:]
    assert "kair_requests_total" in metrics
