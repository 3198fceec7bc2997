# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tune's table of rules: findings -> candidates (rules_cases.yml), and its bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.tune import _rules

CASES = yaml.safe_load((Path(__file__).parent / "rules_cases.yml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_propose(case: dict[str, Any]) -> None:
    got = _rules.propose(case["recipe"], case["checks"], case["figures"], case.get("knobs"),
                         case.get("bounds", {}), case.get("engine"))
    assert [{"id": c["id"], "set": c["set"]} for c in got["candidates"]] == case["candidates"]
    assert [s["rule"] for s in got["skipped"]] == case.get("skipped", [])
    for candidate in got["candidates"]:
        assert candidate["source"] and candidate["direction"] and candidate["changes"]


def test_every_rule_names_known_knobs_and_a_source() -> None:
    for rule in _rules.RULES:
        assert set(rule.knobs) <= set(_rules.KNOBS), rule.name
        assert "vLLM" in rule.source or "MiaAI" in rule.source, rule.name


def test_the_rules_never_touch_what_the_agents_were_configured_with() -> None:
    assert not {"model", "revision", "image", "quantization", "max_model_len", "served_model_name"} & set(_rules.KNOBS)


def test_the_change_says_what_the_engine_had_settled_on() -> None:
    got = _rules.propose({}, {"head_of_line": "fail"}, {}, engine={"max_num_batched_tokens": 4096})
    assert "max_num_batched_tokens: unset (the engine's 4096) -> 2048" in got["candidates"][1]["changes"]


@pytest.mark.parametrize(
    ("knobs", "bounds", "message"),
    [
        (["max_num_sequences"], {}, r"tune_knobs\[0\]: 'max_num_sequences' is not a knob the tune turns"),
        (None, {"model": {"max": 1}}, r"tune_bounds.model: is not a numeric knob"),
        (None, {"enable_prefix_caching": {"max": 1}}, r"tune_bounds.enable_prefix_caching: is not a numeric knob"),
        (None, {"max_num_seqs": {"max": 0}}, r"tune_bounds.max_num_seqs.max: 0 is below 1"),
        (None, {"max_num_seqs": {"max": 4096}}, r"tune_bounds.max_num_seqs.max: 4096 is above 1024"),
        (None, {"gpu_memory_utilization": {"max": 0.99}}, r"tune_bounds.gpu_memory_utilization.max: 0.99 is above 0.95"),
        (None, {"gpu_memory_utilization": {"min": "nan"}}, r"tune_bounds.gpu_memory_utilization.min: 'nan' is not a finite number"),
        (None, {"max_num_seqs": {"min": 8, "max": 4}}, r"tune_bounds.max_num_seqs: min 8 is above max 4"),
        (None, {"max_num_seqs": {"most": 4}}, r"tune_bounds.max_num_seqs: expected \{min, max\}"),
        (None, ["max_num_seqs"], r"tune_bounds: expected a mapping"),
    ],
)  # fmt: skip
def test_bad_knobs_and_bounds_are_refused_naming_the_option(knobs: Any, bounds: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _rules.propose({}, {}, {}, knobs, bounds)
