# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""doctor_facts: bounded, read-only gathering; raw text back, every read problem named."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _commands
from ansible_collections.localinference.vllm.plugins.module_utils.doctor import _evidence_gather
from ansible_collections.localinference.vllm.plugins.modules import doctor_facts

from tests.unit.module_helper import run_module

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "doctor")
with open(os.path.join(FIXTURES, "lab-units-stopped-by-a-rollout.json")) as _handle:
    STOPPED = json.load(_handle)
SHOW = STOPPED["spark-worker"]["units"]["localinference-vllm.service"]["stdout"]
JOURNAL = STOPPED["spark-worker"]["journal"]["text"]


@pytest.fixture
def commands(monkeypatch):
    """Record every argv; answer systemctl with the recorded worker and journalctl with its log."""
    ran: list[tuple[list[str], float]] = []

    def run_bounded(argv, timeout, environ=None, hint=None):
        ran.append((list(argv), timeout))
        if "show" in argv:
            return 0, SHOW, ""
        if argv[-1] == "slow":
            raise _commands.CommandTimeout(argv, timeout, hint, True)
        return 0, JOURNAL, ""

    monkeypatch.setattr(_commands, "run_bounded", run_bounded)
    monkeypatch.setattr(
        doctor_facts.AnsibleModule,
        "get_bin_path",
        lambda self, name, required=False: f"/bin/{name}",
    )
    return ran


def test_files_are_returned_raw_and_read_problems_are_named(tmp_path, commands):
    good = tmp_path / "plan.json"
    good.write_text('{"schema": 1}')
    binary = tmp_path / "fabric.json"
    binary.write_bytes(b"\xff\xfe\x00")
    files = {
        "plan": str(good),
        "fabric": str(binary),
        "serving": str(tmp_path),  # a directory
        "client": str(tmp_path / "missing.json"),
    }
    out = run_module(doctor_facts, {"files": files}, check_mode=True)
    assert not out.failed and out.result["changed"] is False
    got = out.result["ansible_facts"]["doctor_evidence"]["files"]
    assert got["plan"] == {"path": str(good), "found": True, "text": '{"schema": 1}', "error": None}
    assert "not UTF-8" in got["fabric"]["error"] and got["fabric"]["text"] is None
    assert "is a directory" in got["serving"]["error"]
    assert got["client"]["found"] is False and got["client"]["error"] is None
    assert commands == []


def test_units_and_the_last_boot_since_its_start_with_a_timeout(commands):
    out = run_module(
        doctor_facts,
        {
            "units": ["localinference-vllm.service"],
            "journal_unit": "localinference-vllm.service",
            "journal_lines": 50,
            "timeout": 7,
        },
    )
    evidence = out.result["ansible_facts"]["doctor_evidence"]
    assert evidence["units"]["localinference-vllm.service"] == {"stdout": SHOW, "error": None}
    assert evidence["journal"]["since"] == "Tue 2026-12-01 11:54:26 UTC"
    assert evidence["journal"]["text"] == JOURNAL
    assert evidence["journal"]["truncated"] is True  # more lines than journal_lines: a tail
    (show, t1), (journal, t2) = commands
    assert show[:3] == ["/bin/systemctl", "show", "--no-pager"]
    assert "ActiveState" in show[show.index("-p") + 1] and show[-1] == "localinference-vllm.service"
    assert journal == [
        "/bin/journalctl",
        "-u",
        "localinference-vllm.service",
        "--no-pager",
        "-o",
        "short",
        "-n",
        "50",
        "--since",
        "Tue 2026-12-01 11:54:26 UTC",
    ]
    assert t1 == t2 == 7


def test_a_command_that_runs_over_is_an_error_in_the_evidence_not_a_failure(monkeypatch, commands):
    def hung(argv, timeout, environ=None, hint=None):
        raise _commands.CommandTimeout(argv, timeout, hint, True)

    monkeypatch.setattr(_commands, "run_bounded", hung)
    out = run_module(
        doctor_facts,
        {
            "units": ["localinference-vllm.service"],
            "journal_unit": "localinference-vllm.service",
            "timeout": 3,
        },
    )
    assert not out.failed
    evidence = out.result["ansible_facts"]["doctor_evidence"]
    assert "did not answer within 3 s" in evidence["units"]["localinference-vllm.service"]["error"]
    # No start time could be read: the newest lines are asked for, and that times out too.
    assert evidence["journal"]["since"] is None
    assert "journalctl did not answer within 3 s" in evidence["journal"]["error"]


