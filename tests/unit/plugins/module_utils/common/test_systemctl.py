# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``systemctl show -p Id,... UNIT...`` parsed once (module_utils/common/_systemctl.py), on the lab head's output."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._systemctl import (
    parse_show,
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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("LoadState=loaded\nActiveState=active\n", {"LoadState": "loaded", "ActiveState": "active"}),
        ("ExecMainStartTimestamp=Sun 2026-12-06 06:38:57 UTC \n", {"ExecMainStartTimestamp": "Sun 2026-12-06 06:38:57 UTC"}),
        ("garbage\n=x\nA B=c\n", {}),
        (None, {}),
        (b"LoadState=loaded", {}),
    ],
)
def test_one_units_properties_are_read_one_way(text, expected):
    # serving_ready, the doctor and (through parse_unit_show) the stages and the watchdog all read
    # systemctl show here: a line that is no property and anything but text give nothing.
    assert parse_show(text) == expected
