# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad input for the serving path: serving_state (every state) and normalise.

Every case runs the module in-process and must end in a clear refusal (``failed`` with a
message naming the offending input) or, where the module is meant to carry on, in a
reported difference; never in a traceback, never in a silent success, and never with a
file written or removed that the case protects.  The five issue-14 defects of this path
are the named tests at the end; quadlet_verify's cases are in test_bad_input_quadlet.py.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    RecipeError,
    normalise,
)
from ansible_collections.localinference.vllm.plugins.modules import serving_state
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

REV = "5eed0c0ffee0000000000000000000000000000a"
DIGEST = "sha256:" + "ab" * 32
IMAGE = "localhost/localinference-vllm-cpu@" + DIGEST
RECIPE = {
    "model": "localinference/tiny-deepseek",
    "revision": REV,
    "image": IMAGE,
    "entrypoint": "/opt/vllm/bin/vllm",
    "tensor_parallel_size": 2,
    "max_model_len": 4096,
    "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
}
NODE = {
    "host": "spark-head",
    "rank": 0,
    "nnodes": 2,
    "head_address": "10.77.0.11",
    "address": "10.77.0.11",
    "env": {"VLLM_HOST_IP": "10.77.0.11", "GLOO_SOCKET_IFNAME": "enp1s0f0np0"},
    "weights_path": f"/srv/models/hub/models--localinference--tiny-deepseek/snapshots/{REV}",
}
STATES = ("staged", "present", "verified", "absent")
INJECTION = "\n[Service]\nExecStartPre=/bin/touch /tmp/pwned"


def run(module, args, check_mode=False):
    """run_module, turning any exception into a test failure that says 'traceback'."""
    try:
        return run_module(module, args, check_mode)
    except Exception as exc:  # the point is to catch every traceback
        pytest.fail(f"traceback instead of a message: {type(exc).__name__}: {exc}")


def args_for(tmp_path, state, recipe=None, node=None, **options):
    return {
        "recipe": copy.deepcopy(RECIPE if recipe is None else recipe),
        "node": copy.deepcopy(NODE if node is None else node),
        "state": state,
        "path": str(tmp_path / "etc" / "serving.json"),
        "staging_dir": str(tmp_path / "etc" / "staging"),
        "unit_dir": str(tmp_path / "units"),
        **options,
    }


def written(tmp_path):
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())


def assert_refused(out, pattern):
    assert out.failed, f"silent success: {out.result}"
    assert re.search(pattern, out.result["msg"]), out.result["msg"]


