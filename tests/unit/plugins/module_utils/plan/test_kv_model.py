# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KV model against the seeds' numbers."""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_model import (
    KvInputError,
    fit_boots,
    group_boots,
    max_length_for,
    normalise_observations,
    plan_kv,
    predict_concurrency,
    predict_tokens,
    scheduled_tokens,
)

GIB = 1024**3


def seed000_profiled(unknown_len: int = 24576) -> list[dict]:
    """Seed 000 §3.1.1: four profiled boots, tokens only.

    The seed calls the configuration identical, yet pairs 33,932 tokens with
    16,384 (2.07x) and 47,930 with 24,576 (1.95x), so the boots were not all at
    one max_model_len. The other two boots' L is unknown: the token plan must
    not depend on it.
    """
    return [
        {"max_model_len": unknown_len, "kv_tokens": 26890},
        {"max_model_len": 16384, "kv_tokens": 33932},
        {"max_model_len": unknown_len, "kv_tokens": 34887},
        {"max_model_len": 24576, "kv_tokens": 47930},
    ]


@pytest.mark.parametrize("unknown_len", [16384, 24576])
@pytest.mark.parametrize(
    ("granularity", "min_concurrency", "expected"),
    [
        # the worst boot holds 26,890 tokens, but no boot was seen above 24,576 (tokens_only)
        (1024, 1.0, 24576),
        (8192, 1.0, 24576),  # the seed's choice, at the seed's granularity
        # 1.5 x 24,576 > 26,890: the longest boot seen holding 1.5 requests is at 16,384
        (1024, 1.5, 16384),
    ],
)
def test_seed000_worst_boot_governs(unknown_len, granularity, min_concurrency, expected):
    plan = plan_kv(
        seed000_profiled(unknown_len), min_concurrency=min_concurrency, granularity=granularity
    )
    assert plan["max_model_len"] == expected
    assert plan["calibrated"] is False
    assert plan["model"]["mode"] == "tokens"
    assert plan["model"]["calibration"] == "tokens_only"
    assert "planning in tokens" in plan["model"]["notes"][0]


def test_seed000_24576_spread():
    plan = plan_kv(seed000_profiled(), granularity=8192)
    assert plan["concurrency"] == {"worst": 1.0942, "median": 1.4001, "best": 1.9503}
    # the paper's 1.95x is the best boot; the guaranteed headroom is 1.09x
    row32 = next(r for r in plan["options"] if r["max_model_len"] == 32768)
    assert row32["concurrency"]["best"] > 1.0 > row32["concurrency"]["worst"]
    assert row32["meets_min_concurrency"] is False


def test_seed000_explicit_bytes_are_linear():
    """§2.1: 4/7/14 GiB gave 10,434/18,272/36,555 tokens: ~2,610 tokens per GiB."""
    one = [{"max_model_len": 16384, "kv_tokens": 18272, "kv_memory_gib": 7516192768 / GIB}]
    fit = fit_boots(group_boots(normalise_observations(one)))
    assert fit.calibrated is False and fit.a == 0.0
    assert round(1 / fit.b) == 2610
    for gib, seen in ((4, 10434), (14, 36555)):
        assert abs(predict_tokens(fit, gib, 16384) - seen) / seen < 0.001
    assert round(predict_concurrency(fit, 7, 16384), 2) == 1.12


def test_seed002_one_point():
    obs = [{"max_model_len": 262144, "kv_tokens": 285336, "kv_memory_gib": 8.59}]
    plan = plan_kv(obs, granularity=1024)
    assert round(predict_concurrency(plan["_fit"], 8.59, 262144), 2) == 1.09
    assert plan["calibrated"] is False
    # one boot: 285,336 tokens fit, but no context above the 262,144 observed is offered
    assert plan["model"]["calibration"] == "single_boot_bounded"
    assert plan["max_model_len"] == 262144
    assert plan["model"]["bounded_by_evidence"] == 262144
    assert "second max_model_len" in plan["model"]["evidence_needed"]
    # a plain-attention model's cost per token is constant: 278 x 1024 <= 285,336
    plain = plan_kv(obs, granularity=1024, constant_per_token=True)
    assert plain["model"]["calibration"] == "constant_per_token"
    assert plain["max_model_len"] == 284672
    table = {row["sequences"]: row["tokens_per_sequence"] for row in plain["active_sequences"]}
    assert table == {1: 284672, 2: 142336, 4: 70656}
    # the seed's conservative allocation (256K / 128K / 64K) fits inside it
    for count, each in ((1, 262144), (2, 131072), (4, 65536)):
        assert each <= table[count]


