# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""container_image and a tag alone (serve_allow_unpinned_image): the case table
``test_container_image_unpinned.yaml`` against the stand-in podman of
``test_container_image.py`` (exact argv, exit 99 on any other).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.modules import container_image
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module
from ansible_collections.localinference.vllm.tests.unit.plugins.modules.test_container_image import (  # noqa: F401
    A,
    B,
    _archive,
    node,
)

HERE = Path(__file__).resolve().parent
TABLE = yaml.safe_load((HERE / "test_container_image_unpinned.yaml").read_text())
TAG = "docker.io/vllm/vllm-openai:v0.32.0"
WORDS = {"TAG": TAG, "A": f"sha256:{A}", "B": f"sha256:{B}"}


def _fill(value, extra=None):
    """The table's shorthands (TAG, A, B, ARCHIVE_A) in every string."""
    words = {**WORDS, **(extra or {})}
    if isinstance(value, str):
        for word in sorted(words, key=len, reverse=True):
            value = value.replace(word, words[word])
        return value
    if isinstance(value, list):
        return [_fill(v, extra) for v in value]
    if isinstance(value, dict):
        return {_fill(k, extra): _fill(v, extra) for k, v in value.items()}
    return value


def _argv():
    path = Path(os.environ["FAKE_STORE"] + ".argv")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("case", TABLE["cases"], ids=[c["name"] for c in TABLE["cases"]])
def test_unpinned_image(node, case):  # noqa: F811
    extra = {"ARCHIVE_A": _archive(node)} if "ARCHIVE_A" in json.dumps(case) else {}
    images = [
        {"Id": f"i{n}", **image} for n, image in enumerate(_fill(case.get("images", []), extra))
    ]
    node.store(images, registry=_fill(case.get("registry", {}), extra))
    args = {**node.args, "image": TAG, "state": "present", **_fill(case["args"], extra)}
    result = run_module(container_image, args, check_mode=case.get("check_mode", False))
    assert result.failed is case.get("failed", False), result.result.get("msg")
    if "argv" in case:
        assert _argv() == _fill(case["argv"], extra)
    if result.failed:
        for phrase in _fill(case["msg"], extra):
            assert phrase in result.result["msg"], (phrase, result.result["msg"])
        return
    assert result.result["action"] == case["action"]
    assert result.result["changed"] is (case["action"] != "none")
    assert result.result["resolved"] == _fill(case["resolved"], extra)
    assert result.result["pinned"]["present"]
    findings = result.result["findings"]
    if "warning" in case and not case["warning"]:
        assert findings == []
        return
    assert [(f["id"], f["severity"]) for f in findings] == [("image_unpinned", "warning")]
    for phrase in _fill(case.get("warning", []), extra):
        assert phrase in f"{findings[0]['message']}; {findings[0]['fix']}", phrase
