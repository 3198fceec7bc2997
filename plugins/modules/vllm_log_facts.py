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

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_log_gather import run

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


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_one_of=[("path", "content", "unit")],
        mutually_exclusive=[("path", "content", "unit")],
        supports_check_mode=True,
    )
    run(module)


if __name__ == "__main__":
    main()
