# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every benchmark in one run (`make bench`): their reports, the ratios, and .lab/bench.json.

Parts, in this order (``--only`` picks some):

- ``verify``: benchmarks/manifest_verify.py (no lab needed)
- ``rollout``: benchmarks/first_token.py (the lab; puts the inventory's recipe back)
- ``watchdog``: benchmarks/watchdog_recovery.py (the lab; a wedged TP rank recovered by
  the head's watchdog against a plain restart of the units; the watchdog runs after it)
- ``noop``: benchmarks/rollout_noop.py (the lab; after the rollout and watchdog parts it
  also proves the lab was put back: 0 changed, 0 restarts)
- ``kv``: benchmarks/kv_calibration.py (five CPU vLLM boots on the controller)
- ``growth``: benchmarks/growth.py (the two-host lab and the three-host one, which
  it brings up with `make scale-up` and removes afterwards unless it was up)

bench.json holds the headline ratios with the two times each was made of, the
profile breakdowns, the machine (CPUs, load average at the start of the run and
of each part), the git commit, and each part's whole result. A part that fails
is recorded with its error and the others still run; the exit code is then 1. A part
that returns without its figures (benchmarks/_measured.py) failed: it measured nothing.
With ``--lock FILE`` (or ``LOCALINFERENCE_LAB_LOCK``) the lab parts run holding
``flock`` on FILE, the lock other users of the shared lab take.

    .venv/bin/python benchmarks/bench.py [--only verify,rollout,watchdog,noop,kv,growth] [--output .lab/bench.json] [--short]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import (
    first_token,
    growth,
    kv_calibration,
    manifest_verify,
    rollout_noop,
    watchdog_recovery,
)
from benchmarks._measured import MEASURES, unmeasured
from lab.harness import LAB_DIR, ROOT, LabError, lab_up

PARTS = ("verify", "rollout", "watchdog", "noop", "kv", "growth")
LAB_PARTS = ("rollout", "watchdog", "noop", "growth")
# --short: the same measures on less data (the ratios stay meaningful, the figures noisier)
SHORT_VERIFY = {"files": 4, "file_mib": 64, "small_files": 200, "rounds": 1, "growth": False}
# (bench.json key, the two times it is made of, goal, how it reads)
HEADLINES = (
    ("rollout_first_token_ratio", ("rollout_seconds", "by_hand_tp2_seconds"), "<= 1.3 (1.15)",
     "rollout -> first token / the units' command by hand (TP=2)"),
    ("rollout_first_token_ratio_cold", ("rollout_seconds", "by_hand_tp2_cold_seconds"), "<= 1.3 (1.15)",
     "the same / by hand after the operator's page-cache drop (F4)"),
    ("noop_ratio", ("noop_seconds", "gather_facts_seconds"), "<= 2.5 (2)",
     "no-op site.yml / a fact-gathering play"),
    ("verify_ratio", ("cat_seconds", "verify_seconds"), ">= 0.8",
     "full verify rate / cat > /dev/null rate (cold)"),
    ("reverify_ms_per_100_files", (), "< 1000", "no-change re-verify, ms per 100 files"),
    ("watchdog_detect_seconds", ("watchdog_detect_goal_seconds",), "<= 2 x interval",
     "kill -STOP of the worker's TP rank -> the watchdog's wedge verdict"),
    ("watchdog_recover_ratio", ("watchdog_recover_seconds", "plain_restart_seconds"), "<= 1.3",
     "the wedge verdict -> next streamed token / a plain restart of the units"),
)


def git_commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
        )
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "-uno"))}


def machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


