# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One node's stack record (module_utils/upgrade/_stack_facts.py): parsers and the order of sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import recipe_hash
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade import (
    _stack_facts as facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade._stack_lock import (
    node_problems,
)

ROOT = Path(__file__).resolve().parents[5]
LOGS = ROOT / "tests" / "unit" / "fixtures" / "vllm-logs"
IMAGE = "localhost/localinference-vllm-cpu@sha256:" + "6f" * 32

IMAGE_DIGESTS = [
    (IMAGE, "sha256:" + "6f" * 32),
    ("nvcr.io/nvidia/vllm:25.09-py3@sha256:" + "a" * 64, "sha256:" + "a" * 64),
    ("vllm/vllm-openai:latest", None),
    ("x@sha256:short", None),
    (None, None),
]


@pytest.mark.parametrize(("reference", "digest"), IMAGE_DIGESTS)
def test_image_digest(reference, digest):
    assert facts.image_digest(reference) == digest


VERSIONS = [
    ("0.32.0", "0.32.0"),
    ("v0.11.1", "0.11.1"),
    ("0.11.1rc2.dev31+g1234abc", "0.11.1rc2.dev31+g1234abc"),
    ("0.11.1.dev31+g1234abc", "0.11.1.dev31+g1234abc"),
    ("INFO 11-29 noise", None),
    ("", None),
    (None, None),
]


@pytest.mark.parametrize(("text", "version"), VERSIONS)
def test_normalise_version(text, version):
    assert facts.normalise_version(text) == version


NCCL_SPELLINGS = [
    ("2.21.5", "2.21.5"),
    ("2.21.5-1", "2.21.5"),
    ("2.21.5-1+cuda12.4", "2.21.5"),
    ("2.27.3+cuda12.9", "2.27.3"),
    ("unknown", None),
    (None, None),
]


@pytest.mark.parametrize(("text", "version"), NCCL_SPELLINGS)
def test_normalise_nccl(text, version):
    assert facts.normalise_nccl(text) == version


def test_version_from_vllm_version_output_skips_warnings():
    output = "INFO 11-29 11:21:17 [__init__.py:216] Automatically detected platform cpu.\n0.32.0\n"
    assert facts.version_from_output(output) == "0.32.0"
    assert facts.version_from_output("Traceback (most recent call last):\n") is None


LOG_NCCL = [
    ("(EngineCore pid=1) INFO 11-29 [pynccl.py:70] vLLM is using nccl==2.27.3\n", "2.27.3"),
    ("spark-head:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n", "2.21.5"),
    ("vLLM is using nccl==2.21.5\nvLLM is using nccl==2.27.3\n", "2.27.3"),
    ("no nccl here\n", None),
]


@pytest.mark.parametrize(("log", "version"), LOG_NCCL)
def test_nccl_from_log(log, version):
    assert facts.nccl_from_log(log) == version


def test_the_recorded_cpu_logs_have_no_nccl():
    for name in (
        "real-cpu-tp2-mp-head-kv1g-len4096.log",
        "real-cpu-tp2-mp-worker-kv1g-len4096.log",
    ):
        assert facts.nccl_from_log((LOGS / name).read_text()) is None


def test_image_inspect():
    text = json.dumps(
        [
            {
                "Id": "0b" * 32,
                "Digest": "sha256:" + "6f" * 32,
                "Config": {"Env": ["PATH=/usr/bin", "NCCL_VERSION=2.21.5-1", "junk"]},
            }
        ]
    )
    parsed = facts.parse_image_inspect(text)
    assert parsed == {
        "id": "0b" * 32,
        "digest": "sha256:" + "6f" * 32,
        "env": {"PATH": "/usr/bin", "NCCL_VERSION": "2.21.5-1"},
    }
    assert facts.nccl_from_env(parsed["env"]) == "2.21.5"
    assert facts.nccl_from_env({"NV_LIBNCCL_PACKAGE_VERSION": "2.23.4-1"}) == "2.23.4"


@pytest.mark.parametrize("text", ["", "[]", "[1, 2]", '"x"', "[{}, {}]"])
def test_image_inspect_garbage_is_an_error(text):
    with pytest.raises(facts.StackFactsError):
        facts.parse_image_inspect(text)


def test_image_inspect_odd_values_are_null():
    parsed = facts.parse_image_inspect('[{"Id": "../x", "Digest": 5, "Config": null}]')
    assert parsed == {"id": None, "digest": None, "env": {}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4f1a2b3c4d5e6f708192a3b4c5d6e7f8\n", "4f1a2b3c4d5e6f708192a3b4c5d6e7f8"),
        ("\n", None),
        ("x; rm", None),
    ],
)
def test_invocation_id(text, expected):
    assert facts.invocation_id(text) == expected


def test_dist_info_versions():
    names = [
        "vllm-0.32.0.dist-info",
        "nvidia_nccl_cu12-2.27.3.dist-info",
        "torch-2.9.0.dist-info",
        "vllm",
    ]
    assert facts.dist_info_version(names, "vllm") == "0.32.0"
    assert facts.dist_info_version(names, "nvidia_nccl_cu*") == "2.27.3"
    assert facts.dist_info_version(names, "ray") is None


