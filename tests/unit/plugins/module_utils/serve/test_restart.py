# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restart path's one verifier (``_restart.verify_node``) from the case table.

``test_restart.yaml``: what a node holds (serving.json and its unit files) and,
for the rollout, what was rendered -> the exact problems. The watchdog calls it
without ``wanted``; the rollout (``serving_state state=verified``) with it.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.serve._restart import verify_node

HERE = Path(__file__).resolve().parent
TABLE = yaml.safe_load((HERE / "test_restart.yaml").read_text())
UNIT_DIRS = ["/etc/containers/systemd", "/etc/systemd/system"]


def _changed(patch: dict[str, Any]) -> dict[str, Any]:
    """The base document with dotted-path changes (a null deletes the key); unit checksums filled."""
    out = copy.deepcopy(TABLE["base"])
    for unit in out["units"]:
        unit["sha256"] = hashlib.sha256(TABLE["base_unit"].encode()).hexdigest()
    for path, value in patch.items():
        *parents, last = path.split(".")
        node = out
        for key in parents:
            node = node[key]
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return out


@pytest.mark.parametrize("case", TABLE["cases"], ids=[c["name"] for c in TABLE["cases"]])
def test_verify_node(case: dict[str, Any]) -> None:
    document = _changed(case.get("document", {}))
    unit = TABLE["base_unit"] + case.get("edit_unit", "")
    files = {} if case.get("missing_unit") else {TABLE["base"]["units"][0]["path"]: unit}
    wanted = _changed(case["wanted"]) if "wanted" in case else None
    found = verify_node(document, UNIT_DIRS, files.get, wanted=wanted)
    assert found["problems"] == case["problems"]
    assert found["ok"] is (not case["problems"])
