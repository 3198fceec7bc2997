# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent clients' npm pins live in one file, lab/agent-clients.txt: every client the collection
configures has an exact pin of the package it names, and lab/bin/opencode installs the same opencode."""

from __future__ import annotations

import re
from pathlib import Path

from ansible_collections.localinference.vllm.plugins.module_utils.client._agents import (
    CLIENTS,
    PACKAGES,
)

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, tuple[str, str]]:
    rows = (line.split() for line in (ROOT / "lab" / "agent-clients.txt").read_text().splitlines())
    return {row[0]: (row[1], row[2]) for row in rows if row and not row[0].startswith("#")}


def test_every_client_is_pinned_exactly() -> None:
    pins = _pins()
    assert sorted(pins) == sorted(CLIENTS)
    for client, (package, version) in pins.items():
        assert package == PACKAGES[client]
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"{client}: {version} is not an exact version"


def test_lab_bin_opencode_installs_the_pinned_opencode() -> None:
    script = (ROOT / "lab" / "bin" / "opencode").read_text()
    default = re.search(r"OPENCODE_VERSION:-([0-9.]+)\}", script)
    assert default and default.group(1) == _pins()["opencode"][1]
