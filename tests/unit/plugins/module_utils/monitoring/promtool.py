# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The real promtool for the monitoring's tests.

``make test-unit`` takes it out of Debian's package into .lab/tools/promtool
(no service installed); LOCALINFERENCE_PROMTOOL points at another one. Without
one the tests skip, except under CI (``CI`` set), where they fail: CI must never
pass on a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[5]


def promtool_binary() -> str | None:
    for candidate in (
        os.environ.get("LOCALINFERENCE_PROMTOOL"),
        str(ROOT / ".lab" / "tools" / "promtool"),
        shutil.which("promtool"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def require_promtool() -> str:
    binary = promtool_binary()
    if binary is None:
        reason = "no promtool: make .lab/tools/promtool (or set LOCALINFERENCE_PROMTOOL)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the promtool tests", pytrace=False)
        pytest.skip(reason)
    return binary


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` with a C locale; the caller judges the return code."""
    return subprocess.run(
        [require_promtool(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
