# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab tests, in two groups that share lab/harness.py with the benchmarks.

- ``state/``: read-only. The converged lab checked from outside (``podman
  exec``, testinfra, the endpoint); nothing on the hosts changes. This is what
  ``molecule verify`` runs.
- ``faults/``: they act. Faults injected on the hosts (a stopped worker, an MTU
  changed behind the collection's back, a filled /dev/shm, damaged weights),
  rollouts of other recipes, real vLLM boots on the controller; each test puts
  the lab back as it found it. ``make test-molecule`` runs them after verify
  and before destroy (``make test-lab-faults`` on a lab made by ``make lab``).

A missing lab skips the tests (``make test-lab`` by hand); with
``LOCALINFERENCE_LAB_REQUIRED=1`` (set by ``make test-molecule`` and by
molecule's verifier) it fails them instead, so CI never passes on skips.
"""

from __future__ import annotations

import os
import shutil

import pytest

from lab.harness import ROOT, lab_up


def require(ready: bool, reason: str) -> None:
    """Skip when ``ready`` is false, or fail when the run requires the lab."""
    if ready:
        return
    if os.environ.get("LOCALINFERENCE_LAB_REQUIRED") == "1":
        pytest.fail(f"{reason} (LOCALINFERENCE_LAB_REQUIRED=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def require_lab():
    """:func:`require` for the other labs' own host checks (tests/lab/onehost, tests/lab/scale)."""
    return require


@pytest.fixture(scope="session")
def lab_hosts() -> None:
    """Both lab hosts are running (``make lab-up`` or ``make lab``)."""
    require(lab_up(), "needs the lab hosts spark-head and spark-worker running (make lab)")


@pytest.fixture(scope="session")
def controller_vllm() -> None:
    """The lab's CPU vLLM on the controller (.lab/vllm-venv, made by lab/bin/lab-assets) and curl."""
    require(
        (ROOT / ".lab" / "vllm-venv" / "bin" / "vllm").exists()
        and shutil.which("curl") is not None,
        "needs the lab's CPU vLLM (.lab/vllm-venv, made by make images) and curl",
    )
