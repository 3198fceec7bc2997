# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Time from the start of a rollout to the first streamed token, against a bare vLLM boot.

A: run site.yml --tags fabric,rollout with the inventory's recipe changed in one place
   (max_model_len minus 1024, so the new boot is recognisable in /v1/models) and
   poll the lab endpoint until the new boot streams its first token; then roll
   the inventory's recipe back (timed the same way: B).
C: `lab/bin/vllm-boot` (a bare `vllm serve` of the same tiny model, TP=1, on
   this same machine, no orchestration) from launch to its first streamed token.
Prints the three times and the ratios A/C and B/C from one run. Needs `make lab`.

    .venv/bin/python benchmarks/first_token.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time

from _lab import ROOT, inventory_recipe, served_max_model_len, streamed_token

BARE_PORT = 18150


def timed_rollout(recipe: dict) -> tuple[float, int]:
    """Seconds from the start of the rollout to the first token of the boot serving ``recipe``."""
    with tempfile.NamedTemporaryFile(
        "w", suffix=".json", dir=ROOT / ".lab", delete=False
    ) as handle:
        json.dump({"vllm_recipe": recipe}, handle)
    result: dict[str, object] = {}

    def run() -> None:
        from _lab import ansible_playbook

        # site.yml's fabric stage publishes cluster_network_env for the rollout.
        result["seconds"], result["proc"] = ansible_playbook(
            str(ROOT / "playbooks" / "site.yml"),
            "--tags",
            "fabric,rollout",
            "-e",
            f"@{handle.name}",
        )

    started = time.monotonic()
    thread = threading.Thread(target=run)
    thread.start()
    first = None
    while thread.is_alive() or first is None:
        if served_max_model_len() == recipe["max_model_len"] and streamed_token(timeout=10):
            first = time.monotonic() - started
            break
        if not thread.is_alive():
            break
        time.sleep(0.5)
    thread.join()
    proc = result["proc"]
    if first is None:
        print(proc.stdout[-3000:], file=sys.stderr)
        raise SystemExit("the rollout never served a first token")
    return first, proc.returncode


def bare_boot() -> float:
    started = time.monotonic()
    boot = subprocess.run(
        [
            str(ROOT / "lab" / "bin" / "vllm-boot"),
            "start",
            "--port",
            str(BARE_PORT),
            "--max-model-len",
            "4096",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    try:
        if boot.returncode != 0:
            raise SystemExit(f"bare boot failed: {boot.stdout}{boot.stderr}")
        base = f"http://127.0.0.1:{BARE_PORT}"
        while not streamed_token(base, timeout=10):
            time.sleep(0.2)
        return time.monotonic() - started
    finally:
        subprocess.run(
            [str(ROOT / "lab" / "bin" / "vllm-boot"), "stop", "--port", str(BARE_PORT)], check=False
        )


def main() -> int:
    base = inventory_recipe()
    if not isinstance(base.get("max_model_len"), int):
        raise SystemExit("the lab recipe's max_model_len must be a number for this benchmark")
    variant = {**base, "max_model_len": base["max_model_len"] - 1024}
    forward, rc_forward = timed_rollout(variant)
    back, rc_back = timed_rollout(base)
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
