# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gid-start (_gid_start): the RoCE GID index resolved at every start, on recorded real tables.

The sysfs trees are written from recorded real GID tables (tests/unit/fixtures/README.md):
the DGX Spark's ``show_gids`` rows (RoCE v2 IPv4 GID at index 3 on enp1s0f0np0) and the
ConnectX-6 Dx ``ibv_devinfo -vv`` table (index 3 carries 27.105.179.3), in the kernel's
layout (``gids/N``, ``gid_attrs/types/N``, ``gid_attrs/ndevs/N``; unused slots all zero).
The program the role installs (templates/gid_start.j2) is rendered and run here too.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _embed
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import _gid_start as gs
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._rdma_facts import (
    parse_ibv_devinfo,
    parse_show_gids,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    start_refusals,
)

ROOT = Path(__file__).resolve().parents[5]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "ibv_devinfo"
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
SPARK = ("rocep1s0f0", "192.168.100.10", "enp1s0f0np0")
CX6 = ("mlx5_bond_0", "27.105.179.3", "bond0")


def full(gid: str) -> str:
    """Eight groups of four hex digits, as the kernel writes ``gids/N``."""
    raw = ipaddress.IPv6Address(gid).packed
    return ":".join(f"{raw[i]:02x}{raw[i + 1]:02x}" for i in range(0, 16, 2))


def write_table(root: Path, hca: str, rows: dict[int, tuple[str, str, str | None]], slots: int = 16) -> None:
    """``rows``: index -> (gid, sysfs type, netdev); the other slots unused (all zero)."""
    port = root / "class" / "infiniband" / hca / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    for index in range(max(slots, max(rows, default=0) + 1)):
        gid, kind, netdev = rows.get(index, (ZERO, None, None))
        (port / "gids" / str(index)).write_text(full(gid) + "\n")
        for sub, value in (("types", kind), ("ndevs", netdev)):
            path = port / "gid_attrs" / sub / str(index)
            if value:
                path.write_text(value + "\n")
            elif path.exists():
                path.unlink()


def spark_rows(move_to: int | None = None) -> dict[int, tuple[str, str, str | None]]:
    """The recorded Spark rows (show_gids VER v2 is sysfs "RoCE v2"); ``move_to`` re-indexes
    the IPv4 entry, as a node whose addresses were rebuilt shows it (F20)."""
    rows = {}
    for row in parse_show_gids((FIXTURES / "dgx-spark-show_gids-rows.txt").read_text()):
        index = row["index"] if move_to is None or not row["ipv4"] else move_to
        rows[index] = (row["gid"], "RoCE v2" if row["type"] == "RoCE v2" else "IB/RoCE v1", row["netdev"])
    return rows


def cx6_rows() -> dict[int, tuple[str, str, str | None]]:
    (device,) = parse_ibv_devinfo((FIXTURES / "mlx5-cx6dx-vv.txt").read_text()).values()
    gids = device["ports"]["1"]["gids"]
    kinds = {"RoCE v2": "RoCE v2", "RoCE v1": "IB/RoCE v1"}
    return {int(i): (e["gid"], kinds[e["type"]], CX6[2]) for i, e in gids.items()}


@pytest.fixture
def spark(tmp_path: Path) -> Path:
    write_table(tmp_path, SPARK[0], spark_rows())
    return tmp_path


def test_recorded_tables_parse_as_expected():
    assert {i: r[1] for i, r in spark_rows().items()} == {1: "RoCE v2", 3: "RoCE v2"}
    assert cx6_rows()[3][0] == "::ffff:27.105.179.3"


# (case, table, hca, ipv4, netdev, expect) -> the index, moved, words of the line
RESOLVED = [
    ("spark as fabric.json says", "spark", SPARK, 3, 3, False, "NCCL_IB_GID_INDEX=3 (RoCE v2, 192.168.100.10 on enp1s0f0np0"),
    ("spark moved since fabric.json", "spark", SPARK, 4, 3, True, "moved from 4 (fabric.json) to 3 (the GID table now"),
    ("cx6dx bond", "cx6", CX6, 3, 3, False, "as fabric.json says"),
]


@pytest.mark.parametrize(("case", "table", "port", "expect", "index", "moved", "words"), RESOLVED,
                         ids=[c[0] for c in RESOLVED])
