# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The worker's disk fills up while the weights are being copied (issue 14, point 7).

The space check passes (the snapshot directory is a small tmpfs just large
enough), then another tenant takes the space before rsync writes: the weights
stage stops naming the node, rsync's reason and the fix; the running endpoint
keeps serving; once the space is back the next run finds the worker's copy
complete again and changes nothing.
"""

from __future__ import annotations

import pytest

from lab.harness import (
    HEAD,
    MODEL_SNAPSHOT,
    WORKER,
    exec_on,
    playbook_with_action,
    run_playbook,
    streams_a_token,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

SPACE_CHECK = "Check the disk space before copying anything"


def snapshot_bytes() -> int:
    out = exec_on(HEAD, "du", "-sbL", MODEL_SNAPSHOT).stdout
    return int(out.split()[0])


def test_a_disk_filled_during_the_copy_stops_the_stage_and_leaves_the_endpoint_serving():
    size = snapshot_bytes() + (1 << 20)
    exec_on(WORKER, "mount", "-t", "tmpfs", "-o", f"size={size}", "localinference-disk-full", MODEL_SNAPSHOT)
    try:
        def fill(_proc) -> None:
            exec_on(WORKER, "sh", "-c", f"cat /dev/zero > {MODEL_SNAPSHOT}/.tenant; true", timeout=60)

        run, fired = playbook_with_action(
            "weights.yml", SPACE_CHECK, fill, extra_vars={"model_weights_disk_reserve_gib": 0}, timeout=900
        )
        assert fired, run.tail()
        assert run.rc != 0
        assert f"{WORKER}: copying" in run.flat and "No space left on device" in run.flat, run.tail()
        assert "run --tags weights again" in run.flat
        assert streams_a_token(timeout=60), "the endpoint stopped serving during a failed copy"
        leftovers = exec_on(WORKER, "find", MODEL_SNAPSHOT, "-name", ".*", "-not", "-name", ".tenant",
                            "-type", "f").stdout.split()
        assert leftovers == [], f"rsync left partial files: {leftovers}"
    finally:
        exec_on(WORKER, "umount", MODEL_SNAPSHOT, check=False)
    again = run_playbook("weights.yml", timeout=900)
    assert again.rc == 0, again.tail()
    assert again.recap[WORKER]["changed"] == 0, again.tail()
