# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fault tests cause failures on purpose; the head's watchdog would recover them in the
middle of the test. Every fault test but the watchdog's own (marker ``watchdog``) runs with
the watchdog stopped, and it is started again afterwards when it was running before."""

from __future__ import annotations

import pytest

from lab.harness import HEAD, WATCHDOG_UNIT, WORKER, exec_on, lab_up, watchdog_active

# The controller's image store, which the lab hosts see read-only (additionalimagestores).
SHARED_STORE = "/var/lib/lab-images"


@pytest.fixture(autouse=True)
def watchdog_paused(request: pytest.FixtureRequest):
    if request.node.get_closest_marker("watchdog") or not lab_up():
        yield
        return
    running = watchdog_active()
    if running:
        exec_on(HEAD, "systemctl", "stop", WATCHDOG_UNIT)
    try:
        yield
    finally:
        if running:
            exec_on(HEAD, "systemctl", "start", WATCHDOG_UNIT)


@pytest.fixture
def shared_store_hidden():
    """The worker's Podman sees only its own store (an empty tmpfs over the shared one; its
    running containers keep their mounts): an image reaches it only the way the collection
    copies it."""
    exec_on(WORKER, "mount", "-t", "tmpfs", "-o", "size=16m", "lab-images-hidden", SHARED_STORE)
    try:
        yield
    finally:
        exec_on(WORKER, "umount", SHARED_STORE, check=False)