def test_resolve_on_recorded_tables(tmp_path, case, table, port, expect, index, moved, words):
    write_table(tmp_path, port[0], spark_rows() if table == "spark" else cx6_rows())
    found = gs.resolve(str(tmp_path), port[0], 1, port[1], port[2], expect, gs.read_sysfs)
    assert (found["index"], found["moved"]) == (index, moved), case
    assert words in found["line"], found["line"]
    if moved:
        assert found["line"].startswith(gs.MOVED_MARKER)
        assert "run the fabric stage (--tags fabric)" in found["line"]


REFUSED = [
    ("another address", SPARK[0], "192.168.100.11", SPARK[2], "no RoCE v2 entry for 192.168.100.11 on enp1s0f0np0"),
    ("the address on another netdev", SPARK[0], SPARK[1], "enP2p1s0f0np0", "no RoCE v2 entry for 192.168.100.10 on enP2p1s0f0np0"),
    ("no such HCA", "roceP2p1s0f0", SPARK[1], SPARK[2], "roceP2p1s0f0 port 1 has no GID table"),
]


@pytest.mark.parametrize(("case", "hca", "ipv4", "netdev", "words"), REFUSED, ids=[c[0] for c in REFUSED])
def test_resolve_refuses_without_an_entry(spark, case, hca, ipv4, netdev, words):
    with pytest.raises(gs.GidStartError) as caught:
        gs.resolve(str(spark), hca, 1, ipv4, netdev, 3, gs.read_sysfs)
    said = str(caught.value)
    assert said.startswith(gs.REFUSAL_MARKER) and words in said, said
    assert "--tags fabric" in said


def test_refusal_lists_what_the_table_holds(spark):
    with pytest.raises(gs.GidStartError) as caught:
        gs.resolve(str(spark), SPARK[0], 1, "10.0.0.1", SPARK[2], 3, gs.read_sysfs)
    assert "(it holds: 1 RoCE v2 non-IPv4, 3 RoCE v2 192.168.100.10)" in str(caught.value)


def argv(root: Path, env_file: Path, expect: int = 3, ipv4: str = SPARK[1], hca: str = SPARK[0]) -> list[str]:
    return ["--sys-root", str(root), "--hca", hca, "--port", "1", "--ipv4", ipv4,
            "--netdev", SPARK[2], "--expect", str(expect), "--env-file", str(env_file)]


def test_a_table_that_changes_between_two_starts(tmp_path, capsys):
    env_file = tmp_path / "run" / "nccl-gid.env"
    write_table(tmp_path, SPARK[0], spark_rows())
    assert gs.main(argv(tmp_path, env_file)) == gs.OK
    assert env_file.read_text() == "NCCL_IB_GID_INDEX=3\n"
    first = capsys.readouterr()
    assert "NCCL_IB_GID_INDEX=3" in first.out and first.err == ""
    write_table(tmp_path, SPARK[0], spark_rows(move_to=7))
    assert gs.main(argv(tmp_path, env_file)) == gs.OK
    assert env_file.read_text() == "NCCL_IB_GID_INDEX=7\n"
    second = capsys.readouterr()
    assert second.err.count("\n") == 1 and "moved from 3 (fabric.json) to 7" in second.err
    assert not list(env_file.parent.glob("*.partial"))


def test_a_refused_start_removes_the_last_index(spark, capsys):
    env_file = spark / "nccl-gid.env"
    assert gs.main(argv(spark, env_file)) == gs.OK
    assert gs.main(argv(spark, env_file, ipv4="192.168.100.99")) == gs.REFUSE
    assert not env_file.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(gs.REFUSAL_MARKER), err


@pytest.mark.parametrize(("flag", "value"), [("--hca", "a/b"), ("--ipv4", "fe80::1"), ("--expect", "-1"),
                                             ("--sys-root", "relative"), ("--netdev", "a b")])
def test_bad_arguments_are_refused_by_name(tmp_path, capsys, flag, value):
    args = argv(tmp_path, tmp_path / "e.env")
    args[args.index(flag) + 1] = value
    assert gs.main(args) == gs.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"{gs.REFUSAL_MARKER}: bad argument") and flag in err, err


# --- what the units carry --------------------------------------------------------------------------

