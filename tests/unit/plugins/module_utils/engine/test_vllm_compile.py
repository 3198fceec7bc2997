# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A compile is not a wedge: the engine's log lines that show a compile in progress, from the
case table ``test_vllm_compile.yaml`` (published lines), the execute-model budget and the node
probe's read of the journal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_compile import (
    EXECUTE_MODEL_TIMEOUT_S,
    compile_state,
    execute_model_budget,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._node import (
    engine_log,
)

TABLE = yaml.safe_load(Path(__file__).with_suffix(".yaml").read_text())


@pytest.mark.parametrize("case", TABLE["cases"], ids=[c["name"] for c in TABLE["cases"]])
def test_compile_state(case: dict[str, Any]) -> None:
    assert case["sources"] and all(s for s in case["sources"])
    state = compile_state(case["lines"])
    assert {"compiling": state["compiling"], "what": state["what"]} == case["expect"]
    assert state["line"] in [line.strip()[:300] for line in case["lines"]] or state["line"] is None


def test_no_line_no_compile() -> None:
    assert compile_state([]) == {"compiling": False, "what": None, "line": None}


@pytest.mark.parametrize(("env", "want"), [
    (None, EXECUTE_MODEL_TIMEOUT_S), ({}, 300.0), ({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800"}, 1800.0),
    ({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": 380}, 380.0)])
def test_the_execute_model_budget_is_the_recipes_or_vllms_default(env: Any, want: float) -> None:
    assert execute_model_budget(env) == want


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "five minutes", True])
def test_a_budget_that_is_no_positive_number_is_refused(value: Any) -> None:
    with pytest.raises(ValidationError, match="VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"):
        execute_model_budget({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": value})


class Journal:
    def __init__(self, answer: tuple[int, str, str] | Exception) -> None:
        self.answer, self.ran = answer, []

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        self.ran.append(argv)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_the_probe_reads_the_serving_units_journal() -> None:
    lines = TABLE["cases"][0]["lines"]
    runner = Journal((0, "\n".join(lines) + "\n", ""))
    state = engine_log(runner, ["localinference-ray.service", "localinference-vllm.service"])
    assert state["compiling"] is True and state["what"] == "CuTeDSL W4A16FusedMoeKernel"
    assert runner.ran == [["journalctl", "--no-pager", "--output=cat", "--lines=400",
                           "--unit=localinference-ray.service", "--unit=localinference-vllm.service"]]


@pytest.mark.parametrize("answer", [(1, "", "No journal files were found."), CommandError("journalctl: not found")])
def test_a_journal_that_cannot_be_read_shows_no_compile_and_says_why(answer: Any) -> None:
    state = engine_log(Journal(answer), ["localinference-vllm.service"])
    assert state["compiling"] is False and "journalctl failed" in state["error"]
