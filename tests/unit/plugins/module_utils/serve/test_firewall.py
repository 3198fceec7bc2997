# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The firewall of the internal ports (module_utils/serve/_firewall.py, filter firewall.py,
the serve role's firewall.nft.j2) from the case tables in test_firewall.yaml."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.firewall import FilterModule
from ansible_collections.localinference.vllm.plugins.filter.ingress import (
    FilterModule as IngressFilters,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _firewall

HERE = Path(__file__).resolve().parent
ROLE = HERE.parents[4] / "roles" / "serve"
FIXTURES = HERE.parents[2] / "fixtures"
CASES = yaml.safe_load((HERE / "test_firewall.yaml").read_text())
FILTERS = FilterModule().filters()


def ids(table: str) -> list[str]:
    return [case["case"] for case in CASES[table]]


@pytest.mark.parametrize("case", CASES["ports"], ids=ids("ports"))
def test_internal_ports(case: dict[str, Any]) -> None:
    found = FILTERS["firewall_ports"](
        case["recipe"], case["rank"], case["nnodes"], case["behind_ingress"]
    )
    assert [item["port"] for item in found] == case["expected"]
    assert all(item["what"] for item in found)


@pytest.mark.parametrize("case", CASES["rules"], ids=ids("rules"))
def test_rules(case: dict[str, Any]) -> None:
    rules = FILTERS["firewall_rules"](case["spec"])
    assert {key: rules[key] for key in case["expected"]} == case["expected"]
    assert rules["table"] == "localinference" and rules["ports_set"] == "internal_ports"


@pytest.mark.parametrize("case", CASES["refused"], ids=ids("refused"))
def test_refused(case: dict[str, Any]) -> None:
    with pytest.raises(AnsibleFilterError) as raised:
        FILTERS["firewall_rules"](case["spec"])
    for words in case["says"]:
        assert words in str(raised.value)


@pytest.mark.parametrize("case", CASES["confined"], ids=ids("confined"))
def test_confined(case: dict[str, Any]) -> None:
    text = (FIXTURES / case["json_file"]).read_text() if "json_file" in case else case["json"]
    assert FILTERS["firewall_confined"](text) == case["expected"]


def render(rules: dict[str, Any], template: str = "firewall.nft.j2", **extra: Any) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(ROLE / "templates")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,  # as ansible.builtin.template renders
    )
    return env.get_template(template).render(__serve_firewall=rules, **extra)


# The file indents with tabs (nft's own listing does); compared with tabs shown as 4 spaces.
LAB_HEAD_RULES = """\
table inet localinference
delete table inet localinference
table inet localinference {
    set internal_ports {
        type inet_service
        elements = { 29501 }
    }
    set cluster_v4 {
        type ipv4_addr
        flags interval
        elements = { 10.77.0.11, 10.77.0.12 }
    }
    set cluster_v6 {
        type ipv6_addr
        flags interval
    }
    chain input {
        type filter hook input priority -10; policy accept;
        iifname "lo" accept
        tcp dport != @internal_ports accept
        ip saddr @cluster_v4 accept
        ip6 saddr @cluster_v6 accept
        meta l4proto tcp reject with tcp reset
    }
}
"""


def test_the_lab_heads_rules_file():
    rules = _firewall.ruleset(
        {"ports": [29501], "nodes": {"spark-head": "10.77.0.11", "spark-worker": "10.77.0.12"}}
    )
    text = render(rules)
    body = "".join(line + "\n" for line in text.splitlines() if not line.startswith("#"))
    assert body.replace("\t", "    ") == LAB_HEAD_RULES


def test_interfaces_narrow_the_cluster_rules():
    rules = _firewall.ruleset(
        {
            "ports": [29501],
            "sources": ["10.77.0.0/24", "fd00::/64"],
            "interfaces": ["enp1s0f0np0", "bond0"],
        }
    )
    text = render(rules)
    assert 'iifname { "bond0", "enp1s0f0np0" } ip saddr @cluster_v4 accept' in text
    assert 'iifname { "bond0", "enp1s0f0np0" } ip6 saddr @cluster_v6 accept' in text
    assert "elements = { fd00::/64 }" in text


@pytest.mark.skipif(
    shutil.which("nft") is None, reason="nft is not installed here (the lab checks it)"
)
def test_nft_accepts_the_rendered_file(tmp_path):
    path = tmp_path / "firewall.nft"
    path.write_text(
        render(_firewall.ruleset({"ports": [29501, 8000], "sources": ["10.77.0.11", "fd00::1"]}))
    )
    proc = subprocess.run(
        ["nft", "-c", "-f", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 or "Operation not permitted" in proc.stderr, proc.stderr


def test_the_unit_loads_after_debians_nftables_and_deletes_on_stop():
    rules = _firewall.ruleset({"ports": [29501], "sources": []})
    text = render(
        rules,
        "localinference-firewall.service.j2",
        serve_firewall_nft="/usr/sbin/nft",
        serve_firewall_path="/etc/localinference/firewall.nft",
    )
    assert "ExecStart=/usr/sbin/nft -f /etc/localinference/firewall.nft" in text
    assert "ExecReload=/usr/sbin/nft -f /etc/localinference/firewall.nft" in text
    assert "ExecStop=-/usr/sbin/nft delete table inet localinference" in text
    assert "After=nftables.service" in text and "PartOf=nftables.service" in text
    assert "WantedBy=multi-user.target" in text


STORE_WILDCARD = 'LISTEN 0 4096 *:29501 *:* users:(("python",pid=32,fd=12))\n'


def test_a_confined_store_is_no_longer_an_exposure():
    """The doctor's torch-store-wildcard warning (read from ingress.json) passes once the table confines it."""
    ingress = IngressFilters().filters()
    sockets = ingress["ingress_listening"](STORE_WILDCARD)
    before = ingress["ingress_exposure"](sockets, "spark-head", [8000], ["10.77.0.11"])
    assert [f["id"] for f in before] == ["torch-store-wildcard"]
    assert "serve_firewall" in before[0]["fix"]
    live = json.dumps(
        {
            "nftables": [
                {
                    "set": {
                        "family": "inet",
                        "table": "localinference",
                        "name": "internal_ports",
                        "elem": [29501],
                    }
                }
            ]
        }
    )
    confined = FILTERS["firewall_confined"](live)
    after = ingress["ingress_exposure"](
        sockets, "spark-head", [8000], ["10.77.0.11"], confined_ports=confined
    )
    assert after == []
    # Another port confined leaves the store's warning in place.
    other = ingress["ingress_exposure"](
        sockets, "spark-head", [8000], ["10.77.0.11"], confined_ports=[6379]
    )
    assert [f["id"] for f in other] == ["torch-store-wildcard"]


def test_a_recipe_that_is_not_a_mapping_is_an_error():
    with pytest.raises(AnsibleFilterError, match="normalised recipe"):
        FILTERS["firewall_ports"]("mp", 0, 2)