SOURCE = {"hca": "rocep1s0f0", "port": 1, "sys_root": "/sys"}
ENV = {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0", "NCCL_SOCKET_IFNAME": "enp1s0f0np0"}


def test_start_argv_where_the_fabric_resolved_an_index():
    assert gs.start_argv("/usr/local/libexec/localinference", SOURCE, "10.77.0.12", ENV) == [
        "/usr/local/libexec/localinference/gid-start", "--sys-root", "/sys", "--hca", "rocep1s0f0",
        "--port", "1", "--ipv4", "10.77.0.12", "--netdev", "enp1s0f0np0", "--expect", "3",
        "--env-file", gs.ENV_FILE,
    ]


@pytest.mark.parametrize(("case", "source", "address", "env"), [
    ("no RDMA port (single host)", {}, "10.77.0.12", ENV),
    ("no index resolved", SOURCE, "10.77.0.12", {k: v for k, v in ENV.items() if k != "NCCL_IB_GID_INDEX"}),
    ("one host on loopback", SOURCE, "127.0.0.1", {}),
    ("IPv6 cluster address", SOURCE, "fd00::2", ENV),
])
def test_nothing_is_rendered_without_an_index(case, source, address, env):
    assert gs.start_argv("/x", source, address, env) is None, case


@pytest.mark.parametrize(("raw", "name", "words"), [
    ({"hca": "roce/../x"}, "node.rdma.hca", "contains '/'"),
    ({"hca": "rocep1s0f0", "port": 0}, "node.rdma.port", ""),
    ({"hca": "rocep1s0f0", "sys_root": "sys"}, "node.rdma.sys_root", "not an absolute path"),
    ({"hca": "rocep1s0f0", "ports": 1}, "node.rdma", "unknown key"),
    ("rocep1s0f0", "node.rdma", "expected a dict"),
])
def test_parse_source_refuses_by_name(raw, name, words):
    with pytest.raises(ValidationError) as caught:
        gs.parse_source("node.rdma", raw)
    assert caught.value.name == name and words in str(caught.value)


def test_parse_source_defaults():
    assert gs.parse_source("node.rdma", {}) == {}
    assert gs.parse_source("node.rdma", {"hca": ""}) == {}
    assert gs.parse_source("node.rdma", {"hca": "rocep1s0f0"}) == SOURCE


# --- the program the role installs ----------------------------------------------------------------

def test_the_template_embeds_gid_start_and_what_it_imports():
    template = (ROOT / "roles/serve/templates/gid_start.j2").read_text()
    assert "'fabric._gid_start' | localinference.vllm.embedded_program(" in template
    assert _embed.closure("fabric._gid_start") == [
        "common._validate", "common._files", "fabric._rdma_facts", "fabric._gid_start"
    ]


def render_program(tmp_path: Path) -> Path:
    """The program as the template renders it (common/_embed.py, without Ansible)."""
    program = tmp_path / "gid-start"
    program.write_text(_embed.program("fabric._gid_start", []))
    return program


def test_the_installed_program_resolves_and_refuses(tmp_path):
    program = render_program(tmp_path)
    write_table(tmp_path / "sys", SPARK[0], spark_rows(move_to=5))
    env_file = tmp_path / "run" / "nccl-gid.env"
    run = subprocess.run([sys.executable, "-I", str(program), *argv(tmp_path / "sys", env_file)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert env_file.read_text() == "NCCL_IB_GID_INDEX=5\n"
    assert "moved from 3 (fabric.json) to 5" in run.stderr
    refused = subprocess.run([sys.executable, "-I", str(program), *argv(tmp_path / "sys", env_file, hca="mlx5_9")],
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1 and "mlx5_9 port 1 has no GID table" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_rollout_quotes_a_refusal_not_a_move(spark, capsys):
    """A refused start is quoted like the admission's refusal; a moved index is not a refusal."""
    env_file = spark / "nccl-gid.env"
    gs.main(argv(spark, env_file, expect=4))
    gs.main(argv(spark, env_file, ipv4="192.168.100.99"))
    journal = [f"Dec 03 19:00:00 spark-worker gid-start[42]: {line}"
               for line in capsys.readouterr().err.splitlines()]
    (quoted,) = start_refusals(journal)
    assert quoted.startswith(gs.REFUSAL_MARKER) and "192.168.100.99" in quoted
