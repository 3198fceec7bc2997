# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The expected: vocabulary and the gate's comparison, from ``test_expected.yaml``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._expected import (
    ExpectedError,
    check_params,
    compare,
    params,
    parse,
    reasons,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._report import (
    figures,
)

TABLE = yaml.safe_load(Path(__file__).with_suffix(".yaml").read_text())


def _ids(cases: list[dict]) -> list[str]:
    return [case["name"] for case in cases]


@pytest.mark.parametrize("case", TABLE["compare"], ids=_ids(TABLE["compare"]))
def test_compare(case):
    checks = case.get("checks", TABLE["checks"])
    rows = compare(parse(case["expected"]), checks, figures(checks, None))
    assert [r["figure"] for r in rows] == [r["figure"] for r in case["rows"]]
    for got, want in zip(rows, case["rows"], strict=True):
        assert {k: got[k] for k in want} == want, got
    assert reasons(rows) == case["reasons"]


@pytest.mark.parametrize("case", TABLE["params"], ids=_ids(TABLE["params"]))
def test_params(case):
    assert params(parse(case["expected"]), case["served_limit"]) == case["params"]


@pytest.mark.parametrize("case", TABLE["check_params"], ids=_ids(TABLE["check_params"]))
def test_check_params(case):
    got = check_params(case["expected"], case["served_limit"], case["defaults"], case["overrides"])
    assert got == case["params"]


@pytest.mark.parametrize("case", TABLE["refuse"], ids=_ids(TABLE["refuse"]))
def test_refuse(case):
    with pytest.raises(ExpectedError, match=case["error"]):
        parse(case["expected"])
