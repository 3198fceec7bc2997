# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's memory read from /proc and the cgroup (module_utils/preflight/_memory_gather.py).

The cgroup's limit and usage come from the v2 files, else the v1 ones, less the reclaimable
inactive file cache; a process that exits while it is read is skipped, a status file the
kernel did not write is refused naming its path. The parsers are test_memory_facts.py's; the
module is tests/unit/plugins/modules/test_memory_facts.py's.
"""

from __future__ import annotations

import os
import re

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.preflight import _memory_gather
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    ProcParseError,
)

STATUS = "Name:\tvllm\nState:\tS (sleeping)\nPid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nVmRSS:\t  2048 kB\n"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"memory.max": "8589934592\n", "memory.current": "4294967296\n",
          "memory.stat": "anon 1\ninactive_file 1073741824\n"}, (8589934592, 3221225472)),
        ({"memory.max": "max\n", "memory.current": "100\n"}, (None, 100)),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "300\n",
          "memory/memory.stat": "total_inactive_file 100\n"}, (None, 200)),
        ({}, (None, None)),
    ],
    ids=["v2 less the inactive file cache", "v2 unlimited", "v1 unlimited", "no cgroup files"],
)
def test_the_cgroup_limit_and_usage(tmp_path, files, expected):
    for name, text in files.items():
        path = tmp_path / "fs" / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert _memory_gather._cgroup(str(tmp_path)) == expected


def test_processes_skip_one_that_exited_and_name_the_user(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "status").write_text(STATUS.format(pid=42, uid=os.getuid()))
    (tmp_path / "42" / "cmdline").write_bytes(b"vllm\0serve\0")
    (tmp_path / "43").mkdir()  # exited between the listing and the read: no status file
    (tmp_path / "self").mkdir()
    (found,) = _memory_gather._processes(str(tmp_path))
    assert found["pid"] == 42 and found["cmdline"] == "vllm serve" and found["uid"] == os.getuid()


def test_a_status_file_the_kernel_did_not_write_is_refused_naming_it(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "status").write_text("garbage\n")
    with pytest.raises(ProcParseError, match="^" + re.escape(f"{tmp_path}/42/status: no Uid line")):
        _memory_gather._processes(str(tmp_path))
