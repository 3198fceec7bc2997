#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_log_facts
short_description: Read what vLLM reported in its log - KV capacity, memory, errors and stats
version_added: 0.2.0
description:
  - Parses a vLLM log from O(path), from O(content), or from a unit (C(journalctl -u) or
    C(podman logs)) and returns the facts under C(ansible_facts.vllm_log).
  - Reads the KV cache size and maximum concurrency (GPU or CPU, one-line and two-line forms, and the
    C(# GPU blocks) of vLLM 0.2 to early V1 times the block size), available KV memory per rank (also
    V0's C(kv_cache_size=) and C(the rest of the memory reserved for KV Cache)), free memory on
    startup, skipped profiling (explicit KV bytes), the insufficient-KV start errors (V1 with vLLM's
    estimated maximum model length, V0 with the capacity in tokens), the engine configuration
    (C(max_seq_len), parallel sizes), OOMs with the rank that died, the speculative scheduled-token
    warning, periodic stats and spec-decode metrics, and the load and start costs.
  - Ranks are told apart in every era's prefix (C(Worker_TP1), C(VllmWorker TP1), C(Worker_PP1_TP0),
    C([rank1]), and the process of C(RayWorkerWrapper pid=, ip=) or C(VllmWorkerProcess pid=)).
  - Reads text as people paste it - ANSI colours, HTML colour spans, docker compose, SLURM and
    journald prefixes, quote gutters, code fences, backticks, indentation, and lines a terminal
    wrapped, also inside a word.
  - Returns C(observations), ready to append to C(/var/lib/localinference/observations.json); a start
    that failed for lack of KV gives calibration points (C(source=error_report)).
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.FACTS
  - localinference.vllm.node
options:
  path:
    description: A log file to read.
    type: path
  content:
    description: Log text.
    type: str
  unit:
    description: A systemd unit (O(source=journal)) or a Podman container (O(source=podman)) to read.
    type: str
  source:
    description: How O(unit) is read.
    type: str
    choices: [journal, podman]
    default: journal
  since:
    description:
      - Only lines since this time (C(journalctl --since), C(podman logs --since)), for example the
        unit's C(ActiveEnterTimestamp), so one boot's log is read.
    type: str
  lines:
    description: Read at most this many of the newest lines from the unit.
    type: int
    default: 20000
  host:
    description: Host name recorded in C(vllm_log.observations).
    type: str
  recipe_hash:
    description: Recipe hash recorded in C(vllm_log.observations).
    type: str
  kv_memory_gib:
    description:
      - KV memory per rank in GiB when known from the configuration (C(VLLM_CPU_KVCACHE_SPACE),
        C(kv_cache_memory_bytes)). Otherwise the log's reserved or available KV memory is used.
    type: float
  timeout:
    default: 60
  empty_ok:
    description:
      - An empty log (no line, or C(-- No entries --) from journalctl) fails the module by default, as a
        misspelled unit or a wrong O(since) reads nothing. With V(true) it is a warning and
        C(vllm_log.empty=true), for a rescue path that must go on to roll back.
    type: bool
    default: false
notes:
  - Exactly one of O(path), O(content) and O(unit) is required.
  - Commands run with C(LC_ALL=C).
  - A log that is not text (NUL bytes, mostly invalid UTF-8) fails the module with its source named.
"""

EXAMPLES = r"""
- name: Read the boot that just started
  localinference.vllm.vllm_log_facts:
    unit: vllm.service
    since: "{{ vllm_started_at }}"
    host: "{{ inventory_hostname }}"
    recipe_hash: "{{ vllm_recipe_hash }}"

- name: Offer vLLM's own estimate when the start failed for lack of KV
  ansible.builtin.fail:
    msg: >-
      vLLM needs {{ vllm_log.kv_needed_gib }} GiB of KV for {{ vllm_log.requested_max_model_len }}
      tokens but has {{ vllm_log.kv_available_gib }} GiB; set max_model_len to
      {{ vllm_log.estimated_max_model_len }}
  when: vllm_log.kv_insufficient
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: complex
  contains:
    vllm_log:
      description:
        - What the log reported. KV keys describe the last boot in the log; C(boots) lists every
          boot; stats, HTTP statuses and errors cover the whole log.
        - Keys C(version), C(kv_cache_device), C(kv_cache_tokens), C(max_concurrency),
          C(concurrency_max_model_len), C(available_kv_gib) (list of C({rank, worker, gib}); C(rank) null for a process whose rank was not logged),
          C(startup_memory) (per rank C(free_gib), C(total_gib), C(requested_utilization),
          C(requested_gib), C(below_requested), weights and activation GiB when logged),
          C(profiling_skipped), C(kv_reserved_gib), C(kv_cache_memory_bytes_suggested),
          C(kv_insufficient), C(requested_max_model_len), C(kv_needed_gib), C(kv_available_gib),
          C(estimated_max_model_len), C(oom) (list of C({rank, bytes, line})), C(oom_rank),
          C(died_ranks), C(scheduled_tokens), C(max_num_batched_tokens) (the step budget the engine settled on),
          C(init_seconds), C(engine_config) (C(max_model_len),
          C(tensor_parallel_size), C(pipeline_parallel_size) of the engine's config line),
          C(kv_report) (C(tokens) or C(blocks)), C(kv_cache_blocks), C(block_size),
          C(block_size_source) (C(log), or C(default) for vLLM's 16), C(kv_cache_reports) (capacity
          lines of one boot, one per rank or KV group), C(kv_capacity_tokens) (V0's stated capacity),
          C(constant_per_token) (a block report, whose capacity does not depend on the length),
          C(start_costs) (C(weights_gib), C(load_seconds), C(weights_load_seconds), C(dynamo_seconds),
          C(graph_compile_seconds), C(compiled_graph_cache_seconds), C(compile_seconds),
          C(graph_capture_seconds), C(graph_capture_gib), C(profiling_seconds), C(init_seconds),
          C(profiling_skipped), C(notes); per key the slowest rank), C(stats), C(spec_decode),
          C(stats_summary), C(context_errors), C(context_limits), C(offload_mmaps),
          C(kv_transfer), C(http_status), C(errors), C(boots), C(lines_read),
          C(observations) (per rank of the last boot, C(source=boot); or the calibration points of a
          start refused for lack of KV, C(source=error_report) - V1's requested length with the memory it
          needs (C(memory_observed=false)) and its estimate with the memory available; V0's capacity with
          C(constant_per_token=true)),
          C(empty) (the log had no line; only with O(empty_ok=true)), C(unparsed_lines) (C(count)
          and C(samples) of lines that matched a vLLM pattern with a number vLLM never prints).
      returned: always
      type: dict
      sample:
        version: 0.32.0
        kv_cache_device: CPU
        kv_cache_tokens: 2097152
        max_concurrency: 512.0
        concurrency_max_model_len: 4096
        profiling_skipped: false
        kv_insufficient: false
        estimated_max_model_len: null
        oom_rank: null
        scheduled_tokens: null
"""

import datetime
import math
import os
import platform
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    run_facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
    unit_name,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_log import (
    LogEmptyError,
    LogInputError,
    check_log_text,
    decode_log,
    parse_log,
    recognised,
    to_observations,
)

# A vLLM log worth parsing is megabytes; a larger file is read in part by unit+since instead.
MAX_LOG_BYTES = 1024**3
MAX_LINES = 10_000_000
HINT = "the journal may be huge or journald busy; pass since, lower lines, or raise timeout"

ARGUMENT_SPEC: dict[str, Any] = {
    "path": {"type": "path"},
    "content": {"type": "str"},
    "unit": {"type": "str"},
    "source": {"type": "str", "choices": ["journal", "podman"], "default": "journal"},
    "since": {"type": "str"},
    "lines": {"type": "int", "default": 20000},
    "host": {"type": "str"},
    "recipe_hash": {"type": "str"},
    "kv_memory_gib": {"type": "float"},
    "timeout": {"type": "float", "default": 60.0},
    "empty_ok": {"type": "bool", "default": False},
}


def unit_command(module: AnsibleModule) -> list[str]:
    """The argv that reads the unit's log."""
    params = module.params
    if params["source"] == "journal":
        argv = [module.get_bin_path("journalctl", required=True), "-u", params["unit"]]
        argv += ["--no-pager", "-o", "short", "-n", str(params["lines"])]
        if params["since"]:
            argv += ["--since", params["since"]]
        return argv
    argv = [module.get_bin_path("podman", required=True), "logs", "--tail", str(params["lines"])]
    if params["since"]:
        argv += ["--since", params["since"]]
    return [*argv, params["unit"]]


def source_name(params: dict[str, Any]) -> str:
    """The source of the log, as the error messages name it."""
    if params["content"] is not None:
        return "content"
    if params["path"]:
        return f"path {params['path']}"
    reader = "journalctl -u" if params["source"] == "journal" else "podman logs"
    since = f" since {params['since']}" if params["since"] else ""
    return f"unit {params['unit']} ({reader}{since}; check the unit name and since)"


def read_text(module: AnsibleModule, runner: Runner) -> str:
    """The log as text; raises LogInputError when it is not text."""
    params = module.params
    origin = source_name(params)
    if params["content"] is not None:
        check_log_text(params["content"], origin)
        return params["content"]
    if params["path"]:
        try:
            if os.path.getsize(params["path"]) > MAX_LOG_BYTES:
                module.fail_json(
                    msg=f"path {params['path']} is larger than {MAX_LOG_BYTES} bytes: read the boot"
                    " you need with unit and since instead"
                )
            with open(params["path"], "rb") as handle:
                text = decode_log(handle.read(), origin)
        except OSError as exc:
            module.fail_json(msg=f"path {params['path']} cannot be read: {exc}")
        check_log_text(text, origin)
        return text
    argv = unit_command(module)
    rc, out, err = runner.run(argv, HINT)
    if rc != 0:
        module.fail_json(
            msg=f"reading unit {params['unit']} failed (rc={rc}): "
            f"{(err.strip() or out.strip())[:500]}; check the unit name and source",
            cmd=argv,
        )
    # podman logs writes the container's stderr to stderr; vLLM logs there
    text = f"{out}\n{err}" if params["source"] == "podman" else out
    check_log_text(text, origin)
    return text


def _check_params(module: AnsibleModule) -> None:
    params = module.params
    if not 1 <= params["lines"] <= MAX_LINES:
        module.fail_json(msg=f"lines must be between 1 and {MAX_LINES}, got {params['lines']}")
    memory = params["kv_memory_gib"]
    if memory is not None and (not math.isfinite(memory) or memory <= 0):
        module.fail_json(msg=f"kv_memory_gib must be positive and finite, got {memory}")
    for option in ("unit", "since", "host", "recipe_hash"):
        value = params[option]
        if value is None:
            continue
        bad = next((c for c in value if not c.isprintable()), None)
        if bad is not None or not value.strip():
            module.fail_json(
                msg=f"{option} must be a non-empty printable string, got {value[:80]!r}"
                + (f" (contains {bad!r})" if bad is not None else "")
            )
    unit = params["unit"]
    try:
        if unit is not None and params["source"] == "journal":
            unit_name("unit", unit)
        elif unit is not None and (unit.startswith("-") or " " in unit or len(unit) > 255):
            raise ValidationError(
                "unit",
                f"{unit[:80]!r} is not a container name",
                "no leading '-', no spaces, at most 255 characters ('podman ps -a' lists them)",
            )
    except ValidationError as exc:
        module.fail_json(msg=str(exc))


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_one_of=[("path", "content", "unit")],
        mutually_exclusive=[("path", "content", "unit")],
        supports_check_mode=True,
    )
    _check_params(module)
    run_facts(module, "vllm_log", lambda runner: _facts(module, runner))


def _facts(module: AnsibleModule, runner: Runner) -> dict:
    empty = False
    try:
        text = read_text(module, runner)
    except LogEmptyError as exc:
        if not module.params["empty_ok"]:
            module.fail_json(msg=str(exc))
        module.warn(str(exc))
        text, empty = "", True
    except LogInputError as exc:
        module.fail_json(msg=str(exc))
    facts = parse_log(text)
    facts["empty"] = empty
    origin = source_name(module.params)
    if facts["unparsed_lines"]["count"]:
        module.warn(
            f"{facts['unparsed_lines']['count']} line(s) of {origin} look like vLLM reports but"
            f" carry numbers vLLM never prints; first: {facts['unparsed_lines']['samples'][0]!r}"
        )
    if not empty and not recognised(facts):
        module.warn(f"no vLLM report recognised in {origin}: is this a vLLM log?")
    recorded_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    facts["observations"] = to_observations(
        facts,
        host=module.params["host"] or platform.node(),
        recorded_at=recorded_at,
        recipe_hash=module.params["recipe_hash"],
        kv_memory_gib=module.params["kv_memory_gib"],
    )
    facts["lines_read"] = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    return facts


if __name__ == "__main__":
    main()
