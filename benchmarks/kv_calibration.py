# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Calibrate the KV model on real vLLM and check one prediction against a third boot.

Boots the controller's CPU vLLM (``lab/bin/vllm-boot``) on a hybrid variant of
the tiny lab model (one sliding-window layer of 512 tokens, one full-attention
layer, like the fixed-plus-per-token cost of DeepSeek V4's cache) at two
configurations, reads each log with the collection's parser, fits the
per-request cost ``a + b*L`` with the collection's KV model, predicts the KV
tokens of a third configuration, boots it and prints the relative error.

Then it calibrates from a failure: it boots the plain tiny model with too little
KV on purpose (8 MiB pinned for 32,768 tokens), turns vLLM's "not enough KV"
error into the two observations ``vllm_log_facts`` records (``error_report``),
plans the longest context that memory holds, boots that configuration and
compares the KV tokens vLLM reports with the prediction. Five boots in all,
each bounded by a timeout; every server started is stopped.

    .venv/bin/python benchmarks/kv_calibration.py [--model hybrid|plain] [--part all|calibration|error]
        [--port 18150] [--save-logs DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab import harness

kv_model = harness.module_utils("plan._kv_model")
vllm_log = harness.module_utils("engine._vllm_log")
ROOT = harness.ROOT
BOOT = ROOT / "lab" / "bin" / "vllm-boot"
TINY_MODEL = ROOT / "lab" / "bin" / "tiny-model"
SLIDING_WINDOW = 512
# pinned: the sliding-window layer's cost per request depends on it
BATCHED_TOKENS = 2048
# (VLLM_CPU_KVCACHE_SPACE GiB, max_model_len): two to calibrate, one to predict
CALIBRATE = ((1, 4096), (1, 16384))
PREDICT = (2, 8192)
# (kv_cache_memory_bytes, max_model_len): too little KV on purpose, so the start fails
ERROR_BOOT = (8 * 1024**2, 32768)
ERROR_GRANULARITY = 256


def model_path(kind: str) -> Path:
    """The lab's tiny model, or its hybrid variant (made once next to it)."""
    done = harness.run([TINY_MODEL], timeout=600)
    plain = Path(done.stdout.strip().splitlines()[-1])
    if kind == "plain":
        return plain
    hybrid = plain.parent / f"{plain.name}-hybrid-sw{SLIDING_WINDOW}"
    config = json.loads((plain / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config["layer_types"] = ["sliding_attention", *["full_attention"] * (layers - 1)]
    config["sliding_window"] = SLIDING_WINDOW
    if (
        not (hybrid / "config.json").exists()
        or json.loads((hybrid / "config.json").read_text()) != config
    ):
        shutil.rmtree(hybrid, ignore_errors=True)
        shutil.copytree(plain, hybrid)
        (hybrid / "config.json").write_text(json.dumps(config, indent=2))
    return hybrid


def boot(
    kv_gib: int | str,
    max_model_len: int,
    port: int,
    timeout: int,
    model: Path,
    extra: tuple[str, ...] = (),
    expect_failure: bool = False,
) -> str:
    """Boot, read the log, stop. Returns the log text (of the failed start when expected)."""
    argv = [str(BOOT), "start", "--kv-gib", str(kv_gib), "--max-model-len", str(max_model_len)]
    argv += ["--port", str(port), "--timeout", str(timeout), "--model", str(model)]
    argv += ["--", "--max-num-batched-tokens", str(BATCHED_TOKENS), *extra]
    try:
        done = harness.run(argv, timeout=timeout + 60, check=False)
        log_path = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if expect_failure:
            if done.returncode != 1 or not log_path:
                raise RuntimeError(f"the start meant to fail did not (rc={done.returncode})")
            return Path(log_path).read_text()
        if done.returncode != 0:
            tail = (
                Path(log_path).read_text()[-2000:] if log_path and Path(log_path).exists() else ""
            )
            raise RuntimeError(
                f"vllm-boot start failed (rc={done.returncode}): {done.stderr}\n{tail}"
            )
        return Path(log_path).read_text()
    finally:
        harness.run([BOOT, "stop", "--port", str(port)], timeout=60, check=False)


def observe(text: str, kv_gib: int, stamp: str) -> list[dict[str, Any]]:
    parsed = vllm_log.parse_log(text)
    if parsed["kv_cache_tokens"] is None:
        raise RuntimeError(f"no KV cache size in the log of boot {stamp}: {parsed['errors']}")
    return vllm_log.to_observations(
        parsed, host="controller", recorded_at=stamp, kv_memory_gib=float(kv_gib)
    )


def run(
    port: int = 18150, timeout: int = 240, save_logs: Path | None = None, kind: str = "hybrid"
) -> dict[str, Any]:
    model = model_path(kind)
    observations: list[dict[str, Any]] = []
    logs: dict[str, str] = {}
    for kv_gib, length in CALIBRATE:
        name = f"cpu-calibration-{kind}-{kv_gib}g-{length}"
        logs[name] = boot(kv_gib, length, port, timeout, model)
        observations += observe(logs[name], kv_gib, name)
    fit = kv_model.fit_boots(kv_model.group_boots(kv_model.normalise_observations(observations)))
    # what one boot alone (a = 0, uncalibrated) would have predicted
    single = kv_model.fit_boots(
        kv_model.group_boots(kv_model.normalise_observations(observations[:1]))
    )
    kv_gib, length = PREDICT
    predicted_tokens = kv_model.predict_tokens(fit, float(kv_gib), length)
    predicted_concurrency = kv_model.predict_concurrency(fit, float(kv_gib), length)
    name = f"cpu-calibration-{kind}-{kv_gib}g-{length}"
    logs[name] = boot(kv_gib, length, port, timeout, model)
    parsed = vllm_log.parse_log(logs[name])
    reported = parsed["kv_cache_tokens"]
    if save_logs:
        save_logs.mkdir(parents=True, exist_ok=True)
        for key, text in logs.items():
            (save_logs / f"{key}.log").write_text(text)
    boots = kv_model.group_boots(kv_model.normalise_observations(observations))
    return {
        "model_kind": kind,
        "version": parsed["version"],
        "calibration": [
            {
                "kv_gib": b.memory_gib,
                "max_model_len": b.max_model_len,
                "kv_tokens": b.kv_tokens,
                "memory": kv_model.boot_memory(fit, b),
            }
            for b in boots
        ],
        "model": fit.as_dict(),
        "predicted": {
            "kv_gib": kv_gib,
            "max_model_len": length,
            "kv_tokens": predicted_tokens,
            "max_concurrency": round(predicted_concurrency, 2),
        },
        "reported": {
            "kv_tokens": reported,
            "max_concurrency": parsed["max_concurrency"],
            "max_model_len": parsed["concurrency_max_model_len"],
        },
        "relative_error": abs(predicted_tokens - reported) / reported,
        "uncalibrated_relative_error": abs(
            kv_model.predict_tokens(single, float(kv_gib), length) - reported
        )
        / reported,
    }


def run_error(port: int, timeout: int, save_logs: Path | None = None) -> dict[str, Any]:
    """Calibrate from a start refused for KV; predict and boot the plan at that memory."""
    model = model_path("plain")
    kv_bytes, length = ERROR_BOOT
    pinned = ("--kv-cache-memory-bytes", str(kv_bytes))
    # VLLM_CPU_KVCACHE_SPACE unset ("auto"): the pinned bytes size the cache
    failed = boot("auto", length, port, timeout, model, pinned, expect_failure=True)
    parsed = vllm_log.parse_log(failed)
    if not parsed["kv_insufficient"]:
        raise RuntimeError(f"the failed start did not report too little KV: {parsed['errors']}")
    observations = vllm_log.to_observations(parsed, host="controller", recorded_at="error")
    plan = kv_model.plan_kv(observations, granularity=ERROR_GRANULARITY)
    chosen, memory = plan["max_model_len"], plan["memory"]["worst"]
    predicted = kv_model.predict_tokens(plan["_fit"], memory, chosen)
    started = boot("auto", chosen, port, timeout, model, pinned)
    second = vllm_log.parse_log(started)
    reported = second["kv_cache_tokens"]
    if save_logs:
        save_logs.mkdir(parents=True, exist_ok=True)
        (save_logs / f"cpu-error-calibration-kvbytes8m-{length}.log").write_text(failed)
        (save_logs / f"cpu-error-calibration-kvbytes8m-{chosen}.log").write_text(started)
    return {
        "version": second["version"],
        "error": {
            "max_model_len": length,
            "kv_cache_memory_bytes": kv_bytes,
            "kv_needed_gib": parsed["kv_needed_gib"],
            "kv_available_gib": parsed["kv_available_gib"],
            "estimated_max_model_len": parsed["estimated_max_model_len"],
        },
        "model": {k: plan["model"][k] for k in ("calibration", "a", "b", "kib_per_token")},
        "plan": {"max_model_len": chosen, "memory_gib": memory, "kv_tokens": predicted},
        "reported": {
            "kv_tokens": reported,
            "max_concurrency": second["max_concurrency"],
            "max_model_len": second["concurrency_max_model_len"],
        },
        "plan_vs_estimate": chosen / parsed["estimated_max_model_len"],
        "relative_error": abs(predicted - reported) / reported,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=18150)
    parser.add_argument("--timeout", type=int, default=240)
    parser.add_argument("--save-logs", type=Path)
    parser.add_argument("--model", choices=["hybrid", "plain"], default="hybrid")
    parser.add_argument("--part", choices=["all", "calibration", "error"], default="all")
    args = parser.parse_args()
    if not BOOT.exists() or shutil.which("curl") is None:
        print(f"needs {BOOT} and curl (the lab's vLLM CPU build)", file=sys.stderr)
        return 2
    ok = True
    if args.part in ("all", "calibration"):
        result = run(args.port, args.timeout, args.save_logs, args.model)
        print(json.dumps(result, indent=2))
        print(
            f"predicted {result['predicted']['kv_tokens']:,} tokens at {PREDICT[0]} GiB /"
            f" {PREDICT[1]:,}; vLLM reported {result['reported']['kv_tokens']:,}; error"
            f" {result['relative_error']:.4%} (one boot, uncalibrated:"
            f" {result['uncalibrated_relative_error']:.2%})"
        )
        ok = result["relative_error"] <= 0.01
    if args.part in ("all", "error"):
        failed = run_error(args.port, args.timeout, args.save_logs)
        print(json.dumps(failed, indent=2))
        print(
            f"error-calibrated ({failed['model']['calibration']}): vLLM refused"
            f" {failed['error']['max_model_len']:,} and estimated"
            f" {failed['error']['estimated_max_model_len']:,}; planned"
            f" {failed['plan']['max_model_len']:,} ({failed['plan_vs_estimate']:.2%} of the"
            f" estimate), predicted {failed['plan']['kv_tokens']:,} KV tokens, vLLM reported"
            f" {failed['reported']['kv_tokens']:,}; error {failed['relative_error']:.2%}"
        )
        ok = ok and failed["relative_error"] <= 0.05
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