@pytest.mark.parametrize(
    "args, words",
    [
        ({"units": ["-x.service"]}, "units"),
        ({"journal_unit": "a b"}, "journal_unit"),
        ({"files": {"plan": "relative.json"}}, "files.plan"),
        ({"files": {"plan": "/etc/x\n"}}, "files.plan"),
        ({"timeout": 0}, "timeout"),
        ({"journal_lines": 0}, "journal_lines"),
        ({"max_bytes": 0}, "max_bytes"),
    ],
)
def test_bad_options_are_refused_by_name(args, words, commands):
    out = run_module(doctor_facts, args)
    assert out.failed and words in out.result["msg"], out.result["msg"]
    assert commands == []


def test_links_read_every_interface_mtu_as_text_and_name_what_vanished(tmp_path, monkeypatch):
    # The lab worker's cluster veth after `ip link set dev enp1s0f0np0 mtu 1500` (F19), lo, and
    # an interface removed between the listing and the read (no mtu file any more).
    for name, mtu, state in (("enp1s0f0np0", "1500\n", "up\n"), ("lo", "65536\n", "unknown\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mtu").write_text(mtu)
        (tmp_path / name / "operstate").write_text(state)
    (tmp_path / "veth9").mkdir()
    monkeypatch.setattr(_evidence_gather, "SYS_CLASS_NET", str(tmp_path))
    out = run_module(doctor_facts, {"links": True}, check_mode=True)
    links = out.result["ansible_facts"]["doctor_evidence"]["links"]
    assert links["enp1s0f0np0"] == {"mtu": "1500", "operstate": "up", "error": None}
    assert links["lo"]["mtu"] == "65536"
    assert links["veth9"]["mtu"] is None and "veth9/mtu" in links["veth9"]["error"]
    assert run_module(doctor_facts, {}).result["ansible_facts"]["doctor_evidence"]["links"] is None


def test_links_on_this_machines_real_sysfs():
    out = run_module(doctor_facts, {"links": True}, check_mode=True)
    links = out.result["ansible_facts"]["doctor_evidence"]["links"]
    assert links["lo"]["mtu"].isdigit() and links["lo"]["error"] is None


# --- the head's live reads: one streamed token (F28) and the watchdog's incidents -------------

KEY = "doctor-test-key-0123456789abcdef"
ROLE_CHUNK = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN_CHUNK = b'data: {"choices":[{"index":0,"delta":{"reasoning":" OK"}}]}\n\n'


class Endpoint(BaseHTTPRequestHandler):
    """Caddy with the key in front of vLLM (``/m/...``) and vLLM itself (``/...``).

    ``modes`` per side: ``ok`` streams a token, ``wedged`` answers /health and sends the role
    delta, then nothing (a rank stopped in a collective), ``bad`` answers 400, ``down`` 502.
    """

    modes: ClassVar[dict[str, str]] = {"ingress": "ok", "engine": "ok"}
    bodies: ClassVar[list[dict]] = []

    def log_message(self, *args):
        pass

    def _side(self) -> str:
        return "ingress" if self.path.startswith("/m/") else "engine"

    def do_GET(self):
        down = self.modes[self._side()] == "down"
        self.send_response(502 if down else 200 if self.path.endswith("/health") else 404)
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        side, mode = self._side(), self.modes[self._side()]
        if side == "ingress" and self.headers.get("Authorization") != f"Bearer {KEY}":
            self.send_response(401)
            self.end_headers()
            return
        if mode in ("bad", "down"):
            self.send_response(400 if mode == "bad" else 502)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(ROLE_CHUNK)
        self.wfile.flush()
        if mode == "wedged":
            time.sleep(3)
            return
        self.wfile.write(TOKEN_CHUNK + b"data: [DONE]\n\n")


@pytest.fixture
def endpoint():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield base
    httpd.shutdown()
    Endpoint.modes = {"ingress": "ok", "engine": "ok"}
    Endpoint.bodies = []


def targets(base: str) -> list[dict]:
    return [
        {"name": "ingress", "base_url": f"{base}/m/v1", "health_url": f"{base}/m/health",
         "model": "m", "auth": True},
        {"name": "engine", "base_url": f"{base}/v1", "health_url": f"{base}/health",
         "model": "m", "auth": False},
    ]  # fmt: skip


KEY_FILES = {
    "good": f"LOCALINFERENCE_INGRESS_API_KEY={KEY}\n",
    "wrong": "LOCALINFERENCE_INGRESS_API_KEY=another-key-0123456789abcdef\n",
    "no name": f"{KEY}\n",
    "short": "LOCALINFERENCE_INGRESS_API_KEY=short\n",
}

# (case, key file (None: missing), ingress mode, engine mode,
#  [(probe name, ok, timeout, health status, words of the error ("": any))], words of key_error)
# A silent stream's error is the wait's "no token within 1 s" or the socket's "timed out"
# (both end at the deadline): either is a timeout.
TOKEN_CASES = [
    ("the ingress streams: the engine is not asked", "good", "ok", "ok",
     [("ingress", True, False, 200, None)], None),
    ("a stopped rank: /health 200 on both, no token within the deadline on both", "good",
     "wedged", "wedged",
     [("ingress", False, True, 200, ""),
      ("engine", False, True, 200, "")], None),
    ("the ingress refuses the key: the engine streams directly", "wrong", "ok", "ok",
     [("ingress", False, False, 200, "HTTP 401"), ("engine", True, False, 200, None)], None),
    ("no key file: only the engine is asked", None, "ok", "ok",
     [("engine", True, False, 200, None)], "does not exist: run the ingress stage"),
    ("a key file without the variable's name", "no name", "ok", "ok",
     [("engine", True, False, 200, None)], "does not start with a LOCALINFERENCE_INGRESS_API_KEY"),
    ("a key too short (the key is never quoted)", "short", "ok", "ok",
     [("engine", True, False, 200, None)], "is 5 characters long"),
    ("the engine is down behind Caddy: 502 everywhere", "good", "down", "down",
     [("ingress", False, False, 502, "HTTP 502"), ("engine", False, False, 502, "HTTP 502")],
     None),
    ("the engine rejects the request (HTTP 400) while /health answers", "good", "bad", "bad",
     [("ingress", False, False, 200, "HTTP 400"), ("engine", False, False, 200, "HTTP 400")],
     None),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, key_file, ingress, engine, probes, key_error",
    TOKEN_CASES,
    ids=[c[0] for c in TOKEN_CASES],
)
def test_token_probe(tmp_path, endpoint, name, key_file, ingress, engine, probes, key_error):
    Endpoint.modes = {"ingress": ingress, "engine": engine}
    path = tmp_path / "api-key.env"
    if key_file is not None:
        path.write_text(KEY_FILES[key_file])
    started = time.monotonic()
    out = run_module(
        doctor_facts,
        {"token_probes": targets(endpoint), "key_path": str(path), "token_deadline": 1},
        check_mode=True,
    )
    elapsed = time.monotonic() - started
    assert not out.failed, out.result
    token = out.result["ansible_facts"]["doctor_evidence"]["token"]
    got = [
        (p["name"], p["ok"], p["timeout"], p["health_status"], p["error"]) for p in token["probes"]
    ]
    assert len(got) == len(probes), got
    for (gname, ok, timeout, health, error), (wname, wok, wtimeout, whealth, words) in zip(
        got, probes, strict=True
    ):
        assert (gname, ok, timeout, health) == (wname, wok, wtimeout, whealth), got
        assert (error is None) if words is None else (words in error), got
    assert (token["key_error"] is None) if key_error is None else key_error in token["key_error"]
    assert token["deadline_s"] == 1 and token["key_path"] == str(path)
    # One token, streamed: what the watchdog sends too.
    assert all(b["stream"] is True and b["max_tokens"] == 1 for b in Endpoint.bodies)
    # Each target waits at most its deadline (plus /health): a wedge costs two, never more.
    assert elapsed < len(probes) * 1 + 5, f"{name}: {elapsed:.1f} s"
    assert KEY not in json.dumps(out.result), "the key left the node"


def _lines(*records: dict) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


with open(os.path.join(FIXTURES, "lab-incidents.jsonl"), "rb") as _handle:
    LAB_INCIDENTS = _handle.read()
GOOD = json.loads(LAB_INCIDENTS.splitlines()[0])

# (case, the file's bytes (None: missing; "dir", "fifo"), limit,
#  verdicts of the incidents returned, words of each problem, exists)
INCIDENT_CASES = [
    ("the lab's 11 recorded incidents, the last 5", LAB_INCIDENTS, 5,
     ["wedged", "down", "down", "degraded", "down"], [], True),
    ("missing: none (no watchdog yet)", None, 5, [], [], False),
    ("empty", b"", 5, [], [], True),
    ("blank lines only", b"\n\n  \n", 5, [], [], True),
    ("a torn last line (the watchdog died mid-write)", LAB_INCIDENTS + b'{"schema": 1, "ti', 3,
     ["down", "degraded", "down"], ["line 12: not JSON"], True),
    ("lines that are not incidents", _lines(
        GOOD, {**GOOD, "schema": 2}, {**GOOD, "verdict": "fine"}, [1], {**GOOD, "epoch": -1},
        {**GOOD, "detect_seconds": "NaN"}, {**GOOD, "findings": "F28"}), 5,
     ["degraded"], ["line 2: schema 2", "line 3: verdict 'fine'", "line 4: not a JSON object",
                    "line 5: epoch", "line 6: detect_seconds", "line 7: findings"], True),
    ("a huge line", _lines(GOOD) + b'{"x": "' + b"a" * 20000 + b'"}\n' + _lines(GOOD), 5,
     ["degraded", "degraded"], ["line 2: 20009 bytes, longer than an incident"], True),
    ("not UTF-8", _lines(GOOD) + b"\xff\xfe garbage\n", 5, ["degraded"], ["line 2: not JSON"],
     True),
    ("NUL bytes (a file system that lost a block)", b"\x00" * 4096 + b"\n" + _lines(GOOD), 5,
     ["degraded"], ["line 1: not JSON"], True),
    ("larger than the tail read: the cut first line is dropped, not reported",
     _lines(*[GOOD] * 7000), 2, ["degraded", "degraded"], [], True),
    ("a directory", "dir", 5, [], ["is not a regular file"], True),
    ("a FIFO is never opened (it would block)", "fifo", 5, [], ["is not a regular file"], True),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, content, limit, verdicts, problems, exists",
    INCIDENT_CASES,
    ids=[c[0] for c in INCIDENT_CASES],
)
def test_incidents(tmp_path, name, content, limit, verdicts, problems, exists):
    path = tmp_path / "incidents.jsonl"
    if content == "dir":
        path.mkdir()
    elif content == "fifo":
        os.mkfifo(path)
    elif content is not None:
        path.write_bytes(content)
    out = run_module(
        doctor_facts, {"incidents": str(path), "incidents_limit": limit}, check_mode=True
    )
    got = out.result["ansible_facts"]["doctor_evidence"]["incidents"]
    assert got["path"] == str(path) and got["exists"] is exists
    assert [r["verdict"] for r in got["incidents"]] == verdicts
    assert len(got["problems"]) == len(problems), got["problems"]
    for said, words in zip(got["problems"], problems, strict=True):
        assert words in said, got["problems"]


@pytest.mark.parametrize(
    "args, words",
    [
        ({"token_deadline": 0}, "doctor_token_deadline"),
        ({"token_deadline": 601}, "doctor_token_deadline"),
        ({"incidents_limit": -1}, "doctor_incidents"),
        ({"token_probes": [{"name": "ingress", "base_url": "ftp://x", "health_url": "http://x",
                            "model": "m"}]}, "token_probes[0].base_url"),
        ({"token_probes": [{"name": "x", "base_url": "http://x", "health_url": "http://x",
                            "model": "m"}]}, "name"),
    ],
)  # fmt: skip
def test_bad_live_options_are_refused_by_name(args, words):
    out = run_module(doctor_facts, args)
    assert out.failed and words in out.result["msg"], out.result["msg"]


def test_the_documented_options_are_the_argument_spec(monkeypatch):
    """DOCUMENTATION parses (ansible-doc shows it) and lists exactly the module's options."""
    import yaml

    documented = yaml.safe_load(doctor_facts.DOCUMENTATION)["options"]
    yaml.safe_load(doctor_facts.EXAMPLES)
    yaml.safe_load(doctor_facts.RETURN)
    spec: dict = {}

    def spy(argument_spec, **kwargs):
        spec.update(argument_spec)
        raise SystemExit

    monkeypatch.setattr(doctor_facts, "AnsibleModule", spy)
    with pytest.raises(SystemExit):
        doctor_facts.main()
    assert set(documented) == set(spec)
    for name, option in documented.items():
        assert option["type"] == spec[name]["type"], name
        assert option.get("default") == spec[name].get("default"), name
    sub = documented["token_probes"]["suboptions"]
    assert set(sub) == set(spec["token_probes"]["options"])
    assert sub["name"]["choices"] == spec["token_probes"]["options"]["name"]["choices"]
