# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The site's one call per node (playbooks/site_converged.yml): stage_result state=converged
with reverify_weights and stream re-verifies the node's weights against the manifest its record
names and streams one first token per recorded route, in the same module run as the compare.

Everything here is real: the manifest is written by model_manifest mode=create over files on
disk, the token comes from a local HTTP server speaking vLLM's stream format
(test_serving_ready's), and a route nothing listens on is refused by the kernel.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
from ansible_collections.localinference.vllm.plugins.modules import model_manifest, stage_result

from tests.unit.module_helper import run_module
from tests.unit.plugins.modules.test_serving_ready import Handler, server  # noqa: F401


@pytest.fixture
def node(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text('{"model_type": "deepseek_v3"}\n')
    (weights / "pytorch_model.bin").write_bytes(b"\0" * 4096)
    made = run_module(model_manifest, {"path": str(weights), "mode": "create",
                                       "manifest": str(tmp_path / "manifest.json")})
    assert not made.failed and made.result["ok"], made.result
    return tmp_path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def record(node, routes=None, **result):
    """A whole run's record: the weights to re-verify and the routes to stream (plain HTTP)."""
    body = {
        "reverify": {"path": str(node / "weights"), "manifest": str(node / "manifest.json"), "workers": 1},
        "routes": routes if routes is not None else [{"prefix": "/tiny", "model": "tiny"}],
        "tls": {"mode": "off"},
        **result,
    }
    out = run_module(stage_result, {"stage": "site", "state": "present", "path": str(node / "site.json"),
                                    "fingerprint": "run-1", "watch_recorded": True, "result": body})
    assert not out.failed, out.result


def check(node, port=None, **extra):
    args = {"stage": "site", "state": "converged", "path": str(node / "site.json"), "fingerprint": "run-1",
            "watch_recorded": True, "required_keys": ["reverify", "routes"], "reverify_weights": True, **extra}
    if port is not None:
        args["stream"] = {"port": port, "api_key": "k" * 48, "timeout": 5}
    return run_module(stage_result, args)


def test_one_call_holds_reverifies_and_streams(node, server):  # noqa: F811
    record(node)
    out = check(node, port=server.server_address[1])
    assert not out.failed, out.result
    assert out.result["converged"] and out.result["reason"] is None, out.result["reason"]
    assert out.result["weights_restored"] == [] and not out.result["changed"]
    assert [s["model"] for s in out.result["streamed"]] == ["tiny"]
    assert out.result["streamed"][0]["ttft_s"] >= 0


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda w: (w / "pytorch_model.bin").write_bytes(b"\1" * 4096),
         "its weights do not match their manifest: 1 file(s), the first pytorch_model.bin"),
        (lambda w: (w / "pytorch_model.bin").write_bytes(b"\0" * 10),
         "its weights do not match their manifest: 1 file(s), the first pytorch_model.bin"),
        (lambda w: (w / "config.json").unlink(), "its weights do not match their manifest"),
        (lambda w: (w / "stray.bin").write_bytes(b"x"),
         "its weights hold 1 file(s) their manifest does not list, the first stray.bin"),
        (lambda w: (w.parent / "manifest.json").write_text("{}"), "its weights cannot be re-verified"),
    ],
)
def test_weights_that_do_not_hold_are_the_reason_and_nothing_is_streamed(node, damage, reason):
    record(node)
    damage(node / "weights")
    # Nothing listens on the port: had the call streamed, its reason would name the ingress.
    out = check(node, port=free_port())
    assert not out.failed, out.result
    assert not out.result["converged"] and out.result["reason"].startswith(reason), out.result["reason"]
    assert "streamed" not in out.result


def test_a_modification_time_off_with_the_content_right_is_restored_and_holds(node, server):  # noqa: F811
    record(node)
    target = node / "weights" / "pytorch_model.bin"
    recorded = json.loads((node / "manifest.json").read_text())
    mtime_ns = next(f["mtime_ns"] for f in recorded["files"] if f["path"] == "pytorch_model.bin")
    os.utime(target, ns=(mtime_ns + 5 * 10**9, mtime_ns + 5 * 10**9))
    out = check(node, port=server.server_address[1])
    assert out.result["converged"] and out.result["changed"]
    assert out.result["weights_restored"] == ["pytorch_model.bin"]
    assert target.stat().st_mtime_ns == mtime_ns
    assert not check(node, port=server.server_address[1]).result["changed"], "a second call restores nothing"


def test_a_route_that_does_not_stream_is_the_reason(node):
    record(node)
    out = check(node, port=free_port())
    assert not out.result["converged"]
    assert out.result["reason"].startswith("the endpoint did not stream a token through the ingress: tiny: ")


def test_a_worker_reverifies_without_streaming(node):
    record(node)
    out = check(node)
    assert out.result["converged"] and "streamed" not in out.result


@pytest.mark.parametrize(
    ("result", "field"),
    [
        ({"routes": [{"prefix": "/tiny\nExecStart=/bin/sh", "model": "tiny"}]}, "result.routes[0]"),
        ({"routes": [{"prefix": "tiny", "model": "tiny"}]}, "result.routes[0]"),
        ({"routes": [{"prefix": "/tiny", "model": ""}]}, "result.routes[0]"),
        ({"routes": []}, "result.routes"),
        ({"tls": {"mode": "internal", "ca_file": "relative/ca.crt"}}, "result.tls.ca_file"),
        ({"tls": "on"}, "result.tls"),
    ],
)
def test_a_record_whose_routes_cannot_be_trusted_is_the_reason(node, result, field):
    routes = result.pop("routes", None)
    record(node, routes=routes, **result)
    out = check(node, port=free_port())
    assert not out.result["converged"]
    assert out.result["reason"].startswith(f"its record cannot be streamed from: {field}"), out.result["reason"]


@pytest.mark.parametrize(
    "reverify",
    [
        {"path": "weights", "manifest": "/m.json", "workers": 1},
        {"path": "/w", "manifest": "/m.json", "workers": -1},
        {"path": "/w", "manifest": "/m.json"},
        "/w",
    ],
)
def test_a_record_whose_reverify_cannot_be_trusted_is_the_reason(node, reverify):
    record(node, reverify=reverify)
    out = check(node)
    assert not out.result["converged"]
    assert out.result["reason"].startswith("its weights cannot be re-verified: result.reverify"), out.result["reason"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"state": "present", "result": {}, "reverify_weights": True}, "are for state=converged"),
        ({"state": "read", "stream": {"port": 8443}}, "are for state=converged"),
        ({"state": "converged", "stream": {"port": 0}}, "stream.port"),
        ({"state": "converged", "stream": {"port": 8443, "timeout": float("nan")}}, "stream.timeout"),
    ],
)
def test_bad_input_is_refused_before_anything_is_read_or_restored(node, args, message):
    call = {"stage": "site", "path": str(node / "site.json"), "fingerprint": "run-1", "watch_recorded": True, **args}
    out = run_module(stage_result, call)
    assert out.failed and message in out.result["msg"], "refused whether or not a record holds"
    record(node)
    out = run_module(stage_result, call)
    assert out.failed and message in out.result["msg"], out.result


def test_the_key_is_never_returned(node, server):  # noqa: F811
    record(node)
    out = check(node, port=server.server_address[1])
    assert "k" * 48 not in json.dumps(out.result)
