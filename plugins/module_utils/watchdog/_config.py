# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's config: checked once by the role (filter ``watchdog_config``) and again by
the program when it reads ``/etc/localinference/watchdog.json`` (a file on a node is never
trusted). Messages name the role variable (``watchdog_<key>``) and the fix.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._files import read_text
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_compile import (
    EXECUTE_MODEL_TIMEOUT_ENV,
    EXECUTE_MODEL_TIMEOUT_S,
    execute_model_budget,
)
from ansible_collections.localinference.vllm.plugins.module_utils.ingress._caddy import (
    caddy_base,
    caddy_ca,
)

SCHEMA = 1
# (key, low, high, integer): every number the program uses, with its bounds.
NUMBERS = (
    ("interval_s", 1, 3600, False),
    ("token_deadline_s", 0.5, 600, False),
    ("probe_timeout_s", 1, 600, False),
    ("ready_timeout_s", 10, 7200, False),
    ("boot_grace_s", 0, 7200, False),
    ("max_restarts", 0, 100, True),
    ("restart_window_s", 1, 7 * 86400, False),
)
MAX_NODES = 64
# How long a compile may hold a silent engine: the served recipe's execute-model timeout,
# within these bounds (a day is longer than any compile reported).
EXECUTE_MODEL_TIMEOUT_BOUNDS = (1.0, 86400.0)


class ConfigError(validate.InputError):
    """The config cannot be used; the message names the variable and the fix."""


def _number(cfg: Mapping[str, Any], key: str, low: float, high: float, integer: bool,
            group: str = "") -> float:
    """``cfg[key]`` of the table above, read by ``validate`` (a number in the JSON, never text)."""
    read = validate.whole if integer else validate.number
    return read(f"watchdog_{group}{key}", cfg.get(key), minimum=low, maximum=high, error=ConfigError,
                fix=f"set a number between {low:g} and {high:g}", text=False)


def _url(name: str, value: Any) -> str:
    text = validate.text(name, value)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name}: {text[:80]!r} is not an http(s) URL; set http://HOST:PORT/...")
    return text.rstrip("/")


def _path(name: str, value: Any) -> str:
    return validate.path(name, value)


def check(cfg: Any) -> dict[str, Any]:
    """The checked config, or ConfigError naming the variable."""
    if not isinstance(cfg, dict) or cfg.get("schema") != SCHEMA:
        raise ConfigError(f"the config is not a watchdog config of schema {SCHEMA}: re-run the watchdog role")
    try:
        out = dict(cfg)
        for key, low, high, integer in NUMBERS:
            out[key] = _number(cfg, key, low, high, integer)
        if out["token_deadline_s"] >= out["interval_s"]:
            raise ConfigError(
                f"watchdog_token_deadline_s ({out['token_deadline_s']:g}) must be shorter than "
                f"watchdog_interval_s ({out['interval_s']:g}): a look must end before the next begins")
        if not isinstance(cfg.get("recover"), bool):
            raise ConfigError("watchdog_recover: set true or false")
        ingress = cfg.get("ingress") or {}
        out["ingress"] = {
            "base_url": _url("watchdog_ingress_url", ingress.get("base_url")),
            "model": validate.text("watchdog_model", ingress.get("model")),
            "key_file": _path("watchdog_key_file", ingress.get("key_file")),
            "unit": validate.unit_name("watchdog_ingress_unit", ingress.get("unit")),
            # The ingress's CA on the head (its https certificate chains to it); null: plain HTTP.
            "ca_file": _path("ingress.json tls.ca_file", ingress["ca_file"]) if ingress.get("ca_file") else None,
        }
        out["engine"] = {"base_url": _url("watchdog_engine_url", (cfg.get("engine") or {}).get("base_url"))}
        out["nodes"] = _nodes(cfg.get("nodes"))
        out["expect"] = {n["name"]: n.get("expect") or {} for n in out["nodes"]}
        inc = cfg.get("incidents") or {}
        out["incidents"] = {
            "path": _path("watchdog_incidents_path", inc.get("path")),
            "max_bytes": int(_number(inc, "max_bytes", 4096, 2**30, True, "incidents_")),
            "keep": int(_number(inc, "keep", 0, 20, True, "incidents_")),
        }
        metrics = cfg.get("metrics") or {}
        try:
            listen = str(ipaddress.ip_address(str(metrics.get("listen"))))
        except ValueError:
            raise ConfigError(
                f"watchdog_metrics_listen: {str(metrics.get('listen'))[:60]!r} is not an IP address; "
                "set 127.0.0.1 (Prometheus on the head) or the cluster address") from None
        out["metrics"] = {"listen": listen, "port": int(_number(metrics, "port", 1, 65535, True, "metrics_"))}
        out["state_path"] = _path("watchdog_state_path", cfg.get("state_path"))
        out["hold_path"] = _path("watchdog_hold_path", cfg.get("hold_path"))
        out["execute_model_timeout_s"] = _execute_model_timeout(
            cfg.get("execute_model_timeout_s", EXECUTE_MODEL_TIMEOUT_S))
    except ConfigError:
        raise
    except ValueError as exc:  # ValidationError, and ipaddress's own
        raise ConfigError(str(exc)) from None
    return out