def test_hybrid_fit_recovers_a_and_b():
    """Two boots at distinct L with a fixed per-request part (DeepSeek V4-like)."""
    a, b, memory = 0.5, 1 / 2610, 14.0
    obs = []
    for length in (16384, 65536):
        tokens = int(memory / (a + b * length) * length)
        obs.append({"max_model_len": length, "kv_tokens": tokens, "kv_memory_gib": memory})
    fit = fit_boots(group_boots(normalise_observations(obs)))
    assert fit.calibrated is True
    assert fit.a == pytest.approx(a, rel=1e-3)
    assert fit.b == pytest.approx(b, rel=1e-3)
    assert fit.fit_error < 1e-4
    third = int(memory / (a + b * 32768) * 32768)
    assert abs(predict_tokens(fit, memory, 32768) - third) / third < 0.001


def test_fit_error_is_reported():
    obs = [
        {"max_model_len": 8192, "kv_tokens": 100000, "kv_memory_gib": 10},
        {"max_model_len": 16384, "kv_tokens": 100000, "kv_memory_gib": 10},
        {"max_model_len": 32768, "kv_tokens": 90000, "kv_memory_gib": 10},
    ]
    fit = fit_boots(group_boots(normalise_observations(obs)))
    assert fit.calibrated is True
    assert 0 < fit.fit_error < 0.1


def test_weakest_rank_and_boot_grouping():
    obs = [
        {
            "recorded_at": "t1",
            "rank": 0,
            "host": "head",
            "max_model_len": 16384,
            "kv_tokens": 40000,
            "kv_memory_gib": 20.0,
        },
        {
            "recorded_at": "t1",
            "rank": 1,
            "host": "worker",
            "max_model_len": 16384,
            "kv_tokens": 40000,
            "kv_memory_gib": 15.0,
        },
    ]
    boots = group_boots(normalise_observations(obs))
    assert len(boots) == 1
    assert (boots[0].memory_gib, boots[0].weakest_rank, boots[0].host) == (15.0, 1, "worker")


def test_memory_inferred_for_token_only_boots():
    obs = [
        {"max_model_len": 16384, "kv_tokens": 26100, "kv_memory_gib": 10.0},
        {"max_model_len": 16384, "kv_tokens": 13050},
    ]
    plan = plan_kv(obs)
    assert plan["memory"]["worst"] == pytest.approx(5.0, rel=1e-3)


def test_max_length_meets_concurrency_exactly():
    fit = fit_boots(
        group_boots(normalise_observations([{"max_model_len": 4096, "kv_tokens": 8192}]))
    )
    assert max_length_for(fit, 8192, 1.0, 1024) == 8192
    assert max_length_for(fit, 8192, 2.0, 1024) == 4096
    assert max_length_for(fit, 8192, 1.0, 3000) == 6000
    assert max_length_for(fit, 100, 1.0, 1024) == 0


def test_preferred_concurrency_only_when_client_fits():
    plan = plan_kv(
        seed000_profiled(), preferred_concurrency=1.5, granularity=1024, min_length=30000
    )
    assert plan["preferred_met"] is False and plan["max_model_len"] == 24576
    plan = plan_kv(seed000_profiled(), preferred_concurrency=1.5, granularity=1024, min_length=8192)
    assert plan["preferred_met"] is True and plan["max_model_len"] == 16384


def test_model_max_len_caps():
    assert plan_kv(seed000_profiled(), model_max_len=20000)["max_model_len"] == 19456


