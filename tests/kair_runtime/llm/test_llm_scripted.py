from kair_runtime.llm.base import SamplingParams
from kair_runtime.llm.scripted import CALLS_KEPT, ScriptedLLM


def test_a_long_running_scripted_backend_keeps_a_bounded_call_log():
    llm = ScriptedLLM(lambda messages: "ok")
    prompt = [{"role": "user", "content": "q"}]
    for n in range(CALLS_KEPT + 10):
        llm.generate([prompt] * (1 + n % 3), SamplingParams())
    assert len(llm.calls) == CALLS_KEPT
    assert list(llm.calls)[-3:] == [1 + n % 3 for n in range(CALLS_KEPT + 7, CALLS_KEPT + 10)]