def _execute_model_timeout(value: Any) -> float:
    """The compile hold's bound; a config written before the key existed holds vLLM's default."""
    low, high = EXECUTE_MODEL_TIMEOUT_BOUNDS
    try:
        return validate.number(f"vllm_recipe.env.{EXECUTE_MODEL_TIMEOUT_ENV}", value, minimum=low, maximum=high)
    except ValueError as exc:
        raise ConfigError(f"{exc}; then run the rollout and the watchdog role again") from None


def served_execute_model_timeout(serving: Mapping[str, Any] | None) -> float:
    """The execute-model timeout of the recipe the head serves (its saved ``serving.json``): the
    recipe's ``env.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``, else vLLM's default (also when nothing
    was rolled out yet: the node probe reports that on its own)."""
    recipe = (serving or {}).get("recipe") if isinstance(serving, Mapping) else None
    env = recipe.get("env") if isinstance(recipe, Mapping) else None
    try:
        budget = execute_model_budget(env if isinstance(env, Mapping) else None)
    except ValueError as exc:  # ValidationError: not a number, or not above 0
        raise ConfigError(f"{exc}; then run the rollout and the watchdog role again") from None
    return _execute_model_timeout(budget)


def _nodes(nodes: Any) -> list[dict[str, Any]]:
    if not isinstance(nodes, list) or not 1 <= len(nodes) <= MAX_NODES:
        raise ConfigError("watchdog nodes: expected 1 to 64 nodes; run the role against the cluster")
    out = []
    for node in nodes:
        name = validate.text("node name", (node or {}).get("name"))
        rank = node.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < MAX_NODES:
            raise ConfigError(f"{name}: rank {rank!r} is not 0..63")
        entry = {"name": name, "rank": rank, "ssh": None, "metrics_url": None,
                 "expect": _expect(name, node.get("expect") or {})}
        if node.get("metrics_url"):
            entry["metrics_url"] = _url("watchdog_metrics_url", node["metrics_url"])
        if node.get("ssh"):
            ssh = node["ssh"]
            entry["ssh"] = {
                "host": str(ipaddress.ip_address(str(ssh.get("host")))),
                "user": validate.text("ssh user", ssh.get("user")),
                "key": _path("watchdog_ssh_key", ssh.get("key")),
                "known_hosts": _path("known_hosts", ssh.get("known_hosts")),
            }
        elif rank != 0:
            raise ConfigError(f"{name}: a worker needs ssh (host, user, key, known_hosts)")
        out.append(entry)
    if sorted(n["rank"] for n in out).count(0) != 1:
        raise ConfigError("watchdog nodes: exactly one node of rank 0 (the head)")
    return sorted(out, key=lambda n: n["rank"])


def _expect(name: str, expect: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, low, high in (("mtu", 68, 65536), ("gid_index", 0, 4096),
                           ("psi_limit", 0, 100), ("min_available_bytes", 0, 2**50)):
        value = expect.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ConfigError(f"{name}: expected {key} {str(value)[:40]!r} is not between {low} and {high}")
        out[key] = value
    return out


def load_config(path: str) -> dict[str, Any]:
    try:
        return check(json.loads(read_text(path, 1024 * 1024)))
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}; run the watchdog role") from None
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{path}: not JSON ({exc}); run the watchdog role") from None


# --------------------------------------------------------------------------- built by the role

def check_options(opts: Mapping[str, Any]) -> None:
    """The role's options alone, before anything is read from a node: ConfigError names one."""
    try:
        for key, low, high, integer in NUMBERS:
            _number(opts, key, low, high, integer)
        if float(opts["token_deadline_s"]) >= float(opts["interval_s"]):
            raise ConfigError(
                f"watchdog_token_deadline_s ({opts['token_deadline_s']:g}) must be shorter than "
                f"watchdog_interval_s ({opts['interval_s']:g}): a look must end before the next begins")
        if not isinstance(opts.get("recover"), bool):
            raise ConfigError("watchdog_recover: set true or false")
        _number(opts, "psi_limit", 0, 100, False)
        _number(opts, "min_available_gib", 0, 2**20, False)
        _number(opts, "incidents_max_bytes", 4096, 2**30, True)
        _number(opts, "incidents_keep", 0, 20, True)
        _number(opts, "metrics_port", 1, 65535, True)
        for key in ("incidents_path", "key_file", "serving_path", "rdma_sys_root"):
            _path(f"watchdog_{key}", opts.get(key))
        try:
            ipaddress.ip_address(str(opts.get("metrics_listen")))
        except ValueError:
            raise ConfigError(
                f"watchdog_metrics_listen: {str(opts.get('metrics_listen'))[:60]!r} is not an IP address; "
                "set 127.0.0.1 (Prometheus on the head) or the cluster address") from None
        if opts.get("ingress_url"):
            _url("watchdog_ingress_url", opts["ingress_url"])
        validate.unit_name("watchdog_ingress_unit", opts.get("ingress_unit"))
        validate.text("watchdog_ssh_user", opts.get("ssh_user"), strip_ok=False)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _head_url(ingress: Mapping[str, Any], model: str | None) -> tuple[str, str, str]:
    """(the route's base URL as the head reaches Caddy, the model, the engine's URL)."""
    routes = ingress.get("routes") or []
    if not isinstance(routes, list) or not routes:
        raise ConfigError("ingress.json has no route: run the ingress stage first (--tags ingress)")
    route = next((r for r in routes if r.get("model") == model), routes[0])
    base = caddy_base(ingress.get("listen"), ingress.get("tls"))
    if base is None:
        raise ConfigError(f"ingress.json: listen {str(ingress.get('listen'))[:60]!r} is not HOST:PORT: "
                          "run the ingress stage again (--tags ingress)")
    # The route's upstream is Caddy's dial address, HOST:PORT ([v6]:PORT).
    return (f"{base}{route.get('prefix', '')}/v1", str(route.get("model")),
            f"http://{route.get('upstream')}")