# --- recipe values: refused before anything is rendered or written, in every state -------
# (case id, recipe change, pattern the message must match)
RECIPE_CASES = [
    ("served-name-newline", {"served_model_name": "m" + INJECTION},
     r"vllm_recipe\.served_model_name: contains '\\n' \(a line break\) at position 1"),
    ("served-name-cr", {"served_model_name": "m\rX"}, r"served_model_name: contains '\\r'"),
    ("served-name-nul", {"served_model_name": "m\x00"}, r"served_model_name: contains '\\x00'"),
    ("served-name-bidi", {"served_model_name": "m\u202etxt"},
     r"served_model_name: contains '\\u202e' \(an invisible formatting character\)"),
    ("served-name-line-separator", {"served_model_name": "m\u2028ExecStart=x"},
     r"served_model_name: contains '\\u2028'"),
    ("served-name-trailing-space", {"served_model_name": "tiny "},
     r"served_model_name: contains ' ' \(leading or trailing whitespace"),
    ("served-name-list-item", {"served_model_name": ["tiny", "b" + INJECTION]},
     r"served_model_name\[1\]: contains '\\n'"),
    ("served-name-empty-list", {"served_model_name": []}, r"served_model_name: is an empty list"),
    ("served-name-dict", {"served_model_name": {"a": 1}}, r"served_model_name: expected text, got dict"),
    ("image-newline-before-digest", {"image": "localhost/x" + INJECTION + "@" + DIGEST},
     r"vllm_recipe\.image: contains '\\n' \(a line break\) at position 11"),
    ("image-trailing-newline", {"image": IMAGE + "\n"}, r"vllm_recipe\.image: contains '\\n'"),
    ("image-tag-only", {"image": "vllm/vllm-openai:latest"}, r"vllm_recipe\.image: .*not pinned by digest"),
    ("image-short-digest", {"image": "localhost/x@sha256:" + "ab" * 31}, r"image: .*not pinned by digest"),
    ("image-space", {"image": "localhost/x y@" + DIGEST}, r"image: contains ' ' \(whitespace\)"),
    ("image-specifier", {"image": "localhost/%n@" + DIGEST}, r"image: contains '%'"),
    ("image-option", {"image": "--privileged@" + DIGEST}, r"image: .*is not an image reference"),
    ("image-missing", {"image": None}, r"image: missing: not pinned by digest"),
    ("model-traversal", {"model": "../../etc"}, r"vllm_recipe\.model: '\.\./\.\./etc' is not a Hugging Face"),
    ("model-newline", {"model": "o/m" + INJECTION}, r"vllm_recipe\.model: contains '\\n'"),
    ("model-double-dash", {"model": "o/m--x"}, r"vllm_recipe\.model: .*is not a Hugging Face repository id"),
    ("revision-trailing-newline", {"revision": REV + "\n"}, r"vllm_recipe\.revision: contains '\\n'"),
    ("revision-branch", {"revision": "main"}, r"vllm_recipe\.revision: 'main' is not a 40-hex commit"),
    ("shm-size-injection", {"shm_size": "1g\nPodmanArgs=--privileged"},
     r"vllm_recipe\.shm_size: contains '\\n' \(a line break\) at position 2"),
    ("shm-size-zero", {"shm_size": "0"}, r"shm_size: '0' is not a size"),
    ("shm-size-words", {"shm_size": "lots"}, r"shm_size: 'lots' is not a size"),
    ("cache-dir-relative", {"cache_dir": "cache"}, r"cache_dir: 'cache' is not an absolute path"),
    ("cache-dir-traversal", {"cache_dir": "/var/cache/../../etc"}, r"cache_dir: .*contains '\.\.'"),
    ("cache-dir-volume-colon", {"cache_dir": "/var/cache:/etc"}, r"cache_dir: contains ':' \(it separates"),
    ("cache-dir-newline", {"cache_dir": "/var/cache\nExecStartPre=/bin/sh"}, r"cache_dir: contains '\\n'"),
    ("cache-dir-specifier", {"cache_dir": "/var/cache/%h"}, r"cache_dir: contains '%' \(a systemd specifier"),
    ("entrypoint-newline", {"entrypoint": "vllm\nExecStartPre=/bin/sh"}, r"entrypoint: contains '\\n'"),
    ("entrypoint-option", {"entrypoint": "-c"}, r"entrypoint: '-c' reads as an option"),
    ("entrypoint-traversal", {"entrypoint": "/opt/../bin/sh"}, r"entrypoint: .*contains '\.\.'"),
    ("env-key-newline", {"env": {"A\nB": "1"}}, r"vllm_recipe\.env key 'A\\nB': contains '\\n'"),
    ("env-key-equals", {"env": {"A=B": "1"}}, r"env key 'A=B': contains '=' \(not allowed"),
    ("env-key-digit", {"env": {"1A": "1"}}, r"env key '1A': contains '1'"),
    ("env-value-newline", {"env": {"A": "1\nExecStartPre=/bin/sh"}},
     r"vllm_recipe\.env\.A: contains '\\n' \(a line break\) at position 1"),
    ("env-value-nul", {"env": {"A": "1\x00"}}, r"env\.A: contains '\\x00'"),
    ("env-value-dict", {"env": {"A": {"b": 1}}}, r"env\.A: expected text, got dict"),
    ("env-not-a-dict", {"env": ["A=1"]}, r"vllm_recipe\.env: expected a dict"),
    ("devices-newline", {"devices": ["nvidia.com/gpu=0\nPodmanArgs=--privileged"]},
     r"vllm_recipe\.devices\[0\]: contains '\\n'"),
    ("devices-space", {"devices": ["nvidia.com/gpu=0 /dev/mem"]}, r"devices\[0\]: contains ' '"),
    ("devices-not-a-list", {"devices": "nvidia.com/gpu=0"}, r"vllm_recipe\.devices: expected a list"),
    ("ulimits-newline", {"ulimits": ["nofile=1:2\nExecStartPre=/bin/sh"]}, r"ulimits\[0\]: contains '\\n'"),
    ("ulimits-unknown", {"ulimits": ["files=1"]}, r"ulimits\[0\]: 'files=1' is not a ulimit"),
    ("ulimits-soft-above-hard", {"ulimits": ["nofile=10:5"]}, r"ulimits\[0\]: .*soft limit above hard"),
    ("ulimits-continuation", {"ulimits": ["nofile=1:2\\"]}, r"ulimits\[0\]: contains '\\\\'"),
    ("podman-args-newline", {"podman_args": ["--cap-add=NET_ADMIN\n[Service]"]},
     r"vllm_recipe\.podman_args\[0\]: contains '\\n'"),
    ("extra-args-newline", {"extra_args": ["--enable-prefix-caching" + INJECTION]},
     r"vllm_recipe\.extra_args\[0\]: contains '\\n'"),
    ("extra-args-nested", {"extra_args": [["--a"]]}, r"extra_args\[0\]: expected text, got list"),
    ("extra-args-reserved", {"extra_args": ["--headless"]}, r"extra_args: --headless is set by the collection"),
    ("port-zero", {"port": 0}, r"vllm_recipe\.port: 0 is below 1"),
    ("port-too-big", {"port": 70000}, r"vllm_recipe\.port: 70000 is above 65535"),
    ("port-bool", {"port": True}, r"vllm_recipe\.port: expected an integer, got True"),
    ("ray-port-text", {"ray_port": "6379; rm -rf /"}, r"vllm_recipe\.ray_port: expected an integer"),
    ("master-port-float", {"master_port": 29501.5}, r"master_port: expected an integer, got 29501\.5"),
    ("host-injection", {"host": "0.0.0.0\n--api-key=x"}, r"vllm_recipe\.host: contains '\\n'"),
    ("host-option", {"host": "-oProxyCommand=x"}, r"vllm_recipe\.host: .*neither an IP address nor a host"),
    ("gpu-util-nan", {"gpu_memory_utilization": "nan"}, r"gpu_memory_utilization: 'nan' is not a finite number"),
    ("gpu-util-inf", {"gpu_memory_utilization": float("inf")}, r"gpu_memory_utilization: inf is not a finite"),
    ("kv-offloading-huge", {"kv_offloading_size": 10**400}, r"kv_offloading_size: .*is not a finite number"),
    ("kv-offloading-negative", {"kv_offloading_size": -1}, r"kv_offloading_size: -1 is below 0"),
    ("max-model-len-huge", {"max_model_len": 10**30}, r"max_model_len: \d+ is above"),
    ("max-num-seqs-float", {"max_num_seqs": 1.5}, r"max_num_seqs: expected an integer, got 1\.5"),
    ("option-key-newline", {"max_num_seqs\n": 4}, r"vllm_recipe\.'max_num_seqs\\n': not an option name"),
    ("option-value-newline", {"tool_call_parser": "x" + INJECTION}, r"tool_call_parser: contains '\\n'"),
    ("option-value-nan", {"scheduler_delay_factor": float("nan")},
     r"scheduler_delay_factor: nan is not a finite number"),
    ("option-value-huge-int", {"seed": 10**30}, r"vllm_recipe\.seed: \d+ is above"),
    ("speculative-config-newline", {"speculative_config": {"method": "mtp" + INJECTION}},
     r"speculative_config\.method: contains '\\n'"),
    ("speculative-config-nan", {"speculative_config": {"p": float("nan")}}, r"speculative_config\.p: nan"),
    ("speculative-config-deep", {"speculative_config": json.loads("{\"a\":" * 12 + "1" + "}" * 12)},
     r"nested deeper than 8 levels"),
    ("vllm-version-traversal", {"deploy_mode": "systemd", "vllm_version": "0.32/../../../tmp"},
     r"vllm_version: contains '/'|vllm_version: .*is not a release number"),
    ("vllm-version-newline", {"deploy_mode": "systemd", "vllm_version": "0.32.0\nExecStartPre=x"},
     r"vllm_version: contains '\\n'"),
    ("deploy-mode-unknown", {"deploy_mode": "docker"}, r"vllm_recipe\.deploy_mode: unknown mode 'docker'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("index", "change", "pattern"),
    [(i, c[1], c[2]) for i, c in enumerate(RECIPE_CASES)],
    ids=[c[0] for c in RECIPE_CASES],
)
def test_recipe_refused_by_serving_state(tmp_path, index, change, pattern):
    state = STATES[index % len(STATES)]  # every state validates the recipe first
    out = run(serving_state, args_for(tmp_path, state, recipe={**RECIPE, **change}))
    assert_refused(out, pattern)
    assert written(tmp_path) == [], "a refused recipe must write nothing"


# Values a playbook cannot even pass (no JSON form) still get a message from normalise.
NORMALISE_ONLY = [
    ("option-value-object", {"seed": object()}, r"vllm_recipe\.seed: unsupported value <object"),
    ("option-key-int", {1: 2}, r"vllm_recipe\.1: not an option name"),
    ("env-value-set", {"env": {"A": {1}}}, r"vllm_recipe\.env\.A: expected text, got set"),
    ("recipe-not-a-dict", None, r"^vllm_recipe: expected a dict of vLLM options"),
]


@pytest.mark.parametrize(
    ("change", "pattern"),
    [c[1:] for c in RECIPE_CASES + NORMALISE_ONLY],
    ids=[c[0] for c in RECIPE_CASES + NORMALISE_ONLY],
)
def test_recipe_refused_by_normalise(change, pattern):
    with pytest.raises(RecipeError) as caught:
        normalise(["not", "a", "dict"] if change is None else {**RECIPE, **change})
    assert re.search(pattern, str(caught.value)), str(caught.value)


# --- node description and module options ---------------------------------------------
NODE_CASES = [
    ("host-newline", {"host": "spark" + INJECTION}, r"node\.host: contains '\\n'"),
    ("host-option", {"host": "-spark"}, r"node\.host: .*neither an IP address nor a host name"),
    ("head-address-newline", {"head_address": "10.77.0.11" + INJECTION}, r"node\.head_address: contains '\\n'"),
    ("head-address-empty", {"head_address": ""}, r"node\.head_address: is empty"),
    ("head-address-leading-zero", {"head_address": "10.077.0.11"}, r"node\.head_address: .*neither an IP"),
    ("address-space", {"address": "10.77.0.12 10.77.0.13"}, r"node\.address: .*' ' at position 10"),
    ("weights-relative", {"weights_path": "models/x"}, r"node\.weights_path: 'models/x' is not an absolute"),
    ("weights-traversal", {"weights_path": "/srv/models/../../etc"}, r"node\.weights_path: .*contains '\.\.'"),
    ("weights-volume-colon", {"weights_path": "/srv/m:/etc:rw"}, r"node\.weights_path: contains ':'"),
    ("weights-newline", {"weights_path": "/srv/m" + INJECTION}, r"node\.weights_path: contains '\\n'"),
    ("env-key-space", {"env": {"A B": "1"}}, r"node\.env key 'A B': contains ' '"),
    ("env-value-newline", {"env": {"NCCL_SOCKET_IFNAME": "eth0" + INJECTION}},
     r"node\.env\.NCCL_SOCKET_IFNAME: contains '\\n'"),
    ("env-value-list", {"env": {"A": [1]}}, r"node\.env\.A: expected text, got list"),
    ("nnodes-zero", {"nnodes": 0, "rank": 0}, r"node\.nnodes: 0 is below 1"),
    ("nnodes-huge", {"nnodes": 10**6}, r"node\.nnodes: 1000000 is above 1024"),
    ("rank-negative", {"rank": -1}, r"node\.rank: -1 is below 0"),
    ("rank-outside", {"rank": 2}, r"node\.rank 2 is outside 0\.\.1"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("index", "change", "pattern"),
    [(i, c[1], c[2]) for i, c in enumerate(NODE_CASES)],
    ids=[c[0] for c in NODE_CASES],
)
def test_node_refused(tmp_path, index, change, pattern):
    state = STATES[index % len(STATES)]
    out = run(serving_state, args_for(tmp_path, state, node={**NODE, **change}))
    assert_refused(out, pattern)
    assert written(tmp_path) == []


def _help_dir(tmp_path):
    (tmp_path / "help").mkdir()
    return str(tmp_path / "help")


def _help_binary(tmp_path):
    (tmp_path / "help.txt").write_bytes(b"\xff\xfe\x00garbage")
    return str(tmp_path / "help.txt")


OPTION_CASES = [
    ("unit-dir-relative", {"unit_dir": "units"}, r"unit_dir: 'units' is not an absolute path"),
    ("unit-dir-traversal", {"unit_dir": "/etc/containers/../../tmp"}, r"unit_dir: .*contains '\.\.'"),
    ("venv-dir-newline", {"venv_dir": "/opt/v" + INJECTION}, r"venv_dir: contains '\\n'"),
    ("path-relative", {"path": "serving.json"}, r"path: 'serving\.json' is not an absolute path"),
    ("staging-dir-nul", {"staging_dir": "/etc/x\x00"}, r"staging_dir: contains '\\x00'"),
    ("help-text-missing", {"help_text": "/nonexistent/help.txt"}, r"help_text /nonexistent/help\.txt does not exist"),
    ("help-text-directory", {"help_text": _help_dir}, r"help_text: .*/help is a directory, not a file"),
    ("help-text-binary", {"help_text": _help_binary}, r"help_text: .*help\.txt is not UTF-8 text \(byte 0\)"),
    ("plan-zero", {"plan_max_model_len": 0, "recipe": {**RECIPE, "max_model_len": "plan"}},
     r"plan_max_model_len: 0 is below 1"),
    ("plan-missing", {"recipe": {**RECIPE, "max_model_len": "plan"}},
     r"max_model_len: is 'plan' but no plan result"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "pattern"), [c[1:] for c in OPTION_CASES], ids=[c[0] for c in OPTION_CASES]
)
def test_option_refused(tmp_path, change, pattern):
    change = {k: v(tmp_path) if callable(v) else v for k, v in change.items()}
    before = written(tmp_path)
    out = run(serving_state, {**args_for(tmp_path, "staged"), **change})
    assert_refused(out, pattern)
    assert written(tmp_path) == before


# --- node-side state: serving.json is never trusted --------------------------------------
def _doc(tmp_path, **change):
    """A well-formed document (as present writes it) with ``change`` applied."""
    unit = str(tmp_path / "units" / "localinference-vllm.container")
    document = {
        "schema": 1,
        "recipe_hash": "a" * 64,
        "recipe": {"model": "o/m"},
        "node": {"host": "spark-head"},
        "server_argv": ["serve", "/models"],
        "ray_argv": None,
        "environment": {"A": "1"},
        "start_order": ["localinference-vllm.service"],
        "units": [{"name": "localinference-vllm.container", "path": unit, "sha256": "b" * 64}],
    }
    document.update(change)
    return json.dumps(document)


def _unit(tmp_path, name="localinference-vllm.container", path=None, sha256="b" * 64):
    """A document with one unit record; ``sha256=None`` leaves the checksum out."""
    record = {"name": name, "path": path or str(tmp_path / "units" / name)}
    if sha256:
        record["sha256"] = sha256
    return _doc(tmp_path, units=[record])


def _fifo(path):
    os.mkfifo(path)


# (case id, serving.json content (text, bytes, callable(tmp_path)->text, or "dir"/"fifo"),
#  pattern that must appear in the differences)
STATE_CASES = [
    ("list", "[1, 2]", r"serving\.json: expected a JSON object written by the collection, found a list"),
    ("string", '"x"', r"found a string"),
    ("null", "null", r"found null"),
    ("invalid-json", "{", r"serving\.json: not valid JSON"),
    ("binary", b"\xff\xfe\x00\x01", r"serving\.json\b.* is not UTF-8 text \(byte 0\)"),
    ("deep-nesting", "[" * 200000 + "]" * 200000, r"nested too deeply|not valid JSON"),
    ("huge-number", "1" * 5000, r"serving\.json: not valid JSON|found a"),
    ("too-large", "dir:big", r"more than 4194304"),
    ("directory", "dir", r"serving\.json: .*serving\.json is a directory, not a file"),
    ("fifo", "fifo", r"serving\.json is not a regular file"),
    ("schema-2", lambda t: _doc(t, schema=2), r"serving\.json: schema: is 2, expected 1"),
    ("hash-not-hex", lambda t: _doc(t, recipe_hash="../x"), r"recipe_hash: a string where 64 hex"),
    ("recipe-list", lambda t: _doc(t, recipe=[]), r"serving\.json: recipe: a list where an object"),
    ("argv-not-strings", lambda t: _doc(t, server_argv=[1]), r"server_argv: a list where a list of strings"),
    ("environment-nested", lambda t: _doc(t, environment={"A": {}}), r"environment: an object where"),
    ("start-order-foreign", lambda t: _doc(t, start_order=["sshd.service"]),
     r"start_order: 'sshd\.service' is not a service of this collection"),
    ("units-dict", lambda t: _doc(t, units={"localinference-vllm.container": {}}),
     r"units: an object where a list of unit records"),
    ("unit-string", lambda t: _doc(t, units=["/etc/passwd"]), r"units\[0\]: a string where an object"),
    ("unit-foreign-name", lambda t: _unit(t, "sshd.service", "/etc/systemd/system/sshd.service"),
     r"units\[0\]\.name: \"sshd\.service\" is not a unit this collection writes"),
    ("unit-path-outside", lambda t: _unit(t, path=str(t / "victim")),
     r"units\[0\]\.path: .*victim\" is not localinference-vllm\.container in the collection's unit"),
    ("unit-path-traversal", lambda t: _unit(t, path=str(t / "units" / ".." / "victim")),
     r"units\[0\]\.path: .*is not localinference-vllm\.container"),
    ("unit-without-sha256", lambda t: _unit(t, sha256=None),
     r"units\[0\]\.sha256: missing or not 64 hex digits"),
]  # fmt: skip


def _write_state(tmp_path, content):
    path = tmp_path / "etc" / "serving.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if content == "dir":
        path.mkdir()
    elif content == "dir:big":
        path.write_text(" " * (4 * 1024 * 1024 + 1))
    elif content == "fifo":
        _fifo(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content(tmp_path) if callable(content) else content)
    victim = tmp_path / "victim"
    victim.write_text("not the collection's")
    return victim


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize(
    ("content", "pattern"), [c[1:] for c in STATE_CASES], ids=[c[0] for c in STATE_CASES]
)
def test_untrusted_state_document(tmp_path, state, content, pattern):
    victim = _write_state(tmp_path, content)
    out = run(serving_state, args_for(tmp_path, state))
    result = out.result
    assert any(re.search(pattern, line) for line in result["differences"]), result["differences"]
    assert result["live_matches"] is False
    assert any(f["id"] == "F10" and f["severity"] == "error" for f in result["live_findings"])
    assert victim.read_text() == "not the collection's", "a file outside the unit dir was touched"
    assert all(name in {"localinference-vllm.service"} for name in result["live_start_order"])
    if content == "dir":
        assert_refused(out, r"^path: .*serving\.json is a directory where a file belongs")
    elif state == "verified":
        assert_refused(out, r"differs from the inventory \(F10\).*" + pattern)
    else:
        assert not out.failed, result.get("msg")
        if state == "present":  # the rollout recovers: the document is rewritten ...
            assert json.loads((tmp_path / "etc" / "serving.json").read_text())["schema"] == 1
            # ... and a malformed one never becomes the rollback target
            assert not (tmp_path / "etc" / "serving.previous.json").exists()


# --- the five issue-14 defects of the serving path, by name ---------------------------
def test_defect_unit_file_injection_via_served_model_name(tmp_path):
    """A served model name ending in a newline and [Service] ExecStartPre= is refused."""
    for state in STATES:
        out = run(
            serving_state,
            args_for(tmp_path, state, recipe={**RECIPE, "served_model_name": "tiny" + INJECTION}),
        )
        assert_refused(
            out, r"^vllm_recipe\.served_model_name: contains '\\n' \(a line break\) at position 4"
        )
        assert "remove it" in out.result["msg"]
    assert written(tmp_path) == []
    assert not Path("/tmp/pwned").exists()


def test_defect_image_with_newline_does_not_pass_the_digest_check(tmp_path):
    for image in (
        "localhost/evil\nPodmanArgs=--privileged\nImage=localhost/x@" + DIGEST,
        IMAGE + "\n",
    ):
        out = run(serving_state, args_for(tmp_path, "staged", recipe={**RECIPE, "image": image}))
        assert_refused(out, r"^vllm_recipe\.image: contains '\\n' \(a line break\) at position \d+")
        with pytest.raises(RecipeError, match=r"vllm_recipe\.image: contains '\\n'"):
            normalise({**RECIPE, "image": image})
    assert written(tmp_path) == []


def test_defect_serving_json_cannot_make_absent_delete_outside_the_unit_dir(tmp_path):
    victims = [tmp_path / "victim", tmp_path / "etc-passwd"]
    for victim in victims:
        victim.write_text("precious")
    units = tmp_path / "units"
    units.mkdir()
    own = units / "localinference-vllm.container"
    own.write_text("ours")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "localinference-ray.container").write_text("precious")
    records = [
        {"name": "localinference-vllm.container", "path": str(victims[0]), "sha256": "b" * 64},
        {"name": "passwd", "path": str(victims[1]), "sha256": "b" * 64},
        {"name": "localinference-vllm.container", "path": f"{units}/../victim", "sha256": "b" * 64},
        {
            "name": "localinference-ray.container",
            "path": str(outside / "localinference-ray.container"),
            "sha256": "b" * 64,
        },
        {"name": "localinference-vllm.container", "path": str(own), "sha256": "b" * 64},
    ]
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "serving.json").write_text(_doc(tmp_path, units=records))
    out = run(serving_state, args_for(tmp_path, "absent"))
    assert not out.failed, out.result
    assert out.result["changed"] is True
    assert not own.exists(), "the collection's own unit in its unit directory is removed"
    for victim in [*victims, outside / "localinference-ray.container"]:
        assert victim.read_text() == "precious", victim
    messages = " ".join(f["message"] for f in out.result["live_findings"])
    assert f"{victims[0]}\" is not localinference-vllm.container in the collection's" in messages
    assert 'units[1].name: "passwd" is not a unit this collection writes' in messages


