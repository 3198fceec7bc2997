# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._systemctl import (
    parse_show,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._ready import (
    unit_failed,
)


@pytest.mark.parametrize(
    ("show", "before", "reason"),
    [
        ("ActiveState=active\nSubState=running\nNRestarts=0\nLoadState=loaded", 0, None),
        ("ActiveState=activating\nSubState=start\nNRestarts=0\nLoadState=loaded", 0, None),
        (
            "ActiveState=activating\nSubState=auto-restart\nNRestarts=1\nLoadState=loaded",
            0,
            "restarting",
        ),
        ("ActiveState=failed\nSubState=failed\nResult=exit-code\nLoadState=loaded", 0, "exit-code"),
        (
            "ActiveState=active\nSubState=running\nNRestarts=3\nLoadState=loaded",
            2,
            "restarted 1 time",
        ),
        ("ActiveState=active\nSubState=running\nNRestarts=3\nLoadState=loaded", 3, None),
        ("ActiveState=inactive\nSubState=dead\nNRestarts=0\nLoadState=loaded", 0, "inactive"),
        ("ActiveState=inactive\nSubState=dead\nLoadState=not-found", 0, "LoadState=not-found"),
        ("ActiveState=inactive\nSubState=dead\nLoadState=masked", 0, "LoadState=masked"),
        ("ActiveState=active\nNRestarts=garbage\nLoadState=loaded", 0, None),
    ],
)
def test_unit_failed(show, before, reason):
    why = unit_failed(parse_show(show), before)
    assert (why is None) if reason is None else (reason in why)
