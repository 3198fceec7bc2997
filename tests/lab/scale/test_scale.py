# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Past two nodes, on the real three-host lab: pipeline parallel 3 across three hosts.

After converge and idempotence: the endpoint streams a token through the
ingress; every ordered pair of hosts passed the jumbo-frame ping (each host's
saved fabric result); each host runs its rank of one recipe (ranks 0, 1, 2 of
3, the workers headless); every host holds the same verified weights.
"""

from __future__ import annotations

import itertools

import pytest

from lab import harness
from lab.harness import LAB_DIR, LabError, exec_on, podman, read_json

HEAD, WORKER, WORKER2 = "scale-head", "scale-worker", "scale-worker2"
HOSTS = (HEAD, WORKER, WORKER2)
MODEL = "localinference/tiny-deepseek-3l"
CLUSTER_IF = "enp1s0f0np0"


@pytest.fixture(scope="session")
def scale_hosts(require_lab) -> tuple[str, ...]:
    """The three hosts are running (`make test-scale` creates them); else skip, or fail
    when the run requires the lab (LOCALINFERENCE_LAB_REQUIRED=1, as make sets it)."""
    try:
        names = podman("ps", "--format", "{{.Names}}", timeout=30).stdout.split()
    except LabError:
        names = []
    require_lab(set(HOSTS) <= set(names), "needs the three-host lab running (make test-scale)")
    return HOSTS


def _result(host: str, stage: str) -> dict:
    return read_json(host, f"{harness.STATE_DIR}/{stage}.json")["result"]


def test_the_endpoint_streams_a_token_through_the_ingress(scale_hosts):
    base = (LAB_DIR / "scale-endpoint").read_text().strip()
    token = harness.first_token(base, MODEL, timeout=120)
    assert token["text"], token


def test_every_pair_of_hosts_passed_the_jumbo_ping(scale_hosts):
    pairs = harness.module_utils("fabric._pairs")
    saved = {host: _result(host, "fabric") for host in HOSTS}
    assert pairs.missing_pairs(saved, {host: [CLUSTER_IF] for host in HOSTS}) == []
    for host in HOSTS:
        peers = {p["peer"] for p in saved[host]["pings"] if p["jumbo"] and p["small"]}
        assert peers == set(HOSTS) - {host}, saved[host]["pings"]
        # the lab lists one endpoint of the stand-ins' cable (one veth): the twin warning only
        assert [f["id"] for f in saved[host]["findings"]] in ([], ["twin"]), saved[host]["findings"]


def test_each_host_runs_its_rank_of_one_pipeline(scale_hosts):
    docs = {host: read_json(host, harness.SERVING_STATE) for host in HOSTS}
    assert len({d["recipe_hash"] for d in docs.values()}) == 1
    for rank, host in enumerate(HOSTS):
        node, argv = docs[host]["node"], docs[host]["server_argv"]
        assert (node["rank"], node["nnodes"]) == (rank, 3)
        flags = dict(itertools.pairwise(argv))
        assert flags["--pipeline-parallel-size"] == "3" and flags["--tensor-parallel-size"] == "1"
        assert flags["--nnodes"] == "3" and flags["--node-rank"] == str(rank)
        assert ("--headless" in argv) == (rank > 0)
        active = exec_on(host, "systemctl", "is-active", harness.VLLM_UNIT, check=False)
        assert active.stdout.strip() == "active", f"{host}: {active.stdout}"


def test_every_host_holds_the_same_verified_weights(scale_hosts):
    digests = {host: _result(host, "weights")["content_sha256"] for host in HOSTS}
    assert len(set(digests.values())) == 1 and digests[HEAD], digests
