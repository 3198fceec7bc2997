# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest


@pytest.fixture
def paths(tmp_path):
    """serving_state's state document, staging place and unit directory under the test's tmp_path."""
    return {
        "path": str(tmp_path / "etc" / "serving.json"),
        "staging_dir": str(tmp_path / "etc" / "staging"),
        "unit_dir": str(tmp_path / "units"),
    }
