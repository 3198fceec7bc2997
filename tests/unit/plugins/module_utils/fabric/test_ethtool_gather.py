# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each interface's link from ethtool and sysfs (module_utils/fabric/_ethtool_gather.py).

An interface the node does not have is refused naming the ones it has, before ethtool runs;
an unreadable sysfs value is None. The parsers are test_ethtool_facts.py's; the module with
the lab's stand-ins is tests/unit/plugins/modules/test_ethtool_facts.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import Runner
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import _ethtool_gather
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit


def test_a_missing_interface_is_refused_naming_those_present(tmp_path):
    (tmp_path / "class" / "net" / "enp1s0f0np0").mkdir(parents=True)
    (tmp_path / "class" / "net" / "lo").mkdir()
    module = FakeModule({"interfaces": ["enp1s0f1np1"], "ethtool": "ethtool", "sys_root": str(tmp_path)})
    with pytest.raises(ModuleExit) as caught:
        _ethtool_gather.facts(module, Runner(10))
    assert caught.value.result["missing"] == ["enp1s0f1np1"]
    assert caught.value.result["msg"] == (
        "interfaces: no such interface enp1s0f1np1 on this host (present: enp1s0f0np0, lo)."
        " Fix the interface name in the inventory."
    )


@pytest.mark.parametrize(
    ("interfaces", "message"),
    [([], "interfaces: give at least one interface name to read"), (["../x"], "interfaces[0]")],
    ids=["none", "not an interface name"],
)
def test_bad_interface_names_are_refused(tmp_path, interfaces, message):
    module = FakeModule({"interfaces": interfaces, "ethtool": "ethtool", "sys_root": str(tmp_path)})
    with pytest.raises(ModuleExit) as caught:
        _ethtool_gather.facts(module, Runner(10))
    assert caught.value.result["msg"].startswith(message)


def test_a_sysfs_value_is_its_text_or_none(tmp_path):
    # the gather reads sysfs through common/_files (one reader for the collection)
    (tmp_path / "mtu").write_bytes(b"9000\n")
    assert _ethtool_gather._files.read_sysfs(str(tmp_path / "mtu")) == "9000"
    assert _ethtool_gather._files.read_sysfs(str(tmp_path / "absent")) is None