def test_defect_serving_json_that_is_a_list(tmp_path):
    _write_state(tmp_path, "[]")
    out = run(serving_state, args_for(tmp_path, "verified"))
    assert_refused(out, r"\(F10\).*serving\.json: expected a JSON object .*found a list")
    staged = run(serving_state, args_for(tmp_path, "staged"))
    assert not staged.failed and staged.result["live_matches"] is False
    assert staged.result["live_hash"] is None and staged.result["live_start_order"] == []


def test_defect_unit_without_sha256(tmp_path):
    present = run(serving_state, args_for(tmp_path, "present"))
    assert not present.failed, present.result
    state = tmp_path / "etc" / "serving.json"
    document = json.loads(state.read_text())
    del document["units"][0]["sha256"]
    state.write_text(json.dumps(document))
    out = run(serving_state, args_for(tmp_path, "verified"))
    assert_refused(out, r"\(F10\).*serving\.json: units\[0\]\.sha256: missing or not 64 hex")
    # the unit is still the collection's own: absent removes it, present repairs the record
    assert run(serving_state, args_for(tmp_path, "present")).result["changed"] is True
    assert run(serving_state, args_for(tmp_path, "verified")).failed is False


@pytest.mark.parametrize("check_mode", [False, True])
@pytest.mark.parametrize("state", STATES)
def test_defect_state_path_is_a_directory(tmp_path, state, check_mode):
    """Issue 39: staged wrote the staging place and reported changed; every state refuses now."""
    _write_state(tmp_path, "dir")
    out = run(serving_state, args_for(tmp_path, state), check_mode)
    assert_refused(
        out,
        r"^path: .*/etc/serving\.json is a directory where a file belongs; remove it or choose "
        r"another path$",
    )
    assert out.result["changed"] is False
    assert "is a directory" in out.result["differences"][0]  # still said why it differs
    assert written(tmp_path) == ["victim"], "nothing may be written beside a refused path"


