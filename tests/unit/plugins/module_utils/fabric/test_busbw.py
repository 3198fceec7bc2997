# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collective bandwidth gate: nccl-tests' table read on eight real outputs, and judged.

The figures each fixture must give are the ones ``tests/unit/fixtures/nccl-tests/index.json``
records from the published text. Truncated and failed runs are made from those real
outputs by cutting or appending lines here, so the fixtures stay verbatim.
``test_busbw.yaml`` holds the judge's case table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._busbw import (
    BusbwParseError,
    judge,
    parse_all_reduce,
)

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[2] / "fixtures" / "nccl-tests"
INDEX = json.loads((FIXTURES / "index.json").read_text())
CASES = yaml.safe_load((HERE / "test_busbw.yaml").read_text())


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize("entry", INDEX, ids=[e["file"] for e in INDEX])
def test_real_outputs(entry):
    parsed = parse_all_reduce(_text(entry["file"]))
    assert parsed["size_bytes"] == entry["largest_size_bytes"]
    assert parsed["busbw_gbps"] == entry["busbw_largest_gbps"]
    assert parsed["avg_busbw_gbps"] == entry["avg_busbw_gbps"]
    assert parsed["complete"] == entry["complete"]
    assert parsed["stand_in"] is False


def test_cut_short_before_the_announced_size_is_refused():
    lines = _text("03-alps-gh200-2x4-ofi-hook-libnl-warnings.txt").splitlines()
    cut = [line for line in lines if not line.startswith("134217728")]
    cut = cut[: next(i for i, line in enumerate(cut) if "Out of bounds" in line)]
    with pytest.raises(BusbwParseError, match="stops at 67108864 bytes of the announced 134217728"):
        parse_all_reduce("\n".join(cut))


def test_a_failure_printed_after_rows_is_refused():
    text = _text("09-rtx5090-2rank-mpi-tag-output.txt").splitlines()[:20]
    text.append("[1,1]<stdout>:lab: Test NCCL failure common.cu:1279 'unhandled system error'")
    with pytest.raises(BusbwParseError, match=r"the run failed: .*unhandled system error"):
        parse_all_reduce("\n".join(text))


def test_wrong_results_are_refused():
    text = _text("02-lambda-2x8-b200-no-device-list.txt").replace(
        "696.06       0", "696.06       3"
    )
    with pytest.raises(BusbwParseError, match="wrong results at sizes \\[2147483648\\]"):
        parse_all_reduce(text)


@pytest.mark.parametrize("text", ["", "mpirun: command not found\n", "# size count type redop\n"])
def test_no_table_is_refused(text):
    with pytest.raises(BusbwParseError):
        parse_all_reduce(text)


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["name"] for c in CASES["cases"]])
def test_judge(case):
    verdict = judge(case["measured"], case["min_gbps"], case["context"])
    result, found = verdict["result"], verdict["findings"]
    assert result["verdict"] == case["verdict"]
    assert [f["id"] for f in found] == case["findings"]
    for f in found:
        assert f["severity"] == case.get("severity", "error")
        assert f["fix"]
        assert f["host"] == case["context"]["host"]
    message = " ".join(f["message"] for f in found)
    for words in case.get("says", []):
        assert words in message, (words, message)
    if isinstance(case["measured"], dict):
        assert result["busbw_gbps"] == case["measured"]["busbw_gbps"]
        assert result["stand_in"] is case["measured"]["stand_in"]
    assert case.get("note", "") in result["note"]