DEVICES = [
    ({}, [], []),
    (
        {"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "GLOO_SOCKET_IFNAME": "enp1s0f0np0"},
        ["enp1s0f0np0"],
        [],
    ),
    ({"NCCL_SOCKET_IFNAME": "^lo,docker0"}, [], []),
    ({"NCCL_SOCKET_IFNAME": "=enp1s0f0np0,enP2p1s0f0np0"}, ["enP2p1s0f0np0", "enp1s0f0np0"], []),
    ({"UCX_NET_DEVICES": "rocep1s0f0:1,enp1s0f0np0"}, ["enp1s0f0np0"], ["rocep1s0f0"]),
    ({"NCCL_IB_HCA": "=rocep1s0f0:1,roceP2p1s0f0:1"}, [], ["roceP2p1s0f0", "rocep1s0f0"]),
    ({"NCCL_IB_HCA": "^mlx5_2"}, [], []),
    ({"NCCL_SOCKET_IFNAME": "../../etc", "UCX_NET_DEVICES": "all"}, [], []),
    # a single host's ranks on loopback (the fabric stage's single-host env): no NIC to read
    ({"VLLM_HOST_IP": "127.0.0.1", "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}, [], []),
]


@pytest.mark.parametrize(("env", "interfaces", "hcas"), DEVICES)
def test_cluster_devices(env, interfaces, hcas):
    assert facts.cluster_devices(env) == (interfaces, hcas)


def test_manifest_digest_ignores_mtimes_and_order():
    files = [
        {"path": "b.safetensors", "size": 2, "mtime_ns": 1, "sha256": "b" * 64},
        {"path": "a.json", "size": 1, "mtime_ns": 2, "sha256": "a" * 64},
    ]
    moved = [{**f, "mtime_ns": 99} for f in reversed(files)]
    assert facts.manifest_digest({"files": files}) == facts.manifest_digest({"files": moved})
    changed = [{**files[0], "sha256": "c" * 64}, files[1]]
    assert facts.manifest_digest({"files": files}) != facts.manifest_digest({"files": changed})


# --------------------------------------------------------------------------- the order of sources

RECIPE = {
    "model": "m/x",
    "revision": "1" * 40,
    "deploy_mode": "quadlet",
    "image": IMAGE,
    "max_num_seqs": 4,
}
FACTS = {
    "image_id": "0b" * 32,
    "kernel": "6.8.0",
    "driver_version": "580.173.02",
    "cuda_version": "13.0",
    "gpus": ["NVIDIA GB10"],
    "nics": {"enp1s0f0np0": None},
    "hcas": {},
    "manifest_digest": "2c" * 32,
}


def record(fresh=None, fallback=None, previous=None, recipe=None):
    recipe = recipe or RECIPE
    return facts.node_record(
        rank=0,
        recipe=recipe,
        recipe_hash=recipe_hash(recipe),
        facts=FACTS,
        fresh=fresh or {},
        fallback=fallback or {},
        previous=previous,
    )


SOURCES = [
    # name, fresh, previous versions (None: no previous), fallback, expected (vllm, source), (nccl, source)
    (
        "the boot log first",
        {"vllm_version": [("boot log", "0.32.0")]},
        ("0.31.0", "2.1.1"),
        {"vllm_version": [("image", "0.30.0")]},
        ("0.32.0", "boot log"),
        ("2.1.1", "last good stack"),
    ),
    (
        "then the same image's last value",
        {"vllm_version": [("boot log", None)]},
        ("0.31.0", None),
        {"vllm_version": [("venv", "0.30.0")], "nccl_version": [("image env", "2.21.5-1")]},
        ("0.31.0", "last good stack"),
        ("2.21.5", "image env"),
    ),
    (
        "then the fallback, normalised",
        {},
        None,
        {"vllm_version": [("venv", "v0.30.0")], "nccl_version": [("image env", "2.21.5-1")]},
        ("0.30.0", "venv"),
        ("2.21.5", "image env"),
    ),
    ("nothing known", {}, None, {}, (None, None), (None, None)),
]


@pytest.mark.parametrize(
    ("name", "fresh", "previous", "fallback", "vllm", "nccl"), SOURCES, ids=[s[0] for s in SOURCES]
)
def test_sources_in_order(name, fresh, previous, fallback, vllm, nccl):
    prev = None
    if previous is not None:
        prev, _, _ = record()
        prev["vllm_version"], prev["nccl_version"] = previous
    built, sources, warnings = record(fresh, fallback, prev)
    assert (built["vllm_version"], sources["vllm_version"]) == vllm
    assert (built["nccl_version"], sources["nccl_version"]) == nccl
    assert warnings == [] and node_problems(built) == []


def test_another_image_does_not_inherit():
    prev, _, _ = record()
    prev["vllm_version"] = "0.31.0"
    other = {**RECIPE, "image": "localhost/other@sha256:" + "c" * 64}
    built, sources, _ = record(previous=prev, recipe=other)
    assert built["vllm_version"] is None and sources["vllm_version"] is None
    assert built["image_digest"] == "sha256:" + "c" * 64


def test_a_malformed_previous_record_is_not_reused():
    built, _, warnings = record(previous={"rank": "zero", "vllm_version": "0.1.0"})
    assert built["vllm_version"] is None
    assert warnings and "malformed" in warnings[0]


def test_systemd_mode_has_no_image():
    recipe = {
        "model": "m/x",
        "revision": "1" * 40,
        "deploy_mode": "systemd",
        "vllm_version": "0.32.0",
    }
    built, _, _ = record(recipe=recipe, fallback={"vllm_version": [("venv", "0.32.0")]})
    assert built["image"] is None and built["image_digest"] is None and built["image_id"] is None
    assert built["vllm_version"] == "0.32.0" and node_problems(built) == []
