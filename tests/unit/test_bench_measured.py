# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""No benchmark exits 0 over figures it never made (benchmarks/_measured.py, bench.py). No lab."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench
from benchmarks._measured import MEASURES, exit_code, unmeasured

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("result", "missing"),
    [
        ({"noop_seconds": 3.1, "noop_ratio": 1.4}, []),
        ({"noop_seconds": 3.1}, ["noop_ratio"]),
        ({"noop_seconds": None, "noop_ratio": float("nan")}, ["noop_seconds", "noop_ratio"]),
        ({"noop_seconds": True, "noop_ratio": "1.4"}, ["noop_seconds", "noop_ratio"]),
        ({}, ["noop_seconds", "noop_ratio"]),
    ],
)
def test_unmeasured_names_what_is_not_a_finite_number(result, missing):
    assert unmeasured(result, MEASURES["noop"]) == missing


def test_nested_figures_and_the_exit_code():
    growth = {"growth_per_added_node": {"noop_seconds": 0.4, "before_engine_seconds": 1.2}}
    assert exit_code("growth", growth) == 0
    assert exit_code("growth", growth, ok=False) == 1
    assert exit_code("growth", {"growth_per_added_node": {"noop_seconds": 0.4}}) == 1


def test_every_part_of_bench_has_its_figures_declared():
    assert set(MEASURES) == set(bench.PARTS)


def test_a_part_that_returns_without_its_figures_failed(capsys):
    result = bench.run_part("noop", lambda: {"note": "no timings"}, lambda r: "never printed")
    assert result["error"] == "measured nothing for noop_seconds, noop_ratio"
    assert "never printed" not in capsys.readouterr().out
    measured = bench.run_part("noop", lambda: {"noop_seconds": 3.0, "noop_ratio": 1.5}, lambda r: "reported")
    assert "error" not in measured and "reported" in capsys.readouterr().out


def test_bench_with_no_part_named_is_an_error():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--only", ","], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "no part named" in done.stderr
