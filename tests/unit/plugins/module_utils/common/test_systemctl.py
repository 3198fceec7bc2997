# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``systemctl show -p Id,... UNIT...`` parsed once (module_utils/common/_systemctl.py), on the lab head's output."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.localinference.vllm.plugins.module_utils.common._systemctl import (
    parse_unit_show,
)

SHOW = (Path(__file__).parents[3] / "fixtures" / "stage" / "systemctl-show-head.txt").read_text()
SERVER, RAY = "localinference-vllm.service", "localinference-ray.service"


def test_each_block_is_one_unit_by_its_id():
    states = parse_unit_show(SHOW)
    assert states[SERVER] == {"Id": SERVER, "LoadState": "loaded", "ActiveState": "active"}
    assert states[RAY]["LoadState"] == "not-found"


def test_a_block_without_id_and_a_line_without_equals_are_skipped():
    show = "ActiveState=active\n\nId=a.service\nnot a property\nValue=x=y\n"
    assert parse_unit_show(show) == {"a.service": {"Id": "a.service", "Value": "x=y"}}
    assert parse_unit_show("") == {}
