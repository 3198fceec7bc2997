# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``gpu_facts``: the node's GPUs as ``nvidia-smi`` reports them, read in one bounded call or two.

The table (driver and CUDA versions), then the per-GPU query (CSV) or the full XML, merged;
a GPU that reports no memory (unified memory) takes MemTotal. A node without the driver or a
GPU is :class:`Absent` (``WHEN_ABSENT`` says what the module returns then). The parsing is
``_gpu_facts``'s.

No AnsibleModule here: ``module`` is the caller's (``params``, ``get_bin_path``, ``fail_json``).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    Absent,
    WhenAbsent,
    find_binary,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._gpu_facts import (
    QUERY_FIELDS,
    NvidiaSmiParseError,
    build_facts,
    merge_table,
    parse_query_csv,
    parse_table,
    parse_xml,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    ProcParseError,
    parse_meminfo,
)

HINT = (
    "the GPU driver may be wedged (look for Xid errors in 'dmesg' and run nvidia-smi by hand);"
    " the node is sick, not unreachable (F5). Raise timeout only if nvidia-smi is merely slow"
)
WHEN_ABSENT = WhenAbsent(
    name="gpu_facts",
    fix="Install the NVIDIA driver or set required=false.",
    facts=lambda why: build_facts([], None, None, None) | {"absent_reason": why},
)


def facts(module: Any, runner: Runner) -> dict:
    """The facts of ``ansible_facts.gpu``; raises Absent on a node without the driver or a GPU."""
    binary = module.params["nvidia_smi"]
    path = find_binary(module, binary)

    rc, table_out, err = runner.run([path], HINT)
    if rc != 0:
        raise Absent(f"'{binary}' failed with rc={rc}: {(err or table_out).strip()[:500]}")
    try:
        table = parse_table(table_out)
        if module.params["source"] == "xml":
            rc, out, err = runner.run([path, "-q", "-x"], HINT)
            if rc != 0:
                module.fail_json(msg=f"'{binary} -q -x' failed with rc={rc}: {err.strip()[:500]}")
            parsed = parse_xml(out)
            gpus = merge_table(parsed["gpus"], table)
            driver = parsed["driver_version"] or table["driver_version"]
            cuda = parsed["cuda_version"] or table["cuda_version"]
        else:
            query = ["--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv"]
            rc, out, err = runner.run([path, *query], HINT)
            if rc != 0:
                module.fail_json(
                    msg=f"'{binary} {' '.join(query)}' failed with rc={rc}: {err.strip()[:500]}"
                )
            gpus = merge_table(parse_query_csv(out), table)
            driver = table["driver_version"]
            cuda = table["cuda_version"]
    except NvidiaSmiParseError as exc:
        module.fail_json(msg=f"Could not parse the output of {binary} (nvidia_smi): {exc}")

    if not gpus:
        raise Absent("nvidia-smi reports no GPU")

    meminfo = None
    if any(gpu["memory_total_mib"] is None for gpu in gpus):
        try:
            meminfo = parse_meminfo(
                _files.read_text(
                    module.params["meminfo_path"], _files.MAX_KERNEL_TEXT, errors="replace"
                )
            )
        except (OSError, ProcParseError) as exc:
            module.fail_json(
                msg=f"GPU reports no memory (unified memory) and {module.params['meminfo_path']} is unreadable: {exc}"
            )
    return build_facts(gpus, driver, cuda, meminfo)
