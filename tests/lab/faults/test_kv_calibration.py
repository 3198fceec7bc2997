# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Calibrate the KV model on real vLLM (CPU build, tiny lab model) and check a prediction.

The model is the lab's tiny model with one sliding-window layer (512 tokens)
and one full-attention layer, so a request costs a fixed part plus a per-token
part, as DeepSeek V4's hybrid cache does. Two boots at different max_model_len
calibrate a + b*L; a third boot at another KV size and context must report the
predicted KV tokens within 1%. Three boots
of about 30 s each, each bounded; benchmarks/kv_calibration.py stops every
server it starts.
"""

from __future__ import annotations

import importlib.util

import pytest

from lab.harness import ROOT

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("controller_vllm")]

BENCH = ROOT / "benchmarks" / "kv_calibration.py"


def _benchmark():
    spec = importlib.util.spec_from_file_location("kv_calibration", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Three real vLLM boots: 145 s in the clean-clone CI of 0cd4aaa (make test-lab-extended).
@pytest.mark.extended
def test_prediction_matches_vllm_within_one_percent(tmp_path):
    result = _benchmark().run(port=18150, timeout=300, save_logs=tmp_path, kind="hybrid")
    assert result["model"]["calibrated"] is True
    assert result["model"]["distinct_lengths"] == 2
    # the sliding-window layer is a fixed cost per request: a token model would be wrong
    assert result["model"]["a"] > 0
    assert result["calibration"][0]["kv_tokens"] != result["calibration"][1]["kv_tokens"]
    assert result["reported"]["max_model_len"] == result["predicted"]["max_model_len"]
    assert result["relative_error"] <= 0.01, result
    concurrency = result["reported"]["max_concurrency"]
    assert abs(concurrency - result["predicted"]["max_concurrency"]) / concurrency <= 0.01
    # the logs of this run parse as the collection's fixtures do
    assert sorted(p.name for p in tmp_path.glob("cpu-calibration-*.log")) == [
        "cpu-calibration-hybrid-1g-16384.log",
        "cpu-calibration-hybrid-1g-4096.log",
        "cpu-calibration-hybrid-2g-8192.log",
    ]
