# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the fabric stage; the judgement lives in module_utils/fabric/_judge.py.

They run on the controller over facts already gathered: no extra round trip.

- ``fabric_config``: the role's variables, typed and checked (errors name the variable).
- ``fabric_ping_targets``: ``{ifname, peer, peer_address, size}`` for every ping this node sends.
- ``fabric_drift``: running state against the profile -> ``{drift, activate, findings}``.
- ``fabric_findings``: this node's findings (drift, link, speed, MTU, F19, RDMA, F20).
- ``fabric_publish``: ``{inputs, result}`` for ``localinference.vllm.stage_result`` (stage fabric;
  ``result.pings``: what every (interface, peer) pair answered).
- ``fabric_report``: every node's findings as one table (a list of lines).
- ``fabric_busbw_command``: this node's argv of the collective bandwidth measurement (empty: none here;
  ``module_utils/fabric/_busbw_run.py``).
- ``fabric_busbw_judge``: rank 0's registered run -> ``{result, findings}`` of the gate
  (``module_utils/fabric/_busbw.py``); ``result`` is saved as ``fabric.json``'s ``collective``.
- ``fabric_single_host``: ``{inputs, result, message}`` on the only node of the cluster
  (nothing to link; ``module_utils/fabric/_single.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import (
    _busbw,
    _busbw_run,
    _judge,
    _pairs,
    _single,
    _twins,
)


def _judgement(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn an input error into a filter error naming the variable, never a traceback."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (_judge.FabricInputError, _single.SingleHostInputError) as exc:
            raise AnsibleFilterError(f"{func.__name__}: {exc}") from None
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise AnsibleFilterError(
                f"{func.__name__}: unexpected input ({type(exc).__name__}: {exc}); pass the facts"
                " of ethtool_facts/rdma_facts and the registered results as the role does"
            ) from None

    return wrapper


@_judgement
def fabric_config(settings: dict[str, Any]) -> dict[str, Any]:
    return _judge.config(settings)


@_judgement
def fabric_ping_targets(
    peers: dict[str, Any], host: str, settings: dict[str, Any]
) -> list[dict[str, Any]]:
    return _judge.ping_targets(_judge.config(settings), host, peers)


@_judgement
def fabric_drift(
    running: list[dict[str, Any]],
    profiles: list[dict[str, Any]],
    settings: dict[str, Any],
    host: str,
) -> dict[str, Any]:
    return _judge.drift(_judge.config(settings), host, running, profiles)


@_judgement
def fabric_jumbo_pings(
    peers: dict[str, Any], host: str, settings: dict[str, Any], timeout: int | float = 2
) -> list[list[str]]:
    return _judge.jumbo_pings(_judge.config(settings), host, peers, timeout)


@_judgement
def fabric_watch_commands(settings: dict[str, Any]) -> list[list[str]]:
    return _judge.watch_commands(_judge.config(settings))


@_judgement
def fabric_findings(
    settings: dict[str, Any],
    host: str,
    ethtool: dict[str, Any],
    rdma: dict[str, Any],
    pings: list[dict[str, Any]] | None = None,
    drift: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    return _judge.findings(_judge.config(settings), host, ethtool, rdma, pings or [], drift)


@_judgement
def fabric_publish(
    settings: dict[str, Any],
    ethtool: dict[str, Any],
    rdma: dict[str, Any],
    findings: list[dict[str, Any]] | None = None,
    pings: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    cfg = _judge.config(settings)
    published = _judge.publish(cfg, ethtool, rdma, findings or [])
    published["result"]["pings"] = _pairs.ping_outcomes(cfg, pings or [])
    return published


@_judgement
def fabric_report(findings: list[dict[str, Any]]) -> list[str]:
    return _judge.report(findings)


@_judgement
def fabric_busbw_command(
    busbw: dict[str, Any],
    host: str,
    nodes: list[str],
    addresses: dict[str, str],
    ifname: str,
    env: dict[str, Any] | None = None,
) -> list[str]:
    cfg = _busbw_run.busbw_config(busbw)
    if not cfg["enabled"] or host not in nodes or len(nodes) < 2:
        return []
    return _busbw_run.command(cfg, host, nodes, addresses, ifname, env or {})


@_judgement
def fabric_busbw_judge(
    run: dict[str, Any] | None,
    busbw: dict[str, Any],
    settings: dict[str, Any],
    host: str,
    rdma: dict[str, Any],
    env: dict[str, Any] | None = None,
    why_not: str = "",
) -> dict[str, Any]:
    bcfg = _busbw_run.busbw_config(busbw)
    cfg = _judge.config(settings)
    ports = _judge.rdma_ports(cfg, rdma)
    hca_list = str((env or {}).get("NCCL_IB_HCA") or "")
    context = {
        "host": host,
        "backend": "gloo (CPU stand-in)" if bcfg["backend"] == "gloo" else "nccl",
        "hcas": [h for h in hca_list.split(",") if h],
        "hcas_behind": list(dict.fromkeys(p["hca"] for p in ports if p["hca"])),
        "twins": _twins.twin_pairs(rdma),
        "mtu": cfg["mtu"],
        "rdma_active_mtus": [p["port"].get("active_mtu") for p in ports if p["port"]],
        "ib_hcas_given": cfg["ib_hcas"],
    }
    outcome = None if why_not else _busbw.run_outcome(run, bcfg["timeout"])
    verdict = _busbw.judge(outcome, bcfg["min_gbps"], context)
    if why_not or outcome is None:
        verdict["result"]["note"] = why_not or "the collective bandwidth was not measured"
    return verdict


@_judgement
def fabric_single_host(host: str, nodes: list[str], interfaces: Any = None) -> dict[str, Any]:
    return _single.single_host(host, nodes, interfaces)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "fabric_config": fabric_config,
            "fabric_ping_targets": fabric_ping_targets,
            "fabric_drift": fabric_drift,
            "fabric_findings": fabric_findings,
            "fabric_watch_commands": fabric_watch_commands,
            "fabric_jumbo_pings": fabric_jumbo_pings,
            "fabric_publish": fabric_publish,
            "fabric_report": fabric_report,
            "fabric_single_host": fabric_single_host,
            "fabric_busbw_command": fabric_busbw_command,
            "fabric_busbw_judge": fabric_busbw_judge,
        }