def test_a_directory_where_the_staged_document_goes_is_refused(tmp_path):
    (tmp_path / "etc" / "staging" / "serving.json").mkdir(parents=True)
    out = run(serving_state, args_for(tmp_path, "staged"))
    assert_refused(out, r"^staging_dir: .*/staging/serving\.json is a directory where a file belongs")
    assert written(tmp_path) == []


def test_absent_never_follows_a_symlinked_unit(tmp_path):
    present = run(serving_state, args_for(tmp_path, "present"))
    assert not present.failed
    unit = tmp_path / "units" / "localinference-vllm.container"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    unit.unlink()
    unit.symlink_to(victim)
    out = run(serving_state, args_for(tmp_path, "absent"))
    assert not out.failed and out.result["changed"] is True
    assert not unit.is_symlink() and victim.read_text() == "precious"


def test_absent_leaves_a_directory_in_place_of_a_unit(tmp_path):
    assert not run(serving_state, args_for(tmp_path, "present")).failed
    unit = tmp_path / "units" / "localinference-vllm.container"
    unit.unlink()
    unit.mkdir()
    (unit / "keep").write_text("x")
    out = run(serving_state, args_for(tmp_path, "absent"))
    assert not out.failed and out.result["changed"] is False
    assert (unit / "keep").exists()
    warnings = [f for f in out.result["live_findings"] if f["severity"] == "warning"]
    assert any("is a directory, not a unit file" in f["message"] for f in warnings)
    verified = run(serving_state, args_for(tmp_path, "verified"))
    assert_refused(verified, r"localinference-vllm\.container is a directory, not a file")


