# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``ethtool_facts``: each named interface's link as ``ethtool`` and sysfs report it.

Speed, duplex, link and the driver and firmware (``ethtool IFACE``, ``ethtool -i IFACE``),
then the MTU, the state and the MAC address from sysfs; the parsing is ``_ethtool_facts``'s.
An interface that is not on the node ends the module naming the ones that are.

No AnsibleModule here: ``module`` is the caller's (``params``, ``get_bin_path``, ``fail_json``).
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
    interface_name,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._ethtool_facts import (
    EthtoolParseError,
    parse_driver,
    parse_settings,
    sysfs_int,
)

HINT = "the NIC driver may be stuck (see 'dmesg'); raise timeout only if ethtool is merely slow"


def facts(module: Any, runner: Runner) -> dict:
    """The facts of ``ansible_facts.ethtool``, one entry per interface."""
    if not module.params["interfaces"]:
        module.fail_json(msg="interfaces: give at least one interface name to read")
    try:
        for position, name in enumerate(module.params["interfaces"]):
            interface_name(f"interfaces[{position}]", name)
    except ValidationError as exc:
        module.fail_json(msg=f"{exc}. Fix the interface name in the inventory.")
    try:
        validate.existing_directory("sys_root", module.params["sys_root"], must_exist=False)
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    net = os.path.join(module.params["sys_root"], "class", "net")
    missing = [
        name for name in module.params["interfaces"] if not os.path.isdir(os.path.join(net, name))
    ]
    if missing:
        present = sorted(os.listdir(net)) if os.path.isdir(net) else []
        module.fail_json(
            msg=f"interfaces: no such interface {', '.join(missing)} on this host (present: {', '.join(present)}). "
            "Fix the interface name in the inventory.",
            missing=missing,
        )
    ethtool = module.get_bin_path(module.params["ethtool"], required=True)
    facts = {}
    for name in module.params["interfaces"]:
        rc, out, err = runner.run([ethtool, name], HINT)
        if rc != 0:
            module.fail_json(msg=f"'ethtool {name}' failed with rc={rc}: {err.strip()[:500]}")
        rc_i, out_i, _err_i = runner.run([ethtool, "-i", name], HINT)
        try:
            entry = parse_settings(out)
            entry.update(
                parse_driver(out_i)
                if rc_i == 0
                else {
                    "driver": None,
                    "driver_version": None,
                    "firmware_version": None,
                    "bus_info": None,
                }
            )
        except EthtoolParseError as exc:
            module.fail_json(msg=f"Could not parse ethtool output for {name}: {exc}")
        entry["mtu"] = sysfs_int(_files.read_sysfs(os.path.join(net, name, "mtu")))
        entry["operstate"] = _files.read_sysfs(os.path.join(net, name, "operstate"))
        entry["mac_address"] = _files.read_sysfs(os.path.join(net, name, "address"))
        facts[name] = entry
    return facts