def node_config(name: str, fabric: Mapping[str, Any] | None, opts: Mapping[str, Any]) -> dict[str, Any]:
    """The node's ``watchdog-node.json``: where its units, link and RoCE GID are read."""
    fabric = fabric or {}
    interfaces = [i["ifname"] for i in fabric.get("interfaces") or [] if isinstance(i, Mapping)
                  and i.get("ifname") and i.get("ifname") != "lo"]
    rdma = []
    primary = next((i for i in fabric.get("interfaces") or [] if isinstance(i, Mapping)), {})
    if fabric.get("gid_index") is not None and primary.get("hca"):
        rdma.append({"hca": validate.text("hca", primary["hca"]), "port": 1,
                     "ipv4": str(ipaddress.ip_address(str(fabric.get("primary_ip")))),
                     "netdev": primary.get("ifname")})
    return {
        "schema": SCHEMA, "node": validate.text("node", name),
        "serving_state_path": _path("watchdog_serving_path", opts["serving_path"]),
        "unit_dirs": list(opts["unit_dirs"]),
        "interfaces": [validate.text("interface", i) for i in interfaces],
        "rdma": rdma,
        "rdma_sys_root": _path("watchdog_rdma_sys_root", opts["rdma_sys_root"]),
        "kmsg": "/dev/kmsg",
    }


def build(opts: Mapping[str, Any], nodes: list[Mapping[str, Any]], ingress: Mapping[str, Any],
          serving: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The head's ``watchdog.json`` from the role's options and the saved stage results, checked.

    ``nodes``: ``{name, rank, fabric}`` (``fabric``: the node's saved fabric result or None).
    ``serving``: the head's saved ``serving.json`` (None: not rolled out yet), whose recipe
    carries the execute-model timeout that bounds a compile's hold.
    """
    check_options(opts)
    base_url, model, engine = _head_url(ingress, opts.get("model") or None)
    if opts.get("ingress_url"):
        base_url = opts["ingress_url"]
    out_nodes = []
    for node in nodes:
        fabric = node.get("fabric") or {}
        mtus = [i.get("mtu") for i in fabric.get("interfaces") or [] if isinstance(i, Mapping)]
        expect = {"psi_limit": opts["psi_limit"],
                  "min_available_bytes": int(float(opts["min_available_gib"]) * 2**30)}
        if mtus and isinstance(mtus[0], int) and node_config(node["name"], fabric, opts)["interfaces"]:
            expect["mtu"] = mtus[0]
        if fabric.get("gid_index") is not None:
            expect["gid_index"] = fabric["gid_index"]
        entry = {"name": node["name"], "rank": node["rank"], "expect": expect,
                 "metrics_url": engine + "/metrics" if node["rank"] == 0 else None}
        if node["rank"] != 0:
            if not fabric.get("primary_ip"):
                raise ConfigError(f"{node['name']}: no saved fabric result with primary_ip: run the fabric stage first (--tags fabric)")
            entry["ssh"] = {"host": fabric["primary_ip"], "user": opts["ssh_user"],
                            "key": opts["ssh_key"], "known_hosts": opts["known_hosts"]}
        out_nodes.append(entry)
    cfg = {
        "schema": SCHEMA,
        **{key: opts[key] for key, *_ in NUMBERS},
        "recover": opts["recover"],
        "ingress": {"base_url": base_url, "model": model, "key_file": opts["key_file"], "unit": opts["ingress_unit"],
                    "ca_file": caddy_ca(ingress.get("tls"))},
        "engine": {"base_url": engine},
        "nodes": out_nodes,
        "incidents": {"path": opts["incidents_path"], "max_bytes": opts["incidents_max_bytes"],
                      "keep": opts["incidents_keep"]},
        "metrics": {"listen": opts["metrics_listen"], "port": opts["metrics_port"]},
        "state_path": opts["state_path"], "hold_path": opts["hold_path"],
        "execute_model_timeout_s": served_execute_model_timeout(serving),
    }
    return check(cfg)
