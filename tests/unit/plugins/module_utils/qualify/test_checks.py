# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The qualification checks end to end over real HTTP, against a local server replaying
recorded vLLM 0.32 answers (fake_vllm.py): what each check sends, how it judges,
and that every exchange ends at its deadline."""

from __future__ import annotations

import json
import threading
import time

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.qualify import _checks as Q
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._http import (
    Client,
    HttpError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._run import (
    run_check,
)

from .fake_vllm import FakeServer, Reply, as_json, recorded, sse

MODEL = "localinference/tiny-deepseek"
MODELS = {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 8192}]}
TOOLS = json.loads(recorded("chat-tools.json"))
CUT = {
    9: json.loads(recorded("chat-tools-cut-9.json")),
    11: json.loads(recorded("chat-tools-cut-11.json")),
}
TOO_LONG = recorded("chat-too-long-400.json")
METRICS = recorded("../vllm-metrics/real-cpu-0.32.0-after-4-requests.prom")


def target(
    server: FakeServer, limitation: str | None = None, timeout: float = 10, **params
) -> Q.Target:
    return Q.Target(
        Client(server.base_url, "k" * 20, timeout),
        MODEL,
        8192,
        server.base_url[: -len("/v1")] + "/metrics",
        limitation,
        params,
    )


def usage_reply(prompt_tokens: int, stream: bool) -> Reply:
    """A scripted-model answer carrying the prompt size (one filler word ~ one token)."""
    events = [
        {"choices": [{"index": 0, "delta": {"reasoning": "r"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "Hello."}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2}},
    ]
    if stream:
        return Reply(
            chunks=[f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"],
            content_type="text/event-stream",
        )
    return as_json(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {"content": "Hello.", "reasoning": "r"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2},
        }
    )


def words(body) -> int:
    return sum(
        len(m["content"].split()) for m in body["messages"] if isinstance(m.get("content"), str)
    )


def test_smoke_passes_on_the_recorded_answers():
    def answer(method, path, body):
        if path == "/v1/models":
            return as_json(MODELS)
        if body.get("stream"):
            return sse("chat-stream-reasoning.sse")
        return usage_reply(16, stream=False)

    with FakeServer(answer) as server:
        out = run_check("smoke", target(server))
    assert out["status"] == Q.J.PASS, out["why"]
    assert out["evidence"]["stream"]["reasoning_key"] == "reasoning"
    assert out["evidence"]["served_max_model_len"] == 8192
    assert out["timings"]["ttft_s"] is not None
    # the key goes to the server as a bearer token
    assert server.requests[0][3]["Authorization"] == "Bearer " + "k" * 20


@pytest.mark.parametrize(
    ("stream", "status", "why"),
    [
        ("chat-tools-stream.sse", Q.J.PASS, ""),
        ("chat-tools-stream-lost-call.sse", Q.J.FAIL, "the stream lost or changed the tool call"),
    ],
    ids=["recorded-good-stream", "recorded-stream-that-lost-the-arguments"],
)
def test_tools_stream_is_compared_with_its_unstreamed_twin(stream, status, why):
    def answer(method, path, body):
        return sse(stream) if body.get("stream") else as_json(TOOLS)

    with FakeServer(answer) as server:
        out = run_check("tools_stream", target(server))
    assert out["status"] == status
    assert why in out["why"]


def test_a_declared_limitation_never_hides_a_lost_stream():
    def answer(method, path, body):
        if body.get("stream"):
            return sse("chat-tools-stream-lost-call.sse")
        return as_json(TOOLS)

    with FakeServer(answer) as server:
        out = run_check("tools_stream", target(server, limitation="the model calls no tool"))
    assert out["status"] == Q.J.FAIL


def truncating(defective: bool):
    def answer(method, path, body):
        limit = body["max_tokens"]
        if limit >= 12:
            return as_json(TOOLS)
        if limit >= 10:
            return as_json(CUT[11])
        if defective:  # the seeds' defect: a cut call reported as a finished one
            doc = json.loads(json.dumps(TOOLS))
            doc["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"filePath": '
            return as_json(doc)
        return as_json(CUT[9])

    return answer


def test_truncated_tool_call_every_cut_says_length_or_holds_whole_json():
    with FakeServer(truncating(defective=False)) as server:
        out = run_check("truncated_tool_call", target(server))
    assert out["status"] == Q.J.PASS, out["why"]
    assert [c["max_tokens"] for c in out["evidence"]["cuts"]] == [11, 10, 9, 7]
    assert [c["finish_reason"] for c in out["evidence"]["cuts"]] == [
        "tool_calls",
        "tool_calls",
        "length",
        "length",
    ]


def test_truncated_tool_call_reported_as_tool_calls_fails():
    with FakeServer(truncating(defective=True)) as server:
        out = run_check("truncated_tool_call", target(server))
    assert out["status"] == Q.J.FAIL
    assert "cut at 9 of 12 tokens" in out["why"] and "400" in out["why"]


def test_truncated_tool_call_without_a_call_is_not_meaningful():
    def answer(method, path, body):
        return usage_reply(10, stream=False)

    with FakeServer(answer) as server:
        out = run_check("truncated_tool_call", target(server))
    assert out["status"] == Q.J.NOT_MEANINGFUL
    assert "no complete tool call to cut" in out["why"]


def ladder(refuse_above: int):
    def answer(method, path, body):
        if path == "/v1/models":
            return as_json(MODELS)
        tokens = words(body) + 10
        if tokens > refuse_above:
            return Reply(status=400, body=TOO_LONG)
        return usage_reply(tokens, stream=bool(body.get("stream")))

    return answer


def test_context_ladder_as_predicted():
    with FakeServer(ladder(8192)) as server:
        out = run_check("context_ladder", target(server, needle=False))
    assert out["status"] == Q.J.PASS, out["why"]
    rungs = out["evidence"]["rungs"]
    assert [r["outcome"] for r in rungs] == ["accepted", "accepted", "accepted", "refused"]
    assert rungs[-1]["refused_at"] == 8192
    assert out["evidence"]["needle"]["status"] == Q.J.NOT_MEANINGFUL


def test_context_ladder_refused_below_the_plan_fails():
    with FakeServer(ladder(3000)) as server:
        out = run_check("context_ladder", target(server, needle=False))
    assert out["status"] == Q.J.FAIL
    assert "was refused" in out["why"]


def test_needle_without_a_declared_limitation_fails_and_with_one_is_not_meaningful():
    with FakeServer(ladder(8192)) as server:
        failed = run_check("context_ladder", target(server, fractions=[0.25]))
        declared = run_check("context_ladder", target(server, "random weights", fractions=[0.25]))
    assert failed["status"] == Q.J.FAIL and "does not contain the needle" in failed["why"]
    assert declared["status"] == Q.J.PASS
    assert declared["evidence"]["needle"]["status"] == Q.J.NOT_MEANINGFUL


def concurrent(serialised: bool, seconds: float = 0.4):
    lock = threading.Lock()

    def answer(method, path, body):
        if path.endswith("/metrics"):
            return Reply(status=404, body=b'{"detail":"Not Found"}')
        if serialised:
            with lock:
                time.sleep(seconds)
        else:
            time.sleep(seconds)
        return usage_reply(10, stream=False)

    return answer


@pytest.mark.parametrize(("serialised", "status"), [(False, Q.J.PASS), (True, Q.J.FAIL)])
def test_concurrency_without_metrics_judges_from_timings(serialised, status):
    with FakeServer(concurrent(serialised)) as server:
        out = run_check("concurrency", target(server, requests=3, max_tokens=64))
    assert out["status"] == status, out["why"]
    assert "HTTP 404" in out["evidence"]["metrics_error"]
    if status == Q.J.FAIL:
        assert "F3" in out["why"]


def engine(serialised: bool, seconds: float = 0.6):
    """A server whose recorded /metrics reports the requests it is working on right now."""
    lock = threading.Lock()
    state = {"running": 0, "waiting": 0}
    guard = threading.Lock()

    def gauges() -> bytes:
        text = METRICS.decode()
        for name, value in (("running", state["running"]), ("waiting", state["waiting"])):
            old = f'vllm:num_requests_{name}{{engine="0",model_name="{MODEL}"}} 0.0'
            assert old in text
            text = text.replace(old, old[: -len("0.0")] + f"{value}.0")
        return text.encode()

    def work() -> None:
        with guard:
            state["running"] += 1
        time.sleep(seconds)
        with guard:
            state["running"] -= 1

    def answer(method, path, body):
        if path.endswith("/metrics"):
            return Reply(body=gauges(), content_type="text/plain")
        if serialised:
            with guard:
                state["waiting"] += 1
            with lock:
                with guard:
                    state["waiting"] -= 1
                work()
        else:
            work()
        return usage_reply(10, stream=False)

    return answer


@pytest.mark.parametrize(("serialised", "status"), [(False, Q.J.PASS), (True, Q.J.FAIL)])
def test_concurrency_reads_the_running_gauge_during_the_burst(serialised, status):
    with FakeServer(engine(serialised)) as server:
        out = run_check("concurrency", target(server, requests=3, max_tokens=64))
    assert out["status"] == status, out["why"]
    assert out["evidence"]["metrics_samples_during_the_burst"] > 0
    if serialised:
        assert "vLLM ran at most 1 of them (waiting peaked at 2" in out["why"]
    else:
        assert out["evidence"]["peak_requests_running"] == 3.0


def test_shared_prefix_without_readable_counters_fails_naming_metrics_url():
    with FakeServer(concurrent(False, 0.0)) as server:
        out = run_check("shared_prefix", target(server))
    assert out["status"] == Q.J.FAIL
    assert "metrics_url" in out["why"]


def test_shared_prefix_hits_that_never_rise_fail():
    def answer(method, path, body):
        if path.endswith("/metrics"):
            return Reply(body=METRICS, content_type="text/plain")  # the counters never move
        return usage_reply(words(body) + 10, stream=False)

    with FakeServer(answer) as server:
        out = run_check("shared_prefix", target(server, requests=3, prefix_tokens=512))
    assert out["status"] == Q.J.FAIL
    assert "prefix-cache hits rose by 0" in out["why"]


def test_anthropic_messages_missing_is_not_meaningful():
    with FakeServer(lambda m, p, b: Reply(status=404, body=b'{"detail":"Not Found"}')) as server:
        out = run_check("anthropic_messages", target(server))
    assert out["status"] == Q.J.NOT_MEANINGFUL
    assert "does not offer /v1/messages" in out["why"]


def test_a_wrong_key_fails_naming_the_fix():
    body = b'{"error": {"message": "missing or wrong API key", "type": "invalid_api_key", "code": 401}}'
    with FakeServer(lambda m, p, b: Reply(status=401, body=body)) as server:
        out = run_check("responses_api", target(server))
    assert out["status"] == Q.J.FAIL
    assert "HTTP 401" in out["why"] and "qualify_api_key_file" in out["why"]


def test_a_stalled_stream_ends_at_the_deadline():
    """A server that keeps the stream alive without finishing costs the timeout, no more."""

    def answer(method, path, body):
        return Reply(chunks=[b": keep-alive\n\n"] * 50, delay=0.1, content_type="text/event-stream")

    with FakeServer(answer) as server:
        started = time.monotonic()
        out = run_check("reasoning_split", target(server, timeout=1.0))
        elapsed = time.monotonic() - started
    assert out["status"] == Q.J.FAIL
    assert "did not finish within the 1 s deadline" in out["why"]
    assert elapsed < 3


def test_a_server_dripping_bytes_cannot_outlast_the_deadline():
    """Every read is short; only the watchdog bounds the whole exchange."""

    def answer(method, path, body):
        return Reply(chunks=[b"x"] * 100, delay=0.05)

    with FakeServer(answer) as server:
        client = Client(server.base_url, None, 0.6)
        started = time.monotonic()
        with pytest.raises(HttpError, match="deadline"):
            client.request("GET", "models")
        assert time.monotonic() - started < 2.5


def test_nothing_listening_is_named():
    client = Client("http://127.0.0.1:9/v1", None, 2)
    with pytest.raises(HttpError, match="connection refused"):
        client.request("GET", "models")


@pytest.mark.parametrize(
    ("check", "params", "message"),
    [
        ("concurrency", {"requests": 1}, "params.requests must be at least 2"),
        ("context_ladder", {"fractions": ["half"]}, "params.fractions"),
        ("tools", {"tool": {"name": "read"}}, "params.tool must be an OpenAI tool"),
        ("truncated_tool_call", {"cut_tokens": [0]}, "params.cut_tokens"),
        ("smoke", {"max_tokens": "16"}, "params.max_tokens must be int"),
        ("nonsense", {}, "check must be one of"),
    ],
)
def test_bad_params_are_named(check, params, message):
    with FakeServer(ladder(8192)) as server, pytest.raises(Q.QualifyInputError, match=message):
        run_check(check, target(server, **params))
