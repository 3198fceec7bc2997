# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory guards in the rendered units (_units.render_units with _memory.Guards).

Every rendered form: Quadlet and systemd, mp and Ray, head and worker, with and without native
KV offload, unified memory or not. The topology table says which unit starts the engine on a
node (admission) and which holds its workers (offload reclaim); the expected lines follow.
The same input renders the same bytes; Quadlet units go through the real generator when one
is here.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    normalise,
    recipe_hash,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _memory as sm
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import Node
from ansible_collections.localinference.vllm.plugins.module_utils.serve._units import (
    HASH_MARKER,
    MANAGED_COMMENT,
    render_units,
    unit_hash,
    unit_problems,
)

from tests.unit.plugins.module_utils.serve.test_units_quadlet import QUADLET, needs_quadlet

GIB = 1024**3
REV = "5eed0c0ffee0000000000000000000000000000a"
LIB = "/usr/local/libexec/localinference"
RECLAIM = (
    f"{LIB}/shm-offload reclaim --confirm --directory /dev/shm"
    ' --pattern "vllm_offload_*.mmap" --owner root'
)
RECIPE = {
    "model": "localinference/tiny-deepseek",
    "revision": REV,
    "image": "localhost/localinference-vllm-cpu@sha256:" + "ab" * 32,
    "entrypoint": "/opt/vllm/bin/vllm",
    "vllm_version": "0.32.0",
    "tensor_parallel_size": 2,
    "max_model_len": 4096,
    "kv_cache_memory_bytes": 32 * 1024 * 1024,
}
# (deploy_mode, backend, rank) -> the node's units, the one with the admission, the one with
# the reclaim. Ray: the workers run in the Ray unit; the head's server starts the engine.
TOPOLOGY = [
    ("quadlet", "mp", 0, ["localinference-vllm.container"], "localinference-vllm", "localinference-vllm"),
    ("quadlet", "mp", 1, ["localinference-vllm.container"], "localinference-vllm", "localinference-vllm"),
    ("quadlet", "ray", 0, ["localinference-ray.container", "localinference-vllm.container"],
     "localinference-vllm", "localinference-ray"),
    ("quadlet", "ray", 1, ["localinference-ray.container"], "localinference-ray", "localinference-ray"),
    ("systemd", "mp", 0, ["localinference-vllm.service"], "localinference-vllm", "localinference-vllm"),
    ("systemd", "mp", 1, ["localinference-vllm.service"], "localinference-vllm", "localinference-vllm"),
    ("systemd", "ray", 0, ["localinference-ray.service", "localinference-vllm.service"],
     "localinference-vllm", "localinference-ray"),
    ("systemd", "ray", 1, ["localinference-ray.service"], "localinference-ray", "localinference-ray"),
]
CASES = [
    (*topology, offload, unified)
    for topology, offload, unified in itertools.product(TOPOLOGY, (False, True), (False, True))
]


def case_id(case) -> str:
    mode, backend, rank, _, _, _, offload, unified = case
    return (
        f"{mode}-{backend}-{'head' if rank == 0 else 'worker'}"
        f"-{'offload' if offload else 'no_offload'}-{'unified' if unified else 'discrete'}"
    )


def node(rank: int) -> Node:
    address = f"10.77.0.1{rank + 1}"
    return Node(f"spark-{rank}", rank, 2, "10.77.0.11", address, {}, "/srv/models/x")


def render(mode: str, backend: str, rank: int, offload: bool, unified: bool):
    raw = {**RECIPE, "deploy_mode": mode, "executor_backend": backend}
    if offload:
        raw["kv_offloading_size"] = 8
    recipe = normalise(raw)
    policy = sm.Policy(unified_memory=unified)
    guards = sm.guards(recipe, f"spark-{rank}", 2, policy, 2 * 1024 * 1024, 128 * GIB)
    out = render_units(recipe, node(rank), recipe_hash(recipe), "/opt/localinference/v", guards)
    return recipe, guards, out


