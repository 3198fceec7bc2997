# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the pinned agent clients wait out a restart (lab/client_retries.py), checked against the
real clients' runs recorded on lab/wedge_standin.py (tests/unit/fixtures/clients-across-wedge/),
and the stand-in itself."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode_measure import (
    run_events,
)

from lab import client_retries as retries
from lab import wedge_standin

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "clients-across-wedge"

# (client, Retry-After, earliest, latest): the last retry after the engine dropped the request.
WINDOWS = [
    (retries.OPENCODE, 10, 42.0, 47.5),  # 2 s + 4 x 10 s; + 0.5 s jitter and 1 s per try
    (retries.OPENCODE, 30, 122.0, 127.5),
    (retries.OPENCODE, 1, 6.0, 11.5),
    (retries.CLAUDE_CODE, 10, 162.0, 213.125),  # 5 x 10 + 16 + 3 x 32; x 1.25, + 0.625 + 10 x 1 s
    (retries.CLAUDE_CODE, 30, 276.0, 355.625),  # 6 x 30 + 3 x 32
    (retries.CLAUDE_CODE, 1, 128.0, 170.625),  # its backoff alone: 0.5 ... 16 + 3 x 32, the first two 1 s
]


@pytest.mark.parametrize(("client", "retry_after", "earliest", "latest"), WINDOWS)
def test_the_window_of_a_clients_last_retry(client, retry_after, earliest, latest):
    assert retries.retry_window(client, retry_after) == pytest.approx((earliest, latest))


@pytest.mark.parametrize(
    ("client", "retry_after", "message"),
    [
        (retries.OPENCODE, 0, "retry_after: 0 is outside the ingress's range 1-60 s"),
        (retries.CLAUDE_CODE, 61, "retry_after: 61 is outside the ingress's range 1-60 s"),
        ("codex", 10, "client: 'codex' is none of opencode, claude_code"),
    ],
)
def test_a_window_outside_what_is_known_is_refused(client, retry_after, message):
    with pytest.raises(ValueError, match=message):
        retries.retry_window(client, retry_after)


# (client, outage, Retry-After, expected): the lab's wedges were 60-90 s from drop to serving.
OUTCOMES = [
    (retries.OPENCODE, 30.0, 10, retries.FINISH),
    (retries.OPENCODE, 40.0, 10, retries.FINISH),  # 2 s of slack below 42
    (retries.OPENCODE, 41.0, 10, retries.EITHER),
    (retries.OPENCODE, 49.0, 10, retries.EITHER),
    (retries.OPENCODE, 49.5, 10, retries.GIVE_UP),
    (retries.OPENCODE, 75.0, 10, retries.GIVE_UP),  # the lab's usual restart: opencode gives up
    (retries.OPENCODE, 75.0, 20, retries.FINISH),  # ... unless the ingress says 20 s
    (retries.CLAUDE_CODE, 75.0, 10, retries.FINISH),
    (retries.CLAUDE_CODE, 180.0, 10, retries.EITHER),
    (retries.CLAUDE_CODE, 240.0, 10, retries.GIVE_UP),
]


@pytest.mark.parametrize(("client", "outage", "retry_after", "expected"), OUTCOMES)
def test_what_a_client_must_do_for_an_outage(client, outage, retry_after, expected):
    assert retries.expected(client, outage, retry_after) == expected


@pytest.mark.parametrize(
    ("samples", "away"),
    [
        ([], None),
        ([(1.0, 200), (2.0, 200)], None),
        ([(1.0, 200), (2.0, None), (3.0, 503), (4.0, 503), (5.0, None), (6.0, 200)], (3.0, 6.0)),
        ([(1.0, 503), (2.0, 503)], (1.0, None)),
        ([(1.0, 200), (2.0, 503), (3.0, 401), (4.0, 200), (5.0, 503)], (2.0, 4.0)),
    ],
)
def test_when_the_engine_was_away_behind_the_ingress(samples, away):
    assert retries.engine_away(samples) == away


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ([("Content-Type", "application/json"), ("Retry-After", "10")], 10.0),
        ([("retry-after", "2.5")], 2.5),
        ([("Retry-After", "Wed, 21 Oct 2026 07:28:00 GMT")], None),
        ([], None),
    ],
)
def test_the_retry_after_a_503_carried(headers, seconds):
    assert retries.retry_after_of(headers) == seconds


