# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Time from the start of a rollout to the first streamed token, against a boot by hand.

A: run site.yml --tags rollout (what an operator runs to change the recipe of
   a cluster set up before: the rollout reads each node's saved fabric result)
   with the recipe changed in one place
   (max_model_len pinned 1024 below the served one, so the new boot is
   recognisable in /v1/models) and poll the lab endpoint until the new boot
   streams its first token; then roll the inventory's recipe back (timed the
   same way: B). Both rollouts are profiled (ansible.posix.profile_tasks and
   the per-host task_timing callback): the breakdown says where the seconds go.
H: the fair baseline. The exact `podman run` command each host's unit runs
   (the container's CreateCommand: the Quadlet unit's ExecStart), started by
   hand on the same two lab hosts with the units stopped and no orchestration
   (`podman exec HOST podman run -d ...` on both at once, TP=2 over `mp`),
   from launch to the first token streamed through the same ingress. Then the
   by-hand containers are removed and the normal rollout brings the units back
   (timed too: R, a rollout from stopped units) and must serve again.
C: `lab/bin/vllm-boot` (a bare `vllm serve` of the same tiny model, TP=1, in
   the controller's venv, no orchestration): the older, unfair baseline.
Prints the times and the ratios A/H, B/H (and A/C, B/C) from one run. Needs
`make lab`; everything it changes is put back (the inventory's recipe serves).

    .venv/bin/python benchmarks/first_token.py [--skip-bare] [--top 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._measured import exit_code
from benchmarks._profile import breakdown, format_breakdown, profiled
from lab.harness import (
    HEAD,
    HOSTS,
    MODEL,
    ROOT,
    VLLM_UNIT,
    WORKER,
    LabError,
    PlaybookRun,
    exec_on,
    inventory_recipe,
    lab_up,
    module_utils,
    rollout,
    run,
    served_max_model_len,
    streams_a_token,
)

BARE_PORT = 18150
BOOT = ROOT / "lab" / "bin" / "vllm-boot"
POLL_SECONDS = 0.25
# The rollout stage alone; the fabric stage's saved result gives it the cluster link.
ROLLOUT_TAGS = "rollout"
BOOT_TIMEOUT = 900
# How long the lab may take to serve again before the benchmark starts.
SETTLE_TIMEOUT = 300
UNIT_CONTAINER = module_utils("serve._units").SERVER_UNIT
BY_HAND_CONTAINER = "localinference-bench-by-hand"
# What Quadlet adds for systemd alone (the cid file, cgroup split, sd_notify).
SYSTEMD_ONLY_PREFIXES = ("--cidfile", "--cgroups", "--sdnotify")


def timed_rollout(
    recipe: dict[str, Any] | None,
    serves: int,
    env: dict[str, str] | None = None,
    *,
    inventory: Path | None = None,
    base: str | None = None,
    model: str = MODEL,
) -> tuple[float, PlaybookRun]:
    """Seconds from the start of the rollout to the first token of a boot serving ``serves``.

    ``inventory``, ``base`` and ``model``: another lab's (benchmarks/growth.py), else this one's.
    """
    result: dict[str, PlaybookRun | BaseException] = {}

    def roll() -> None:
        try:
            result["run"] = rollout(recipe, tags=ROLLOUT_TAGS, env=env, inventory=inventory)
        except LabError as err:
            result["error"] = err

    started = time.monotonic()
    thread = threading.Thread(target=roll)
    thread.start()
    first = None
    while first is None and time.monotonic() - started < BOOT_TIMEOUT:
        if served_max_model_len(base) == serves and streams_a_token(base, model, timeout=10):
            first = time.monotonic() - started
            break
        if not thread.is_alive():
            break
        time.sleep(POLL_SECONDS)
    thread.join()
    if "error" in result:
        raise LabError(f"the rollout did not finish: {result['error']}")
    proc = result["run"]
    assert isinstance(proc, PlaybookRun)
    if first is None:
        raise LabError(
            f"the rollout never served a first token at max_model_len {serves}:\n{proc.tail()}"
        )
    return first, proc


def profiled_rollout(
    label: str, recipe: dict[str, Any] | None, serves: int, top: int
) -> tuple[float, PlaybookRun, dict[str, Any]]:
    with profiled(label) as profiler:
        seconds, proc = timed_rollout(recipe, serves, profiler.env)
        profiler.keep_log(proc.stdout)
        return seconds, proc, breakdown(proc.stdout, profiler.timings(), proc.seconds, top)


def unit_argv(host: str) -> list[str]:
    """The exact argv that started the unit's container on ``host`` (podman's CreateCommand)."""
    done = exec_on(
        host, "podman", "container", "inspect", UNIT_CONTAINER,
        "--format", "{{json .Config.CreateCommand}}",
    )
    try:
        argv = json.loads(done.stdout)
    except ValueError:
        raise LabError(f"{host}: no CreateCommand for {UNIT_CONTAINER}: {done.stdout[:300]}") from None
    if not isinstance(argv, list) or argv[1:2] != ["run"]:
        raise LabError(f"{host}: {UNIT_CONTAINER} was not made by podman run: {argv!r}")
    return argv


def by_hand_argv(argv: list[str]) -> list[str]:
    """The unit's command without its systemd plumbing, under a name of its own."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            out.append(BY_HAND_CONTAINER)
            skip = False
        elif arg == "--name":
            out.append(arg)
            skip = True
        elif arg.startswith("--name="):
            out.append(f"--name={BY_HAND_CONTAINER}")
        elif not arg.startswith(SYSTEMD_ONLY_PREFIXES):
            out.append(arg)
    if "-d" not in out and "--detach" not in out:
        out.insert(2, "-d")
    return out


def remove_by_hand() -> None:
    for host in HOSTS:
        exec_on(host, "podman", "rm", "-f", "-t", "10", BY_HAND_CONTAINER, check=False, timeout=120)


def server_started_at(head: str = HEAD) -> float:
    """The head's server unit's last start, as the controller's epoch seconds (the lab hosts share its clock)."""
    out = exec_on(head, "systemctl", "show", "-p", "ExecMainStartTimestamp", "--value", VLLM_UNIT).stdout.strip()
    return float(exec_on(head, "date", "-d", out, "+%s.%N").stdout.strip())


def by_hand_boot(argvs: dict[str, list[str]], serves: int, cold: bool = False) -> dict[str, Any]:
    """The units' own commands (``argvs``) started by hand on both hosts: launch -> first streamed token.

    ``serves`` is the max_model_len the boot must serve (read while the units ran).
    ``cold``: first what an operator of unified memory does by hand before a start
    (BRIEF, F4: ``sync; echo 3 > /proc/sys/vm/drop_caches``) on both hosts, inside the
    timed span, as the rollout's memory admission does in its ExecStartPre.
    """
    for host in (HEAD, WORKER):
        exec_on(host, "systemctl", "stop", VLLM_UNIT, timeout=180)
    if streams_a_token(timeout=10):
        raise LabError("the endpoint still streams with the units stopped: the baseline would lie")
    errors: dict[str, BaseException] = {}

    def launch(host: str) -> None:
        try:
            if cold:
                exec_on(host, "sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches", timeout=120)
            exec_on(host, *argvs[host], timeout=300)
        except LabError as err:
            errors[host] = err

    load = os.getloadavg()[0]
    try:
        started = time.monotonic()
        launches = [threading.Thread(target=launch, args=(h,)) for h in (WORKER, HEAD)]
        for thread in launches:
            thread.start()
        first = None
        while first is None and time.monotonic() - started < BOOT_TIMEOUT:
            if served_max_model_len() == serves and streams_a_token(timeout=10):
                first = time.monotonic() - started
                break
            if errors:
                break
            time.sleep(POLL_SECONDS)
        for thread in launches:
            thread.join()
        if errors or first is None:
            raise LabError(f"the by-hand boot streamed no token: {errors or 'timeout'}")
    finally:
        remove_by_hand()
    return {"seconds": first, "load_at_start": round(load, 2), "argv": argvs}


def bare_boot() -> float:
    started = time.monotonic()
    argv = [BOOT, "start", "--port", str(BARE_PORT), "--max-model-len", "4096"]
    boot = run(argv, timeout=BOOT_TIMEOUT, check=False)
    try:
        if boot.returncode != 0:
            raise LabError(f"bare boot failed: {boot.stdout}{boot.stderr}")
        base = f"http://127.0.0.1:{BARE_PORT}/v1"
        while not streams_a_token(base, timeout=10):
            if time.monotonic() - started > BOOT_TIMEOUT:
                raise LabError(f"the bare boot on port {BARE_PORT} streamed no token in 900 s")
            time.sleep(POLL_SECONDS)
        return time.monotonic() - started
    finally:
        run([BOOT, "stop", "--port", str(BARE_PORT)], timeout=60, check=False)


def wait_for_service(timeout: float = SETTLE_TIMEOUT) -> int:
    """The served max_model_len once the lab streams (a unit may still be restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        served = served_max_model_len()
        if served and streams_a_token(timeout=10):
            return served
        if time.monotonic() > deadline:
            raise LabError(
                f"the lab endpoint did not stream a token within {timeout:g} s (make lab first)"
            )
        time.sleep(2)


def measure(top: int = 15, bare: bool = True) -> dict[str, Any]:
    """A, B, H (with the restoring rollout R) and C; raises LabError when a step fails."""
    base = inventory_recipe()
    served = wait_for_service()
    result: dict[str, Any] = {"load_at_start": round(os.getloadavg()[0], 2)}
    variant = {**base, "max_model_len": served - 1024}
    try:
        started_wall = time.time()
        forward, run_a, result["rollout_breakdown"] = profiled_rollout(
            "rollout-changed", variant, served - 1024, top
        )
        # Where A's seconds go: before the head's server starts, and the engine's boot.
        result["rollout_before_engine_seconds"] = round(server_started_at() - started_wall, 2)
        result["rollout_engine_boot_seconds"] = round(forward - result["rollout_before_engine_seconds"], 2)
    finally:  # the inventory's recipe comes back even when the changed one failed
        back, run_b, result["rollout_back_breakdown"] = profiled_rollout(
            "rollout-back", base, served, top
        )
    try:
        # Read while the units run (Quadlet removes the container when its unit stops).
        argvs = {host: by_hand_argv(unit_argv(host)) for host in HOSTS}
        hand = by_hand_boot(argvs, served)
        # The same, after the page-cache drop an operator of unified memory makes by hand first.
        hand_cold = by_hand_boot(argvs, served, cold=True)
    finally:
        # The normal rollout brings the stopped units back, whatever happened above.
        restore, run_r, result["restore_rollout_breakdown"] = profiled_rollout(
            "rollout-restore", base, served, top
        )
    if served_max_model_len() != served or not streams_a_token(timeout=30):
        raise LabError("after the by-hand boot the rollout did not bring the inventory's recipe back")
    result.update(
        {
            "rollout_seconds": round(forward, 2),
            "rollout_back_seconds": round(back, 2),
            "rollout_rc": run_a.rc,
            "rollout_back_rc": run_b.rc,
            "rollout_playbook_seconds": round(run_a.seconds, 2),
            "by_hand_tp2_seconds": round(hand["seconds"], 2),
            "by_hand_load_at_start": hand["load_at_start"],
            "by_hand_argv": hand["argv"],
            "by_hand_tp2_cold_seconds": round(hand_cold["seconds"], 2),
            "by_hand_cold_load_at_start": hand_cold["load_at_start"],
            "restore_rollout_seconds": round(restore, 2),
            "restore_rollout_rc": run_r.rc,
            "rollout_first_token_ratio": round(forward / hand["seconds"], 2),
            "rollout_back_ratio": round(back / hand["seconds"], 2),
            "rollout_first_token_ratio_cold": round(forward / hand_cold["seconds"], 2),
            "rollout_back_ratio_cold": round(back / hand_cold["seconds"], 2),
        }
    )
    if bare:
        seconds = bare_boot()
        result["bare_tp1_seconds"] = round(seconds, 2)
        result["rollout_first_token_ratio_tp1"] = round(forward / seconds, 2)
        result["rollout_back_ratio_tp1"] = round(back / seconds, 2)
    return result


def report(result: dict[str, Any]) -> str:
    hand = result["by_hand_tp2_seconds"]
    lines = [
        f"A rollout -> first streamed token (changed recipe, TP=2 mp, Quadlet):"
        f" {result['rollout_seconds']:.1f} s (rc={result['rollout_rc']}; the playbook ran"
        f" {result['rollout_playbook_seconds']:.1f} s)",
        f"B rollout back to the inventory recipe -> first streamed token:"
        f" {result['rollout_back_seconds']:.1f} s (rc={result['rollout_back_rc']})",
        f"H the units' own podman run, started by hand on both hosts (TP=2 mp, no orchestration)"
        f" -> first streamed token: {hand:.1f} s (load {result['by_hand_load_at_start']:.1f})",
        f"H' the same after `sync; echo 3 > /proc/sys/vm/drop_caches` on both hosts (what an operator of"
        f" unified memory does by hand before a start, F4; the rollout's admission does it too)"
        f" -> first streamed token: {result['by_hand_tp2_cold_seconds']:.1f} s"
        f" (load {result['by_hand_cold_load_at_start']:.1f})",
        f"R the rollout bringing the stopped units back -> first streamed token:"
        f" {result['restore_rollout_seconds']:.1f} s (rc={result['restore_rollout_rc']})",
    ]
    lines.append(
        f"A's seconds: {result['rollout_before_engine_seconds']:.1f} s before the head's server started"
        f" (playbook start, plan, staging, stop and replace, the workers' start), then"
        f" {result['rollout_engine_boot_seconds']:.1f} s of the engine's boot (H {hand:.1f} s by hand,"
        f" H' {result['by_hand_tp2_cold_seconds']:.1f} s after the drop)"
    )
    if "bare_tp1_seconds" in result:
        lines.append(
            f"C bare vllm serve (TP=1, controller venv) -> first streamed token:"
            f" {result['bare_tp1_seconds']:.1f} s"
        )
    lines.append(
        f"RATIO A/H: {result['rollout_first_token_ratio']:.2f}   B/H:"
        f" {result['rollout_back_ratio']:.2f}   (goal <= 1.3, stretch 1.15)"
    )
    lines.append(
        f"ratio A/H': {result['rollout_first_token_ratio_cold']:.2f}   B/H':"
        f" {result['rollout_back_ratio_cold']:.2f}   (both boots after the page-cache drop)"
    )
    if "bare_tp1_seconds" in result:
        lines.append(
            f"ratio A/C: {result['rollout_first_token_ratio_tp1']:.2f}   B/C:"
            f" {result['rollout_back_ratio_tp1']:.2f}   (TP=1 baseline, for comparison with earlier runs)"
        )
    lines.append(format_breakdown("rollout A", result["rollout_breakdown"]))
    lines.append(format_breakdown("rollout B", result["rollout_back_breakdown"]))
    lines.append(
        "nodes: measured on the two lab hosts; the three-host scenario (make test-scale) lives"
        " only during its own test, so the rollout overhead's growth with nodes is not measured"
        " (per-host task time above)"
    )
    return "\n".join(lines)


def ok(result: dict[str, Any]) -> bool:
    return not (result["rollout_rc"] or result["rollout_back_rc"] or result["restore_rollout_rc"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-bare", action="store_true", help="leave out the TP=1 bare boot (C)")
    parser.add_argument("--top", type=int, default=15, help="how many of the slowest tasks to show")
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()
    if not lab_up():
        print("needs the lab hosts spark-head and spark-worker running (make lab)", file=sys.stderr)
        return 2
    try:
        result = measure(args.top, not args.skip_bare)
    except LabError as err:
        print(err, file=sys.stderr)
        return 1
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return exit_code("rollout", result, ok(result))


if __name__ == "__main__":
    sys.exit(main())