def guard_lines(content: str) -> list[str]:
    keep = (f"ExecStartPre={LIB}/", "ExecStopPost=", "OOMScoreAdjust=", "Slice=")
    return [line for line in content.splitlines() if line.startswith(keep)]


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_every_rendered_form_carries_its_guards(case):
    mode, backend, rank, names, admitting, engine, offload, unified = case
    _, guards, out = render(mode, backend, rank, offload, unified)
    need = guards.need["need_bytes"]
    admission = (
        f"ExecStartPre={LIB}/admission --need-bytes {need} --reserve-bytes {2 * GIB}"
        f" --host spark-{rank}" + (" --drop-caches" if unified else "")
    )
    services = [u for u in out["units"] if not u["name"].endswith(".slice")]
    assert [u["name"] for u in services] == names
    for unit in services:
        base = unit["name"].rsplit(".", 1)[0]
        expected = []
        if offload and base == engine:
            expected.append(f"ExecStartPre={RECLAIM}")
        if base == admitting:
            expected.append(admission)
        if offload and base == engine:
            expected.append(f"ExecStopPost={RECLAIM}")
        if unified:
            expected += ["OOMScoreAdjust=-500", "Slice=localinference.slice"]
        assert guard_lines(unit["content"]) == expected, unit["name"]
        assert unit_problems(unit["content"]) == []
        # The cache directory is made first; the guards run after it, before the engine.
        pre = [line for line in unit["content"].splitlines() if line.startswith("ExecStartPre=")]
        assert pre[0].startswith("ExecStartPre=/usr/bin/mkdir -p ")
    slices = [u for u in out["units"] if u["name"] == "localinference.slice"]
    assert len(slices) == (1 if unified else 0)
    assert "localinference.slice" not in " ".join(out["start_order"])
    again = render(mode, backend, rank, offload, unified)[2]
    assert again == out, "the same input must render byte-identical units"


def test_the_slice_unit_is_need_plus_the_margins():
    _, guards, out = render("quadlet", "mp", 1, False, True)
    need = guards.need["need_bytes"]
    (unit,) = [u for u in out["units"] if u["name"] == "localinference.slice"]
    digest = unit_hash(unit["content"])
    assert unit["content"] == (
        f"{HASH_MARKER}{digest}\n{MANAGED_COMMENT}\n[Unit]\n"
        f"Description=localinference.vllm serving units on spark-1 (recipe {digest[:12]})\n"
        f"\n[Slice]\nMemoryHigh={need + 4 * GIB}\nMemoryMax={need + 8 * GIB}\n"
    )
    assert unit_problems(unit["content"]) == []


def test_without_guards_the_units_are_as_before():
    recipe = normalise(RECIPE)
    plain = render_units(recipe, node(0), recipe_hash(recipe))
    assert plain == render_units(recipe, node(0), recipe_hash(recipe), "", None)
    assert not any(guard_lines(u["content"]) for u in plain["units"])


def test_admission_off_keeps_the_other_guards():
    recipe = normalise({**RECIPE, "kv_offloading_size": 4})
    policy = sm.Policy(admission=False, unified_memory=True)
    guards = sm.guards(recipe, "spark-0", 2, policy, 0, 128 * GIB)
    (server, _) = render_units(recipe, node(0), recipe_hash(recipe), "", guards)["units"]
    lines = guard_lines(server["content"])
    assert not any("admission" in line for line in lines)
    assert lines == [
        f"ExecStartPre={RECLAIM}",
        f"ExecStopPost={RECLAIM}",
        "OOMScoreAdjust=-500",
        "Slice=localinference.slice",
    ]


SMUGGLED = [
    ("Slice= in [Container]", "[Container]\n", "[Container]\nSlice=other.slice\n"),
    ("MemoryMax= in [Service]", "[Service]\n", "[Service]\nMemoryMax=1\n"),
    ("a second [Slice] key", "MemoryMax=", "CPUQuota=1%\nMemoryMax="),
]


@pytest.mark.parametrize(("name", "old", "new"), SMUGGLED, ids=[s[0] for s in SMUGGLED])
def test_unit_problems_still_refuses_keys_in_the_wrong_place(name, old, new):
    _, _, out = render("quadlet", "mp", 0, True, True)
    text = {u["name"]: u["content"] for u in out["units"]}
    target = "localinference.slice" if "CPUQuota" in new else "localinference-vllm.container"
    edited = text[target].replace(old, new, 1)
    assert edited != text[target]
    assert unit_problems(edited), name


@needs_quadlet
@pytest.mark.parametrize(
    "case",
    [c for c in CASES if c[0] == "quadlet" and c[6] and c[7]],
    ids=[case_id(c) for c in CASES if c[0] == "quadlet" and c[6] and c[7]],
)
def test_quadlet_copies_the_guards_into_the_services(tmp_path: Path, case):
    mode, backend, rank, _, _, _, offload, unified = case
    _, _, out = render(mode, backend, rank, offload, unified)
    for unit in out["units"]:
        (tmp_path / unit["name"]).write_text(unit["content"])
    proc = subprocess.run(
        [QUADLET, "-dryrun"],
        env={"LC_ALL": "C", "QUADLET_UNIT_DIRS": str(tmp_path), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for unit in out["units"]:
        if unit["name"].endswith(".container"):
            generated = proc.stdout.split(f"---{unit['name'].replace('.container', '.service')}---")[1]
            for line in guard_lines(unit["content"]):
                assert line in generated, line
