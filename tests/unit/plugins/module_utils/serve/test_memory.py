# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's memory need and the guards derived from it (module_utils/serve/_memory.py, F4, F13).

Case tables: recipe and node facts -> the need's parts; the role's knobs -> the refusal that
names the role variable; a journal -> the guards' refusal lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _memory as sm

GIB = 1024**3
MIB = 1024**2
UNIFIED = sm.Policy(unified_memory=True)
DISCRETE = sm.Policy(unified_memory=False)
# GB10: about 119.7 GiB of MemTotal (seed 000 §1).
GB10_TOTAL = 125_520_000 * 1024

NEEDS = [
    {
        "id": "lab: TP 2 over 2 CPU hosts, 32 MiB KV pinned, tiny weights",
        "recipe": {"tensor_parallel_size": 2, "kv_cache_memory_bytes": 32 * MIB},
        "nnodes": 2,
        "policy": UNIFIED,
        "weights": 2 * MIB,
        "expect": {"workers": 1, "weights_bytes": MIB, "kv_bytes": 32 * MIB, "engine_bytes": 0,
                   "overhead_bytes": 4 * GIB, "offload_bytes": 0,
                   "need_bytes": MIB + 32 * MIB + 4 * GIB},
        "basis": "1/2 of 0.00 GiB of weights, 1 x 0.03 GiB of KV (kv_cache_memory_bytes)",
    },
    {
        "id": "GB10 pair, KV profiled at gpu_memory_utilization 0.80: that fraction of MemTotal",
        "recipe": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.8},
        "nnodes": 2,
        "policy": UNIFIED,
        "weights": 150 * GIB,
        "expect": {"workers": 1, "weights_bytes": 0, "kv_bytes": 0,
                   "engine_bytes": -(-int(0.8 * GB10_TOTAL) // 1), "overhead_bytes": 4 * GIB},
        "basis": "gpu_memory_utilization 0.8 of MemTotal",
    },
    {
        "id": "unified, no utilization given: vLLM's default 0.9",
        "recipe": {"tensor_parallel_size": 1},
        "nnodes": 1,
        "policy": UNIFIED,
        "weights": 10 * GIB,
        "expect": {"engine_bytes": -(-int(0.9 * 100 * GIB) // 1),
                   "need_bytes": -(-int(0.9 * 100 * GIB) // 1) + 4 * GIB},
        "mem_total": 100 * GIB,
        "basis": "gpu_memory_utilization 0.9",
    },
    {
        "id": "CPU build: VLLM_CPU_KVCACHE_SPACE GiB per worker",
        "recipe": {"tensor_parallel_size": 2, "env": {"VLLM_CPU_KVCACHE_SPACE": "3"}},
        "nnodes": 1,
        "policy": UNIFIED,
        "weights": 4 * GIB,
        "expect": {"workers": 2, "weights_bytes": 4 * GIB, "kv_bytes": 6 * GIB,
                   "overhead_bytes": 8 * GIB, "need_bytes": 18 * GIB},
        "basis": "env.VLLM_CPU_KVCACHE_SPACE",
    },
    {
        "id": "native offload: the total over the ranks, this node's share",
        "recipe": {"tensor_parallel_size": 2, "kv_cache_memory_bytes": GIB, "kv_offloading_size": 16},
        "nnodes": 2,
        "policy": UNIFIED,
        "weights": 0,
        "expect": {"offload_bytes": 8 * GIB, "need_bytes": GIB + 8 * GIB + 4 * GIB},
        "basis": "8.00 GiB of native KV offload in /dev/shm",
    },
    {
        "id": "discrete GPUs: weights and KV are device memory, only overhead and offload count",
        "recipe": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2,
                   "kv_cache_memory_bytes": 40 * GIB, "kv_offloading_size": 64},
        "nnodes": 2,
        "policy": DISCRETE,
        "weights": 600 * GIB,
        "expect": {"workers": 4, "weights_bytes": 0, "kv_bytes": 0, "offload_bytes": 32 * GIB,
                   "overhead_bytes": 16 * GIB, "need_bytes": 48 * GIB},
        "basis": "discrete GPUs",
    },
    {
        "id": "lmcache offload keeps nothing in /dev/shm",
        "recipe": {"kv_offloading_size": 16, "kv_offloading_backend": "lmcache"},
        "nnodes": 1,
        "policy": DISCRETE,
        "weights": 0,
        "expect": {"offload_bytes": 0, "need_bytes": 4 * GIB},
        "basis": "discrete GPUs",
    },
    {
        "id": "more workers than nodes round up (TP 3 over 2 nodes: 2 on the busier one)",
        "recipe": {"tensor_parallel_size": 3, "kv_cache_memory_bytes": GIB},
        "nnodes": 2,
        "policy": sm.Policy(unified_memory=True, overhead_bytes=GIB),
        "weights": 3 * GIB + 1,
        "expect": {"workers": 2, "weights_bytes": -(-(3 * GIB + 1) // 2), "kv_bytes": 2 * GIB,
                   "overhead_bytes": 2 * GIB},
        "basis": "2 x 1.00 GiB of KV",
    },
]


@pytest.mark.parametrize("case", NEEDS, ids=[c["id"] for c in NEEDS])
def test_node_need(case):
    recipe = {"tensor_parallel_size": 1, **case["recipe"]}
    need = sm.node_need(
        recipe, case["nnodes"], case["policy"], case["weights"], case.get("mem_total", GB10_TOTAL)
    )
    for key, value in case["expect"].items():
        assert need[key] == value, (key, need)
    parts = ("weights_bytes", "kv_bytes", "engine_bytes", "offload_bytes", "overhead_bytes")
    assert need["need_bytes"] == sum(need[p] for p in parts)
    assert case["basis"] in need["basis"]


OFFLOAD = [
    ({}, False),
    ({"kv_offloading_size": 8}, True),
    ({"kv_offloading_size": 8, "kv_offloading_backend": "native"}, True),
    ({"kv_offloading_size": 8, "kv_offloading_backend": "lmcache"}, False),
    ({"kv_transfer_config": {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}}, True),
    ({"kv_transfer_config": {"kv_connector": "LMCacheConnectorV1"}}, False),
    ({"kv_offloading_backend": "native"}, False),
]


@pytest.mark.parametrize(("recipe", "offloads"), OFFLOAD, ids=range(len(OFFLOAD)))
def test_native_kv_offload(recipe, offloads):
    assert sm.native_kv_offload(recipe) is offloads


POLICIES = [
    ({}, None),
    ({"admission": False, "reserve_gib": 0, "unified_memory": "yes"}, None),
    ({"reserve_gib": -1}, "serve_admission_reserve_gib"),
    ({"reserve_gib": "lots"}, "serve_admission_reserve_gib"),
    ({"reserve_gib": float("nan")}, "serve_admission_reserve_gib"),
    ({"overhead_gib": 1e9}, "serve_admission_overhead_gib"),
    ({"oom_score_adjust": -1000}, "serve_oom_score_adjust"),
    ({"oom_score_adjust": "-500; rm"}, "serve_oom_score_adjust"),
    ({"admission": "maybe"}, "serve_admission"),
    ({"memory_high_margin_gib": 8, "memory_max_margin_gib": 4}, "serve_memory_max_margin_gib"),
    ({"libexec_dir": "relative/dir"}, "serve_libexec_dir"),
    ({"libexec_dir": "/usr/local/lib exec"}, "serve_libexec_dir"),
    ({"reserve": 2}, "unknown key"),
    ({"max_gpu_memory_utilization": 0.9}, None),
    ({"max_gpu_memory_utilization": 0}, "serve_max_gpu_memory_utilization"),
    ({"max_gpu_memory_utilization": 1.5}, "serve_max_gpu_memory_utilization"),
    ({"max_gpu_memory_utilization": "most"}, "serve_max_gpu_memory_utilization"),
    ({"max_gpu_memory_utilization": True}, "serve_max_gpu_memory_utilization"),
]


@pytest.mark.parametrize(("raw", "named"), POLICIES, ids=range(len(POLICIES)))
def test_policy_refusals_name_the_role_variable(raw, named):
    if named is None:
        policy = sm.parse_policy(raw)
        assert isinstance(policy, sm.Policy)
        return
    with pytest.raises(ValidationError) as caught:
        sm.parse_policy(raw)
    assert named in str(caught.value)


def test_policy_converts_gib_and_keeps_defaults():
    policy = sm.parse_policy({"reserve_gib": 1.5, "unified_memory": True, "oom_score_adjust": "-100"})
    assert policy.reserve_bytes == int(1.5 * GIB)
    assert policy.oom_score_adjust == -100
    assert policy.overhead_bytes == 4 * GIB
    assert policy.libexec_dir == "/usr/local/libexec/localinference"


def test_guards_lines_follow_the_policy():
    recipe = {"tensor_parallel_size": 2, "kv_cache_memory_bytes": GIB, "kv_offloading_size": 4}
    unified = sm.guards(recipe, "spark-1", 2, UNIFIED, 0, GB10_TOTAL)
    need = unified.need["need_bytes"]
    assert unified.admission_argv == [
        "/usr/local/libexec/localinference/admission", "--need-bytes", str(need),
        "--reserve-bytes", str(2 * GIB), "--host", "spark-1", "--drop-caches",
    ]
    assert unified.reclaim_argv[:3] == ["/usr/local/libexec/localinference/shm-offload", "reclaim", "--confirm"]
    assert (unified.memory_high_bytes, unified.memory_max_bytes) == (need + 4 * GIB, need + 8 * GIB)
    assert unified.oom_score_adjust == -500
    off = sm.guards({}, "h", 1, sm.Policy(admission=False), 0, 0)
    assert (off.admission_argv, off.reclaim_argv, off.oom_score_adjust, off.memory_max_bytes) == (
        None, None, None, None,
    )


def test_weights_on_disk_follows_snapshot_links_once_and_prefers_safetensors(tmp_path):
    blobs = tmp_path / "blobs"
    snapshot = tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    for name, size in (("a", 3000), ("b", 5000), ("c", 7)):
        (blobs / name).write_bytes(b"\0" * size)
    (snapshot / "model-00001-of-00002.safetensors").symlink_to(blobs / "a")
    (snapshot / "model-00002-of-00002.safetensors").symlink_to(blobs / "b")
    (snapshot / "copy.safetensors").symlink_to(blobs / "b")  # the same blob twice counts once
    (snapshot / "pytorch_model.bin").symlink_to(blobs / "c")  # not loaded next to safetensors
    (snapshot / "dangling.safetensors").symlink_to(blobs / "gone")
    (snapshot / "original").mkdir()
    (snapshot / "original" / "consolidated.00.pth").write_bytes(b"\0" * 99)
    assert sm.weights_on_disk(str(snapshot)) == (8000, f"2 *.safetensors file(s) in {snapshot}")
    bin_only = tmp_path / "bin"
    bin_only.mkdir()
    (bin_only / "pytorch_model.bin").write_bytes(b"\0" * 11)
    assert sm.weights_on_disk(str(bin_only))[0] == 11
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"\0" * 13)
    assert sm.weights_on_disk(str(gguf))[0] == 13


@pytest.mark.parametrize("what", ["missing", "empty"])
def test_weights_that_are_not_there_count_zero_and_say_so(tmp_path, what):
    path = tmp_path / "snapshot"
    if what == "empty":
        path.mkdir()
    count, note = sm.weights_on_disk(str(path))
    assert count == 0
    assert "the weights are not counted" in note


def test_mem_total_of_this_machine_and_of_garbage():
    assert sm.mem_total_bytes(Path("/proc/meminfo").read_text()) > 0
    assert sm.mem_total_bytes("MemTotal:       16384 kB\nMemFree: 1 kB\n") == 16384 * 1024
    with pytest.raises(ValueError, match="MemTotal"):
        sm.mem_total_bytes("MemFree: 1 kB\n")


JOURNAL = [
    ("empty log", [], []),
    ("vLLM's own lines only", ["INFO 12-01 starting", "ERROR engine died"], []),
    (
        "the admission refused on the worker (journalctl -o short prefix)",
        [
            "Dec 01 10:00:01 spark-worker admission[4242]: localinference admission refused the"
            " start on spark-worker: 5.00 GiB available (cgroup /x: limit 10.00 GiB, 5.00 GiB in use)"
            " is below 8.00 GiB (6.00 GiB for this rank + 2.00 GiB reserve); largest processes by"
            " RSS: root pid 77 python3 3.00 GiB. Free memory ... (docs/failure-catalog.md#f4)",
        ],
        [
            "localinference admission refused the start on spark-worker: 5.00 GiB available (cgroup"
            " /x: limit 10.00 GiB, 5.00 GiB in use) is below 8.00 GiB (6.00 GiB for this rank +"
            " 2.00 GiB reserve); largest processes by RSS: root pid 77 python3 3.00 GiB. Free memory"
            " ... (docs/failure-catalog.md#f4)"
        ],
    ),
    (
        "retried every RestartSec: the same line once, the last three causes in order",
        [
            "localinference shm-offload refused: 1 possible orphan(s) a",
            "localinference admission refused the start: x",
            "localinference admission refused the start: y",
            "localinference admission refused the start: x",
            "localinference admission refused the start: z",
            "localinference admission: admitted on h",
        ],
        [
            "localinference admission refused the start: y",
            "localinference admission refused the start: x",
            "localinference admission refused the start: z",
        ],
    ),
]


@pytest.mark.parametrize(("name", "lines", "expected"), JOURNAL, ids=[j[0] for j in JOURNAL])
def test_start_refusals(name, lines, expected):
    assert sm.start_refusals(lines) == expected


# recipe's gpu_memory_utilization, unified memory, cap -> blocking F4 problem or none
UTILIZATION = [
    (0.80, True, None, False),  # the public two-Spark recipe under the default 0.85
    (0.85, True, None, False),
    (0.90, True, None, True),  # vLLM's default on GB10: refused
    (0.975, False, None, False),  # discrete GPUs (seed 002's RTX PRO 6000) are not capped
    (0.90, True, 0.95, False),  # raised knowingly
    (None, True, None, False),  # not set: KV pinned or vLLM's default, admission guards it
]


@pytest.mark.parametrize(("asked", "unified", "cap", "refused"), UTILIZATION)
def test_gpu_memory_utilization_is_capped_on_unified_memory(asked, unified, cap, refused):
    raw = {"unified_memory": unified}
    if cap is not None:
        raw["max_gpu_memory_utilization"] = cap
    recipe = {} if asked is None else {"gpu_memory_utilization": asked}
    found = sm.utilization_problems(recipe, sm.parse_policy(raw))
    assert bool(found) == refused
    if refused:
        assert found[0]["id"] == "F4" and found[0]["blocking"]
        assert "vllm_recipe.gpu_memory_utilization 0.9" in found[0]["message"]
        assert "serve_max_gpu_memory_utilization" in found[0]["message"]
