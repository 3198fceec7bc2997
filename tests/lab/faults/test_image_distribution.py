# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving image, like the weights, against the real lab (roles/serve/tasks/image.yml).

The lab's nodes normally see the controller's image store read-only
(``additionalimagestores``, molecule/default/create.yml): there the rollout's
digest check runs on every node and copies nothing. These tests hide that store
from the worker (an empty directory bind-mounted over it, removed afterwards),
so the worker has only what the collection gives it:

- a worker holding another image under the recipe's name, with the copy
  switched off, is refused by name before any unit is touched;
- (extended) the worker gets the head's copy as an OCI archive over the
  cluster link, loads it, and its digest is checked; a second run copies
  nothing.

The lab has no registry at all (the image is built locally, lab/bin/vllm-image),
so every rollout here is an air-gapped one.
"""

from __future__ import annotations

import re
import time

import pytest

from lab.harness import HEAD, VLLM_UNIT, WORKER, exec_on, inventory_recipe, rollout, streams_a_token

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

OTHER = "localhost/localinference-lab-other:1"
IMAGES = "/var/lib/localinference/images"
COPY_TASK = "Image | Copy the OCI archive from the head over the cluster link"


def _pinned() -> str:
    return str(inventory_recipe()["image"])


def _active_since(host: str) -> str:
    return exec_on(
        host, "systemctl", "show", "-p", "ActiveEnterTimestamp", "--value", VLLM_UNIT
    ).stdout


@pytest.fixture
def worker_without_shared_store(shared_store_hidden):
    """The worker sees only its own store; its copy and the archives go afterwards."""
    try:
        yield
    finally:
        # Without --force: a container started from the worker's own copy keeps it (4 GB).
        # Before the shared store comes back (shared_store_hidden's teardown).
        exec_on(WORKER, "podman", "rmi", _pinned(), check=False, timeout=300)
        for host in (HEAD, WORKER):
            exec_on(host, "sh", "-c", f"rm -f {IMAGES}/*.oci.tar*", check=False)


@pytest.fixture
def other_images():
    """A 1-file image on the head (pinned by the test's recipe) and another under its name on the worker."""
    made = {}
    for host, content in ((HEAD, "pinned"), (WORKER, "other")):
        exec_on(host, "sh", "-c", f"cd /tmp && echo {content} > {content} && tar cf {content}.tar {content}"
                f" && podman import -q {content}.tar {OTHER}")  # fmt: skip
        made[host] = exec_on(
            host, "podman", "image", "inspect", "--format", "{{.Digest}}", OTHER
        ).stdout.strip()
    try:
        yield made
    finally:
        for host in (HEAD, WORKER):
            exec_on(host, "podman", "rmi", "--ignore", OTHER, check=False, timeout=120)


def test_worker_image_with_another_digest_is_refused_by_name(other_images):
    pinned = f"{OTHER}@{other_images[HEAD]}"
    head_since, worker_since = _active_since(HEAD), _active_since(WORKER)

    run = rollout({**inventory_recipe(), "image": pinned}, tags="rollout",
                  extra_vars={"serve_image_distribute": False}, timeout=900)  # fmt: skip

    assert run.rc != 0, run.tail()
    assert re.search(
        rf"spark-worker has {re.escape(OTHER)} with digest {re.escape(other_images[WORKER])}, "
        rf"not {re.escape(other_images[HEAD])}",
        run.flat,
    ), run.tail()
    assert "fatal: [spark-head]" not in run.stdout, "the head's image was refused too"
    assert "TASK [localinference.vllm.serve : Apply" not in run.stdout, "a node was changed"
    assert (_active_since(HEAD), _active_since(WORKER)) == (head_since, worker_since), (
        "a unit was touched"
    )


# 4 min 28 s on the 2-core development lab: the head's podman save --uncompressed of the
# 4.04 GB image 83 s (the digest kept), rsync over the cluster link 39 s, podman load on
# the worker 51 s; the first rollout 227 s (it restarted the cluster), a second that copies
# nothing. The worker keeps its loaded copy while its container runs from it.
@pytest.mark.extended
def test_worker_gets_the_image_from_the_head_over_the_cluster_link(worker_without_shared_store):
    pinned = _pinned()
    missing = exec_on(WORKER, "podman", "image", "exists", pinned, check=False)
    assert missing.returncode != 0, "the worker still sees the shared store"

    started = time.monotonic()
    first = rollout(
        tags="rollout",
        timeout=1800,
        env={"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"},
    )
    seconds = time.monotonic() - started
    # profile_tasks' summary: the image tasks' own times.
    print(
        "\n"
        + "\n".join(
            line for line in first.stdout.splitlines() if "Image |" in line and " -- " in line
        )
    )

    assert first.rc == 0, first.tail()
    assert re.search(rf"TASK \[[^\]]*{re.escape(COPY_TASK)}\]", first.stdout), first.tail()
    digest = exec_on(
        WORKER, "podman", "image", "inspect", "--format", "{{.Digest}}", pinned
    ).stdout.strip()
    assert digest == pinned.partition("@")[2]
    assert (
        exec_on(WORKER, "sh", "-c", f"ls {IMAGES}/*.oci.tar 2>/dev/null", check=False).stdout == ""
    ), "the worker kept its copy of the archive after loading it"
    print(f"\nfirst rollout with the copy: {seconds:.0f} s")

    second = rollout(tags="rollout", timeout=900)
    assert second.rc == 0, second.tail()
    assert not re.search(
        rf"changed: \[spark-worker\][^\n]*\n?[^\n]*{re.escape(COPY_TASK)}", second.stdout
    )
    copy_block = second.stdout.split(COPY_TASK)
    assert len(copy_block) == 1 or "skipping" in copy_block[1][:400], (
        "the second run copied the image again"
    )
    assert streams_a_token(timeout=60)