def test_corrupt_previous_document_is_reported_not_trusted(tmp_path):
    assert not run(serving_state, args_for(tmp_path, "present")).failed
    (tmp_path / "etc" / "serving.previous.json").write_text('{"recipe": "x"')
    out = run(serving_state, args_for(tmp_path, "staged"))
    assert not out.failed
    assert out.result["previous_recipe"] is None and out.result["previous_hash"] is None
    assert any(
        f["severity"] == "warning" and f["message"].startswith("serving.previous.json: not valid")
        for f in out.result["live_findings"]
    )


def test_staging_keeps_foreign_files_and_says_so(tmp_path):
    foreign = tmp_path / "etc" / "staging" / "units" / "other.container"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("not ours")
    out = run(serving_state, args_for(tmp_path, "staged"))
    assert not out.failed
    assert foreign.read_text() == "not ours"
    assert any("other.container: not a unit this collection writes" in f["message"]
               for f in out.result["live_findings"])  # fmt: skip


def test_node_side_values_are_printed_on_one_line(tmp_path):
    """A key or value from the node's document cannot break the message into new lines."""
    assert not run(serving_state, args_for(tmp_path, "present")).failed
    state = tmp_path / "etc" / "serving.json"
    document = json.loads(state.read_text())
    document["recipe"]["x\n[Service]"] = "y\nExecStartPre=/bin/sh"
    state.write_text(json.dumps(document))
    out = run(serving_state, args_for(tmp_path, "verified"))
    assert_refused(out, r"'recipe\.x\\n\[Service\]': node has \"y\\nExecStartPre=/bin/sh\"")
    assert "\n" not in out.result["msg"]