def test_opencodes_requests_are_its_stream_log_lines():
    stderr = "\n".join([
        'timestamp=... level=INFO run=1 message=loop session.id=s step=0',
        'timestamp=... level=INFO run=1 message=stream providerID=p modelID=m session.id=s small=false',
        'timestamp=... level=ERROR run=1 message="stream error" providerID=p error.error.code=500',
        'timestamp=... level=INFO run=1 message=stream providerID=p modelID=m session.id=s small=false',
        'timestamp=... level=ERROR run=1 message=process session.id=s error="x"',
    ])  # fmt: skip
    assert retries.opencode_requests(stderr) == 2
    assert retries.opencode_requests("") == 0


# The real clients recorded on the stand-in (README of the fixtures): the case, the client, how
# long the engine stayed away after the drop, whether the turn finished, how many requests failed\n# (the hung one and each 503).
RECORDED = [
    ("opencode-error-gives-up", retries.OPENCODE, 60, False, 6),
    ("opencode-error-finishes", retries.OPENCODE, 30, True, 4),
    ("opencode-drop-finishes", retries.OPENCODE, 20, True, 3),
    ("claude-code-error-finishes", retries.CLAUDE_CODE, 60, True, 7),
    ("claude-code-drop-finishes", retries.CLAUDE_CODE, 30, True, 4),
    ("claude-code-error-gives-up", retries.CLAUDE_CODE, 400, False, 11),
]


def _recorded(case: str) -> dict:
    folder = FIXTURES / case
    timeline = [json.loads(line) for line in (folder / "standin.jsonl").read_text().splitlines()]
    return {
        "rc": int((folder / "rc").read_text()),
        "stdout": (folder / "stdout.txt").read_text(),
        "stderr": (folder / "stderr.txt").read_text(),
        "dropped": next(e["t"] for e in timeline if e.get("event") == "engine stopped"),
        "requests": [e for e in timeline if "request" in e],
    }


@pytest.mark.parametrize(("case", "client", "down", "finished", "failed"), RECORDED)
def test_a_recorded_run_does_what_the_retries_say(case, client, down, finished, failed):
    run = _recorded(case)
    answers = [r["answer"] for r in run["requests"]]
    assert answers.count("hang") + answers.count(503) == failed, answers
    assert (run["rc"] == 0) is finished
    assert retries.expected(client, down, 10) == (retries.FINISH if finished else retries.GIVE_UP)
    last = run["requests"][-1]["t"] - run["dropped"]
    earliest, latest = retries.retry_window(client, 10)
    if finished:
        assert answers[-1] == 200 and down <= last <= latest
    else:
        assert earliest <= last <= latest, last
    if client == retries.OPENCODE:
        turn = run_events(run["stdout"])
        assert retries.opencode_requests(run["stderr"]) == len(run["requests"])
        if finished:
            assert turn["text"] == wedge_standin.ANSWER and turn["errors"] == []
        else:
            (error,) = turn["errors"]
            assert error.startswith("APIError: the vLLM server") and "not accepting connections" in error
        return
    turn = retries.claude_code_run(run["stdout"])
    assert turn["finished"] is finished
    statuses = [r["status"] for r in turn["retries"]]
    # A 503 it retried is announced; the last one of a run that gave up is not.
    assert statuses.count(503) == answers.count(503) - (0 if finished else 1), turn["retries"]
    if finished:
        assert turn["text"] == wedge_standin.ANSWER
    else:
        assert turn["api_error_status"] == 503 and "not accepting connections" in turn["text"]
        assert len(statuses) == retries.CLAUDE_CODE_RETRIES


def test_claude_codes_result_without_a_result_line_is_not_finished():
    assert retries.claude_code_run('{"type":"system","subtype":"init"}\nnot json\n') == {
        "finished": False, "text": "", "api_error_status": None, "retries": []}  # fmt: skip


@pytest.fixture
def standin():
    server = wedge_standin.serve(0, "error", 0.2, 0.6, "7")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _post(url: str, body: dict) -> tuple[int, dict, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def test_the_standin_hangs_ends_refuses_then_answers(standin):
    chat = f"{standin}/v1/chat/completions"
    status, _, body = _post(chat, {"model": "m", "stream": True})
    assert status == 200 and wedge_standin.ENGINE_DEAD in body and body.endswith("data: [DONE]\n\n")
    status, headers, body = _post(chat, {"model": "m", "stream": True})
    assert status == 503 and headers["Retry-After"] == "7" and "Retry after 7 s" in json.loads(body)["error"]["message"]
    threading.Event().wait(0.7)
    status, _, body = _post(f"{standin}/v1/messages?beta=true", {"model": "m", "stream": False})
    assert status == 200 and json.loads(body)["content"][0]["text"] == wedge_standin.ANSWER
    status, _, body = _post(chat, {"model": "m", "stream": True})
    assert status == 200 and wedge_standin.ANSWER in body and body.endswith("data: [DONE]\n\n")