@pytest.mark.parametrize(
    ("batched", "seqs", "k", "parallel", "expected"),
    [
        (8192, 2, 5, True, 8184),  # seed 002
        (8192, 4, 5, True, 8176),
        (8192, 2, 5, False, 8192),
        (8192, 2, 1, True, 8192),
        (4096, 8, 5, True, 4064),  # seed 004's lane
    ],
)
def test_scheduled_tokens(batched, seqs, k, parallel, expected):
    assert scheduled_tokens(batched, seqs, k, parallel) == expected


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"observations": []}, "no observations and no available_kv_gib"),
        ({"observations": [], "available_kv_gib": -1.0}, "available_kv_gib: -1.0 is not above 0; set more than 0"),
        ({"observations": [], "available_kv_gib": 8.0}, "pass per_token_kib"),
        ({"observations": [{"kv_tokens": 5}]}, "observations[0].max_model_len is missing"),
        (
            {"observations": [{"max_model_len": 5, "kv_tokens": 5, "kv_memory_gib": -2}]},
            "observations[0].kv_memory_gib: -2 is not above 0",
        ),
        (
            {"observations": [{"max_model_len": 5, "kv_tokens": 5}], "min_concurrency": 0},
            "min_concurrency: 0 is not above 0",
        ),
        ({"observations": [{"max_model_len": 5, "kv_tokens": 5}], "granularity": 0}, "granularity"),
        ({"observations": ["x"]}, "observations[0] must be a dict"),
    ],
)
def test_bad_input_names_the_option(kwargs, named):
    with pytest.raises(KvInputError, match=None) as caught:
        plan_kv(**kwargs)
    assert named in str(caught.value)


def test_available_memory_with_per_token_cost():
    plan = plan_kv([], available_kv_gib=8.0, per_token_kib=400)
    # 400 KiB per token: 8 GiB holds 20,971 tokens
    assert plan["kv_tokens"]["worst"] == pytest.approx(20971, abs=2)
    assert plan["max_model_len"] == 20480
    assert plan["memory_source"] == "available_kv_gib"


def test_calibration_from_real_cpu_logs():
    """The lab's real CPU-vLLM boots: two calibrate, the others are predicted within 1%."""
    from pathlib import Path

    from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_log import (
        parse_log,
        to_observations,
    )

    logs = Path(__file__).resolve().parents[3] / "fixtures" / "vllm-logs"

    def observed(name):
        parsed = parse_log((logs / name).read_text())
        return to_observations(parsed, host="controller", recorded_at=name)

    calibration = observed("cpu-calibration-1g-4096.log") + observed("cpu-calibration-1g-16384.log")
    fit = fit_boots(group_boots(normalise_observations(calibration)))
    assert fit.calibrated is True and fit.fit_error < 0.01
    for name in (
        "cpu-calibration-2g-8192.log",
        "real-cpu-kvbytes64m-len16384.log",
        "real-cpu-kv2g-len32768.log",
    ):
        path = logs / name
        if not path.exists():
            continue
        (entry,) = observed(name)
        predicted = predict_tokens(fit, entry["kv_memory_gib"], entry["max_model_len"])
        assert abs(predicted - entry["kv_tokens"]) / entry["kv_tokens"] <= 0.01, name


def test_calibration_from_real_hybrid_cpu_logs():
    """One sliding-window layer (512) + one full layer: T grows with L at fixed memory."""
    from pathlib import Path

    from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_log import (
        parse_log,
        to_observations,
    )

    logs = Path(__file__).resolve().parents[3] / "fixtures" / "vllm-logs"

    def observed(name):
        return to_observations(parse_log((logs / name).read_text()), host="c", recorded_at=name)

    first = observed("cpu-calibration-hybrid-1g-4096.log")
    second = observed("cpu-calibration-hybrid-1g-16384.log")
    assert first[0]["kv_tokens"] == 2532409 and second[0]["kv_tokens"] == 3603160
    fit = fit_boots(group_boots(normalise_observations(first + second)))
    assert fit.calibrated is True and fit.a > 0
    assert round(fit.b * 1024**3) == 256  # bytes per token of the one full-attention layer
    (third,) = observed("cpu-calibration-hybrid-2g-8192.log")
    predicted = predict_tokens(fit, third["kv_memory_gib"], third["max_model_len"])
    assert abs(predicted - third["kv_tokens"]) / third["kv_tokens"] < 0.001
    # one boot alone (a = 0) is off by about 20%: why calibration needs two lengths
    single = fit_boots(group_boots(normalise_observations(first)))
    error = abs(predict_tokens(single, 2.0, 8192) - third["kv_tokens"]) / third["kv_tokens"]
    assert error > 0.15
