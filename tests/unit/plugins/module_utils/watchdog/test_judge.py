# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's judgement, from the case table ``test_judge.yaml``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._judge import (
    judge,
)

TABLE = yaml.safe_load((Path(__file__).with_suffix(".yaml")).read_text())


def merge(base: Any, over: Any) -> Any:
    """``over`` on ``base``: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = copy.deepcopy(base)
        for key, value in over.items():
            out[key] = merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


@pytest.mark.parametrize("case", TABLE["cases"], ids=[c["name"] for c in TABLE["cases"]])
def test_judge(case: dict[str, Any]) -> None:
    look = merge(TABLE["base"]["look"], case.get("look", {}))
    cfg = merge(TABLE["base"]["cfg"], case.get("cfg", {}))
    result = judge(look, case.get("state", {}), cfg)
    want = case["expect"]
    assert (result["verdict"], result["action"]) == (want["verdict"], want["action"]), result["evidence"]
    assert [f["id"] for f in result["findings"]] == want["ids"]
    for key in ("bad_looks",):
        if key in want:
            assert result["state"][key] == want[key]
    if "detect_seconds" in want:
        assert result["detect_seconds"] == pytest.approx(want["detect_seconds"])
    if "target" in want:
        assert result["target"] == want["target"]
    assert result["evidence"] and "\n" not in result["evidence"]
    for found in result["findings"]:
        assert found["fix"], found


def test_the_state_carries_the_look_and_the_budget() -> None:
    look = merge(TABLE["base"]["look"], {})
    result = judge(look, {"restarts": [990.0, -9999.0]}, TABLE["base"]["cfg"])
    assert result["state"]["previous"] is look
    assert result["state"]["restarts"] == [990.0]
    assert result["state"]["last_good_at"] == 1000.0
