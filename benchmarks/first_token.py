# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Time from the start of a rollout to the first streamed token, against a bare vLLM boot.

A: run site.yml --tags fabric,rollout with the recipe changed in one place
   (max_model_len pinned 1024 below the served one, so the new boot is
   recognisable in /v1/models) and poll the lab endpoint until the new boot
   streams its first token; then roll the inventory's recipe back (timed the
   same way: B).
C: `lab/bin/vllm-boot` (a bare `vllm serve` of the same tiny model, TP=1, on
   this same machine, no orchestration) from launch to its first streamed token.
Prints the three times and the ratios A/C and B/C from one run. Needs `make lab`.

    .venv/bin/python benchmarks/first_token.py
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.harness import (
    ROOT,
    LabError,
    PlaybookRun,
    inventory_recipe,
    lab_up,
    rollout,
    run,
    served_max_model_len,
    streams_a_token,
)

BARE_PORT = 18150
BOOT = ROOT / "lab" / "bin" / "vllm-boot"


def timed_rollout(recipe: dict[str, Any], serves: int) -> tuple[float, int]:
    """Seconds from the start of the rollout to the first token of a boot serving ``serves``."""
    result: dict[str, PlaybookRun | BaseException] = {}

    def roll() -> None:
        try:
            result["run"] = rollout(recipe)
        except LabError as err:
            result["error"] = err

    started = time.monotonic()
    thread = threading.Thread(target=roll)
    thread.start()
    first = None
    while first is None:
        if served_max_model_len() == serves and streams_a_token(timeout=10):
            first = time.monotonic() - started
            break
        if not thread.is_alive():
            break
        time.sleep(0.5)
    thread.join()
    if "error" in result:
        raise SystemExit(f"the rollout did not finish: {result['error']}")
    proc = result["run"]
    assert isinstance(proc, PlaybookRun)
    if first is None:
        print(proc.tail(), file=sys.stderr)
        raise SystemExit(f"the rollout never served a first token at max_model_len {serves}")
    return first, proc.rc


def bare_boot() -> float:
    started = time.monotonic()
    argv = [BOOT, "start", "--port", str(BARE_PORT), "--max-model-len", "4096"]
    boot = run(argv, timeout=900, check=False)
    try:
        if boot.returncode != 0:
            raise SystemExit(f"bare boot failed: {boot.stdout}{boot.stderr}")
        base = f"http://127.0.0.1:{BARE_PORT}/v1"
        while not streams_a_token(base, timeout=10):
            if time.monotonic() - started > 900:
                raise SystemExit(f"the bare boot on port {BARE_PORT} streamed no token in 900 s")
            time.sleep(0.2)
        return time.monotonic() - started
    finally:
        run([BOOT, "stop", "--port", str(BARE_PORT)], timeout=60, check=False)


def main() -> int:
    if not lab_up():
        print("needs the lab hosts spark-head and spark-worker running (make lab)", file=sys.stderr)
        return 2
    base = inventory_recipe()
    served = served_max_model_len()
    if not served:
        raise SystemExit("the lab endpoint does not answer /v1/models (make lab first)")
    variant = {**base, "max_model_len": served - 1024}
    forward, rc_forward = timed_rollout(variant, served - 1024)
    back, rc_back = timed_rollout(base, served)
    bare = bare_boot()
    print(
        f"A rollout -> first streamed token (changed recipe, TP=2 mp, Quadlet): {forward:.1f} s (rc={rc_forward})"
    )
    print(
        f"B rollout back to the inventory recipe -> first streamed token: {back:.1f} s (rc={rc_back})"
    )
    print(f"C bare vllm serve (TP=1, controller venv) -> first streamed token: {bare:.1f} s")
    print(f"ratio A/C: {forward / bare:.2f}   ratio B/C: {back / bare:.2f}")
    return 0 if rc_forward == 0 and rc_back == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