@contextlib.contextmanager
def lab_lock(path: str | None) -> Iterator[None]:
    if not path:
        yield
        return
    with open(path, "a") as handle:
        print(f"waiting for the lab lock {path} ...", flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def kv_part() -> dict[str, Any]:
    calibration = kv_calibration.run()
    error = kv_calibration.run_error(18150, 240)
    return {
        "calibration_relative_error": round(calibration["relative_error"], 4),
        "error_calibration_relative_error": round(error["relative_error"], 4),
        "calibration": calibration,
        "error_calibration": error,
    }


def kv_report(result: dict[str, Any]) -> str:
    return (
        f"KV model: calibrated prediction error {result['calibration_relative_error']:.2%};"
        f" error-calibrated plan error {result['error_calibration_relative_error']:.2%}"
    )


class LoadSampler:
    """The 1-minute load average every few seconds while a part runs (others share the machine)."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self.samples: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self.stop.wait(self.every):
                return

    def __enter__(self) -> LoadSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def summary(self) -> dict[str, float]:
        return {
            "mean": round(statistics.fmean(self.samples), 2),
            "max": round(max(self.samples), 2),
        }


def run_part(
    name: str, measure: Callable[[], dict[str, Any]], report: Callable[[dict[str, Any]], str]
) -> dict[str, Any]:
    print(f"=== {name} (load average {os.getloadavg()[0]:.2f}) ===", flush=True)
    load = round(os.getloadavg()[0], 2)
    started = time.monotonic()
    with LoadSampler() as sampler:
        try:
            result = measure()
        except (LabError, RuntimeError, SystemExit, OSError) as err:
            print(f"{name} failed: {err}", file=sys.stderr, flush=True)
            result = {"error": str(err) or type(err).__name__}
        except Exception as err:  # a bug in a benchmark: recorded, the other parts still run
            traceback.print_exc()
            result = {"error": f"{type(err).__name__}: {err}"}
    missing = [] if "error" in result else unmeasured(result, MEASURES[name])
    if missing:  # a part that ran without its figures measured nothing: a failure, not a pass
        print(f"{name} failed: measured nothing for {', '.join(missing)}", file=sys.stderr, flush=True)
        result = {"error": f"measured nothing for {', '.join(missing)}", "result": result}
    result.setdefault("load_at_start", load)
    result["load_during"] = sampler.summary()
    if "error" in result:
        return result
    result.pop("_tail", None)
    result["part_seconds"] = round(time.monotonic() - started, 1)
    print(
        f"({name}: {result['part_seconds']:.0f} s; load average during it: mean"
        f" {result['load_during']['mean']}, max {result['load_during']['max']})"
    )
    print(report(result), flush=True)
    return result


def headline(document: dict[str, Any]) -> str:
    lines = [f"{'ratio':<32}{'value':>8}  {'goal':<15}{'load':>6}  {'made of':<56}what"]
    for key, times, goal, what in HEADLINES:
        value = document.get(key)
        made = ", ".join(f"{t}={document[t]}" for t in times if t in document)
        shown = f"{value:.2f}" if isinstance(value, (int, float)) else "n/a"
        load = (document.get("load_during", {}).get(key) or {}).get("mean")
        load_shown = f"{load:.1f}" if load is not None else ""
        lines.append(f"{key:<32}{shown:>8}  {goal:<15}{load_shown:>6}  {made:<56}{what}")
    lines.append("(load: the mean 1-minute load average while the part that measured it ran)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.splitlines()[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    parser.add_argument("--output", type=Path, default=LAB_DIR / "bench.json")
    parser.add_argument("--lock", default=os.environ.get("LOCALINFERENCE_LAB_LOCK") or None)
    parser.add_argument("--top", type=int, default=15, help="slowest tasks kept per breakdown")
    parser.add_argument("--short", action="store_true",
                        help="the short form CI runs (`make bench-smoke`): the verify part on"
                             f" {SHORT_VERIFY['files']} x {SHORT_VERIFY['file_mib']} MiB, one cold round")
    args = parser.parse_args()
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"--only: unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    if not parts:
        parser.error(f"--only: no part named; choose from {', '.join(PARTS)}")

    document: dict[str, Any] = {
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "git": git_commit(),
        "nodes": {"measured": 2, "three_hosts": rollout_noop.THREE_HOSTS},
        "parts": {},
    }
    results = document["parts"]
    if "verify" in parts:
        verify = functools.partial(manifest_verify.measure, **(SHORT_VERIFY if args.short else {}))
        results["verify"] = run_part("verify", verify, manifest_verify.report)
    lab_parts = [p for p in LAB_PARTS if p in parts]
    if lab_parts and not lab_up():
        for part in lab_parts:
            results[part] = {"error": "the lab hosts spark-head and spark-worker are not running (make lab)"}
        lab_parts = []
    with lab_lock(args.lock if lab_parts else None):
        if "rollout" in lab_parts:
            results["rollout"] = run_part(
                "rollout", lambda: first_token.measure(args.top), first_token.report
            )
        if "watchdog" in lab_parts:
            results["watchdog"] = run_part(
                "watchdog", watchdog_recovery.measure, watchdog_recovery.report
            )
        if "noop" in lab_parts:
            results["noop"] = run_part(
                "noop", lambda: rollout_noop.measure(top=args.top), rollout_noop.report
            )
        if "growth" in lab_parts:
            results["growth"] = run_part("growth", growth.measure, growth.report)
    if "kv" in parts:
        results["kv"] = run_part("kv", kv_part, kv_report)

    for result in results.values():
        for key, _times, _goal, _what in HEADLINES:
            if key in result:
                document[key] = result[key]
                document.update({t: result[t] for t in _times if t in result})
                document.setdefault("load_during", {})[key] = result.get("load_during")
    if "growth_per_added_node" in results.get("growth", {}):
        document["nodes"] = {
            "measured": [2, 3],
            "growth_per_added_node": results["growth"]["growth_per_added_node"],
        }
    for key in ("noop_breakdown", "rollout_breakdown"):
        for result in results.values():
            if key in result:
                document[key] = result[key]
    if "noop" in results and "noop_seconds" in results["noop"]:
        noop = results["noop"]
        document["noop_changed"] = noop["changed"]
        document["noop_restarts"] = noop["restarts"]
    document["ended_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    document["failed_parts"] = sorted(name for name, r in results.items() if "error" in r)

    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(args.output)
    load = document["machine"]["load_average_at_start"]
    print(f"=== ratios ({document['machine']['nproc']} CPUs, load average {load[0]} at start,"
          f" commit {document['git']['commit'][:12]}{' (dirty)' if document['git']['dirty'] else ''}) ===")
    print(headline(document))
    print(f"written: {args.output}")
    if document["failed_parts"]:
        print(f"failed parts: {', '.join(document['failed_parts'])}", file=sys.stderr)
        return 1
    noop = results.get("noop", {})
    return 1 if noop.get("changed") or noop.get("restarts") else 0


if __name__ == "__main__":
    sys.exit(main())
