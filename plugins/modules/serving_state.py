#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: serving_state
short_description: Render, write and verify the reconciled vLLM serving state of one node
version_added: 0.2.0
description:
  - Normalises a serving recipe (inventory variable C(vllm_recipe)), computes its canonical
    sha256 hash and renders the node's Podman Quadlet C(.container) or systemd C(.service)
    units for its rank (Ray head/worker or vLLM C(mp) ranks).
  - Keeps one reconciled state document per node (default C(/etc/localinference/serving.json))
    with the recipe, its hash and the checksums of the unit files; every unit carries the hash.
  - C(state=verified) proves the node's document and unit files equal what the inventory asks
    and fails with the difference otherwise (failure F10, a stale reconciled registry) - the
    recipe and its hash, the image by digest, the environment, the weights digest and every unit
    file's checksum and carried hash, exactly as rendered. The rollout calls it after the update
    and before the start on every node, with the verifier the watchdog's restart uses.
  - Every recipe and node value that reaches a unit file, a command line or a path is validated
    first (no control characters, image pinned by digest, absolute normalised paths, C(devices) as
    CDI names or nodes under C(/dev), host names, environment names, ports in range); a refusal
    names the variable, the offending character and the fix. Rendered units are checked again; a
    line the template did not write is an error and nothing is written.
  - The node's state document is never trusted. It is schema-checked; a malformed one (not an
    object, a unit without C(sha256), binary or invalid JSON) is reported as an F10 difference
    (RV(differences), RV(live_findings)), never a traceback. A directory at O(path), or where
    a file is to be written, is refused in every state before anything is written or removed.
    Only this collection's unit names inside its unit directories are ever read, stopped or
    removed.
extends_documentation_fragment:
  - localinference.vllm.attributes.CHANGES
options:
  recipe:
    description:
      - The serving recipe; keys are vLLM option names with underscores plus deployment keys
        (C(model), C(revision), C(deploy_mode), C(image), C(vllm_version), C(executor_backend),
        C(ipc_host), C(shm_size), C(privileged), C(extra_args), C(env), C(devices),
        C(podman_args), C(ulimits), C(cache_dir), C(ray_port), C(entrypoint)).
    type: dict
    required: true
  plan_max_model_len:
    description:
      - The plan's C(max_model_len), used when the recipe says C(max_model_len=plan).
    type: int
  node:
    description: Where this node sits in the cluster.
    type: dict
    required: true
    suboptions:
      host:
        description: Inventory name of the node.
        type: str
        required: true
      rank:
        description: Node rank; the head is C(0).
        type: int
        required: true
      nnodes:
        description: Number of nodes in the cluster.
        type: int
        required: true
      head_address:
        description: The head's cluster-link address (C(--master-addr), Ray address).
        type: str
        required: true
      address:
        description: This node's cluster-link address (Ray C(--node-ip-address)).
        type: str
        default: ''
      env:
        description: Per-node environment from the fabric stage (C(cluster_network_env)).
        type: dict
        default: {}
      weights_path:
        description: The model snapshot directory on this node (C(model_weights_path)).
        type: str
        required: true
      weights_digest:
        description:
          - sha256 (64 hex) of the content the weights stage verified on this node
            (C(/etc/localinference/weights.json)); empty when the weights are managed elsewhere.
          - Part of the node's document, so new weights under the same path restart the engine.
        type: str
        default: ''
      rdma:
        description:
          - The RDMA port behind the cluster interface whose GID table the units read at every
            start (C(hca), C(port), C(sys_root)); empty where the fabric stage resolved no
            C(NCCL_IB_GID_INDEX).
          - With O(guards), every serving unit then starts with C(ExecStartPre=) gid-start (from
            O(checks.programs)), which writes the index this start finds to
            C(/run/localinference/nccl-gid.env), and reads it from there (C(EnvironmentFile=));
            a GID table without a RoCE v2 entry for O(node.address) refuses the start.
        type: dict
        default: {}
  state:
    description:
      - C(staged) writes the document and units under O(staging_dir) only and reports whether
        the live state differs (RV(live_matches)).
      - C(present) writes the live document and units (the previous document is kept as
        C(serving.previous.json) for rollback).
      - C(verified) changes nothing and fails unless the live document and unit files equal
        the inventory's ask.
      - C(absent) removes the unit files the live document lists; the document stays. Only this
        collection's unit names (C(localinference-vllm), C(localinference-ray) C(.container) or
        C(.service)) inside O(unit_dir) or the default unit directories are removed, and only
        regular files or symbolic links (never followed); anything else is left and reported.
    type: str
    choices: [staged, present, verified, absent]
    default: present
  path:
    description: The reconciled state document.
    type: path
    default: /etc/localinference/serving.json
  staging_dir:
    description: Where C(state=staged) renders the document (C(serving.json)) and units (C(units/)).
    type: path
    default: /etc/localinference/staging
  unit_dir:
    description:
      - Directory of the live unit files. Defaults to C(/etc/containers/systemd) for
        C(deploy_mode=quadlet) and C(/etc/systemd/system) for C(deploy_mode=systemd).
    type: path
  venv_dir:
    description:
      - vLLM virtual environment for C(deploy_mode=systemd).
        Defaults to C(/opt/localinference/vllm-<vllm_version>).
    type: path
  help_text:
    description:
      - Path to the output of C(vllm serve --help=all) of the targeted release; when set,
        every rendered flag must exist in it.
    type: path
  guards:
    description:
      - The memory guards of the serving units (F4, F13; C(docs/failure-catalog.md)), as the serve
        role passes them from its C(serve_*) variables; omitted, the units carry none.
      - The node's need is derived from the recipe, the weight files in C(node.weights_path) and
        C(MemTotal) (C(plugins/module_utils/serve/_memory.py)); it is returned as RV(memory) and
        recorded in the state document.
      - Keys C(admission) (bool), C(reserve_gib), C(overhead_gib) (per engine worker),
        C(unified_memory) (bool), C(oom_score_adjust) (-999 to 1000),
        C(memory_high_margin_gib), C(memory_max_margin_gib), C(libexec_dir) (where the
        C(admission) and C(shm-offload) programs are installed) and C(max_gpu_memory_utilization)
        (on unified memory a recipe asking more is a blocking F4 problem).
    type: dict
  slice_dir:
    description:
      - Where the C(localinference.slice) unit is written (unified memory). Defaults to O(unit_dir)
        for C(deploy_mode=systemd) and C(/etc/systemd/system) for C(deploy_mode=quadlet).
    type: path
  stop_live:
    description:
      - With C(state=present), first stop the units the live document lists that systemd does
        not report inactive (the server before its runtime, in reverse start order), one
        C(systemctl stop) each within O(stop_timeout) (the C(rm) step of the rollout).
        RV(stopped) names them. In check mode nothing is stopped.
    type: bool
    default: false
  stop_timeout:
    description: Seconds each C(systemctl stop) may take (the head's server has 120 s to stop).
    type: float
    default: 300
  daemon_reload:
    description:
      - With C(state=present), run C(systemctl daemon-reload) when a unit file changed, so
        systemd (and the Quadlet generator) read the new units. RV(reloaded) says whether it ran.
    type: bool
    default: false
  checks:
    description:
      - With C(state=staged), the node-side checks of staging in the same call (one round trip
        per node), in the order of the suboptions below; each refusal names the node, the cause
        and the fix, and nothing that runs is touched.
      - With C(state=verified) (not in check mode), only O(checks.quadlet) and
        O(checks.unit_states) apply, on the live units.
    type: dict
    suboptions:
      max_load_per_cpu:
        description:
          - Refuse a saturated node (F5), one whose 1-minute load (C(/proc/loadavg)) per online CPU
            is above this, before anything else. Unset, the load is not read.
        type: float
      cluster_address:
        description: Refuse a node whose C(node.address) is on none of its interfaces (C(ip -o addr show)).
        type: bool
        default: true
      help_cache_dir:
        description:
          - Where the image's C(vllm serve --help=all) is cached on the node (C(sha256(image).txt));
            a missing file is asked of the image once (C(podman run --rm --network=none); not in
            check mode). Every rendered flag is checked against it (C(deploy_mode=quadlet));
            O(help_text) wins when given.
        type: path
      help_timeout:
        description: Seconds the image may take to print its options (a first pull included).
        type: float
        default: 1800
      quadlet:
        description:
          - The node's Quadlet generator, run on the staged units (with C(state=verified), the live
            ones), with the checks of M(localinference.vllm.quadlet_verify) (F14, F17).
        type: path
      ports:
        description:
          - On the head, refuse an API, torch-store or Ray port that another process holds (the
            checks of M(localinference.vllm.port_listeners)).
        type: bool
        default: false
      unit_states:
        description:
          - Read the ActiveState of the live units (RV(live_active), RV(live_running)); with
            C(state=verified), fail unless systemd has loaded every service of RV(start_order).
        type: bool
        default: false
      programs:
        description: The units' guard programs to install into O(checks.programs_dir) (mode 0755), last.
        type: list
        elements: dict
        default: []
        suboptions:
          name:
            description: File name of the program.
            type: str
            required: true
          content:
            description: The program's text.
            type: str
            required: true
      programs_dir:
        description: Where O(checks.programs) go.
        type: path
      timeout:
        description: Seconds every other command may take.
        type: float
        default: 60
author:
  - localinference.vllm developers (@localinference)
"""

EXAMPLES = r"""
- name: Render the new recipe into the staging place
  localinference.vllm.serving_state:
    recipe: "{{ vllm_recipe }}"
    plan_max_model_len: "{{ serve_plan.max_model_len }}"
    node:
      host: "{{ inventory_hostname }}"
      rank: 0
      nnodes: 2
      head_address: 10.77.0.11
      address: 10.77.0.11
      env: "{{ cluster_network_env }}"
      weights_path: "{{ model_weights_path }}"
    state: staged

- name: Prove the node serves what the inventory asks
  localinference.vllm.serving_state:
    recipe: "{{ vllm_recipe }}"
    node: "{{ serve_node }}"
    state: verified
"""

RETURN = r"""
recipe:
  description: The normalised recipe (defaults filled, C(plan) resolved).
  returned: always
  type: dict
recipe_hash:
  description: sha256 of the canonical JSON of RV(recipe).
  returned: always
  type: str
  sample: 39c6af1567e6a9c3c59447fc395848a1e42f53aff98c82106197aef08916d166
document:
  description: The reconciled state document the inventory asks for.
  returned: always
  type: dict
units:
  description: Rendered unit files of this node (C(name), C(path), C(content)).
  returned: always
  type: list
  elements: dict
start_order:
  description: systemd service names to start on this node, in order.
  returned: always
  type: list
  elements: str
  sample: [localinference-vllm.service]
server_argv:
  description: Arguments after C(vllm) for this node's server, or null (Ray worker).
  returned: always
  type: list
  elements: str
ray_argv:
  description: Arguments after C(ray) for this node's Ray unit, or null (C(mp) backend).
  returned: always
  type: list
  elements: str
environment:
  description: The environment of this node's units.
  returned: always
  type: dict
problems:
  description:
    - Deployment defects in the recipe as findings (C(id), C(severity), C(blocking), C(message), C(fix)); F4, F14, F17, F27.
    - F27 when the parallel layout does not fit the cluster (C(node.nnodes)), the GPUs named in
      C(recipe.devices) or the model's C(config.json) in C(node.weights_path) (heads, KV heads, layers).
  returned: always
  type: list
  elements: dict
live_hash:
  description: Recipe hash of the live document before this run, or null.
  returned: always
  type: str
live_recipe:
  description: The recipe of the live document before this run (the rollback target of this run), or null.
  returned: always
  type: dict
live_start_order:
  description: Services the live document says run on this node (what C(rm) stops), in start order.
  returned: always
  type: list
  elements: str
live_matches:
  description: Whether the live document and unit files equal the inventory's ask.
  returned: always
  type: bool
differences:
  description: Differences between the live state and the ask, one line each.
  returned: always
  type: list
  elements: str
previous_recipe:
  description: The recipe kept in C(serving.previous.json) (the rollback target), or null.
  returned: always
  type: dict
previous_hash:
  description: Hash of RV(previous_recipe), or null.
  returned: always
  type: str
live_findings:
  description:
    - Problems with the node's state documents (C(serving.json), C(serving.previous.json)) and
      unit files this run refused to touch, as findings (C(id) F10, C(severity), C(message),
      C(fix)). An C(error) finding is also listed in RV(differences).
  returned: always
  type: list
  elements: dict
stopped:
  description: The live units O(stop_live) stopped (or would stop in check mode), in stop order.
  returned: with state=present
  type: list
  elements: str
stopped_at:
  description:
    - The node's local time (C(%Y-%m-%d %H:%M:%S)) once the old units were stopped, before the new
      ones were written, where the new boot's log begins (C(journalctl --since)).
  returned: with state=present
  type: str
reloaded:
  description: Whether O(daemon_reload) ran C(systemctl daemon-reload).
  returned: with state=present
  type: bool
node_load:
  description: The node's 1-minute load (C(load1)), online CPUs (C(ncpu)) and C(per_cpu), with O(checks.max_load_per_cpu).
  returned: with checks
  type: dict
live_active:
  description: The ActiveState of each unit of RV(live_start_order) (O(checks.unit_states)).
  returned: with checks
  type: dict
live_running:
  description: Whether the live document lists units and every one is active (O(checks.unit_states)).
  returned: with checks
  type: bool
quadlet:
  description: What the Quadlet generator made of the staged units (C(services), C(findings)), with O(checks.quadlet).
  returned: with checks
  type: dict
listeners:
  description: Who listens on the ports the head's units need (O(checks.ports)).
  returned: with checks
  type: list
  elements: dict
programs:
  description: Paths of the guard programs this run installed or would install (O(checks.programs)).
  returned: with checks
  type: list
  elements: str
memory:
  description:
    - This node's memory need as the admission checks it (C(need_bytes), C(weights_bytes),
      C(kv_bytes), C(engine_bytes), C(offload_bytes), C(overhead_bytes), C(workers),
      C(unified_memory), C(basis)) and C(weights_found) (how the weights were counted); null
      without O(guards).
  returned: always
  type: dict
"""

import dataclasses
import json
import os
import stat
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
    timeout_error,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    normalise,
    problems,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._gid_start import (
    start_argv as gid_start_argv,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    RecipeInputError,
    gpus_in_devices,
    lint_parallel,
    model_geometry,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import (
    make_node,
    parse_help_flags,
    unknown_flags,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    guards as memory_guards,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    mem_total_bytes,
    parse_policy,
    utilization_problems,
    weights_on_disk,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._ports import (
    foreign,
    listeners,
    refusal,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._quadlet import (
    QuadletCheckError,
    check_units,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._reconcile import (
    ABSENT,
    DIRECTORY,
    REMOVABLE,
    SPECIAL,
    Observed,
    decide,
    previous_path,
    staged_unit_root,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._restart import (
    stop_units,
    verify_node,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._stage_checks import (
    StageCheckError,
    all_active,
    capture_help,
    check_mounts,
    help_cache_file,
    judge_address,
    judge_load,
    not_loaded,
    read_unit_states,
    stage_ports,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    StateFileError,
    check_document,
    desired,
    differences,
    dump,
    parse_document,
    read_text,
    unit_file_problems,
)

UNIT_DIRS = {"quadlet": "/etc/containers/systemd", "systemd": "/etc/systemd/system"}
# `vllm serve --help=all` is a few hundred kilobytes.
MAX_HELP_BYTES = 16 * 1024 * 1024
STATE_FIX = (
    "run the rollout (state=present rewrites serving.json and the units); if the file is not the "
    "collection's, move it away"
)


# A config.json larger than this is not a model configuration.
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def layout_problems(recipe, node):
    """F27 (the parallel layout against the nodes, the devices and the model) as problems.

    The model's geometry comes from the node's ``config.json`` when it can be read;
    an absent or unreadable file leaves the head and layer checks out, never guesses.
    """
    try:
        text = read_text(os.path.join(node.weights_path, "config.json"), MAX_CONFIG_BYTES)
        config = json.loads(text) if text is not None else None
    except (StateFileError, ValueError):
        config = None
    found = lint_parallel(
        recipe, node.nnodes, gpus_in_devices(recipe["devices"]), model_geometry(config)
    )
    return [{**f, "blocking": f["severity"] == "error"} for f in found]


def _load(path, unit_dirs, label):
    """``(text, document, trusted, problems)`` of a state document on the node; never raises.

    ``text`` is None when the file does not exist (no problem then).
    """
    try:
        text = read_text(path)
    except StateFileError as exc:
        return None, None, check_document(None, unit_dirs, label)[0], [f"{label}: {exc}"]
    if text is None:
        return None, None, check_document(None, unit_dirs, label)[0], []
    document, found = parse_document(text, label)
    if found:
        return text, None, check_document(None, unit_dirs, label)[0], found
    trusted, found = check_document(document, unit_dirs, label)
    return text, document, trusted, found


class _Files:
    """Writes and removals of this module; failures end the module with a clear message."""

    def __init__(self, module, result):
        self.module = module
        self.result = result

    def fail(self, msg):
        self.module.fail_json(msg=msg, **self.result)

    def require_file(self, path, option):
        """Stop before anything changes when ``path`` exists and is a directory."""
        if os.path.isdir(path):
            self.fail(
                f"{option}: {path} is a directory where a file belongs; remove it or choose "
                f"another {option}"
            )

    def write(self, path, text, option, mode=0o644):
        """Write ``text`` atomically; return True when the file changed."""
        self.require_file(path, option)
        try:
            current = read_text(path)
        except StateFileError:
            current = None  # a binary or unreadable file of ours is replaced
        if current == text:
            return False
        if self.module.check_mode:
            return True
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".serving-")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(tmp, mode)
        except OSError as exc:
            self.fail(f"{option}: cannot write {path} ({exc.strerror}); check {directory}")
        self.module.atomic_move(tmp, path)
        try:
            os.chmod(path, mode)  # atomic_move gives a new file the umask's mode
        except OSError as exc:
            self.fail(f"{option}: cannot set the mode of {path} ({exc.strerror})")
        return True

    def remove(self, path):
        """Remove a regular file or a symbolic link (never followed); ``(changed, problem)``."""
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False, None
        except OSError as exc:
            return False, f"{path}: cannot be inspected ({exc.strerror}); left in place"
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            return False, f"{path}: is {kind}, not a unit file the collection wrote; left in place"
        if not self.module.check_mode:
            try:
                os.unlink(path)
            except OSError as exc:
                return False, f"{path}: cannot be removed ({exc.strerror})"
        return True, None


def _mem_total(module):
    """MemTotal of this node (the unified-memory need of a profiled recipe)."""
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as handle:
            return mem_total_bytes(handle.read())
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"guards: cannot read MemTotal from /proc/meminfo ({exc})")


# Where the serve role takes each node value from, named in a refusal of that value.
NODE_SOURCES = {
    "address": "serve_cluster_address, else the fabric stage's primary_ip",
    "head_address": "the head's serve_cluster_address, else its fabric stage's primary_ip",
    "weights_path": "serve_weights_path, else model_weights_path",
    "rdma": "the fabric stage's saved interfaces[0].hca and serve_rdma_sys_root",
}


def _absolute(option, value):
    value = validate.text(option, value, max_length=validate.MAX_PATH)
    if not value.startswith("/"):
        raise validate.ValidationError(
            option, f"{value!r} is not an absolute path", "start it with /"
        )
    return value


CHECKS_SPEC = {
    "max_load_per_cpu": {"type": "float"},
    "cluster_address": {"type": "bool", "default": True},
    "help_cache_dir": {"type": "path"},
    "help_timeout": {"type": "float", "default": 1800.0},
    "quadlet": {"type": "path"},
    "ports": {"type": "bool", "default": False},
    "programs": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "name": {"type": "str", "required": True},
            "content": {"type": "str", "required": True},
        },
    },
    "programs_dir": {"type": "path"},
    "unit_states": {"type": "bool", "default": False},
    "timeout": {"type": "float", "default": 60.0},
}


def _refused_or(module, result, step, *args):
    """``step(*args)``; a refusal or a command that failed ends the module with its message."""
    try:
        return step(*args)
    except QuadletCheckError as exc:
        module.fail_json(msg=str(exc), **{**result, "quadlet": exc.extra})
    except (StageCheckError, CommandError) as exc:
        module.fail_json(msg=str(exc), **result)


def _quadlet_check(module, checks, recipe, unit_dir, result):
    """The node's Quadlet generator on ``unit_dir`` (F14, F17); findings that do not block are warnings."""
    checked = check_units(unit_dir, checks["quadlet"], recipe["privileged"], checks["timeout"])
    result["quadlet"] = {"services": checked["services"], "findings": checked["findings"]}
    for item in checked["findings"]:
        module.warn(f"{item['service']}: {item['id']}: {item['message']}")


def _check_options(checks):
    """Validate the checks' paths, names and deadlines before anything runs."""
    for option in ("timeout", "help_timeout"):
        if timeout_error(checks[option]):
            raise validate.ValidationError(
                f"checks.{option}",
                f"{checks[option]!r} is not a number of seconds above 0 and at most 86400",
                "give the seconds the command may take",
            )
    if checks["max_load_per_cpu"] is not None:  # NaN would let every load through
        try:
            validate.number("checks.max_load_per_cpu", checks["max_load_per_cpu"])
        except validate.ValidationError as exc:
            fix = f"{exc.fix} (the serve role takes it from serve_max_load_per_cpu)"
            raise validate.ValidationError(exc.name, exc.problem, fix) from None
    for option in ("help_cache_dir", "quadlet", "programs_dir"):
        if checks[option]:
            checks[option] = _absolute(f"checks.{option}", checks[option])
    if checks["programs"] and not checks["programs_dir"]:
        raise validate.ValidationError(
            "checks.programs_dir", "is not set but checks.programs is", "name the directory"
        )
    for index, program in enumerate(checks["programs"]):
        name = validate.text(f"checks.programs[{index}].name", program["name"], max_length=64)
        if "/" in name or name in (".", ".."):
            raise validate.ValidationError(
                f"checks.programs[{index}].name", f"{name!r} is not a file name", "give a plain name"
            )


def _node_checks(checks, node, runner):
    """F5 and the cluster address: before anything else is read or written."""
    found = {}
    if checks["max_load_per_cpu"] is not None:
        with open("/proc/loadavg", encoding="ascii", errors="replace") as handle:
            loadavg = handle.read(4096)
        found["node_load"] = judge_load(
            loadavg, os.sysconf("SC_NPROCESSORS_ONLN"), checks["max_load_per_cpu"], node.host
        )
    if checks["cluster_address"] and node.address:
        rc, out, err = runner.run(["ip", "-o", "addr", "show"])
        if rc != 0:
            raise StageCheckError(f"{node.host}: ip -o addr show failed (rc {rc}): {err.strip()[:300]}")
        judge_address(out, node.address, node.host)
    return found


def _cached_help(module, files, checks, recipe):
    """The image's option list from the node's cache, asked of the image once (None in check mode)."""
    path = help_cache_file(checks["help_cache_dir"], recipe["image"])
    try:
        text = read_text(path, MAX_HELP_BYTES)
    except StateFileError as exc:
        raise StageCheckError(f"checks.help_cache_dir: {exc}; remove the file") from None
    if text is not None or module.check_mode:
        return text
    text = capture_help(Runner(checks["help_timeout"]), recipe)
    files.write(path, text, "checks.help_cache_dir")
    return text


def _staged_checks(module, files, checks, context, runner):
    """The checks on the staged units and the node's ports and units, then the guard programs."""
    recipe, node, result = context["recipe"], context["node"], context["result"]
    result["mounts"] = check_mounts(recipe, node.host)
    if checks["quadlet"] and recipe["deploy_mode"] == "quadlet":
        with tempfile.TemporaryDirectory(prefix="localinference-quadlet-") as scratch:
            unit_dir = context["unit_root"]
            if module.check_mode:  # nothing was written: check the units as rendered
                unit_dir = scratch
                for unit in context["units"]:
                    with open(os.path.join(scratch, unit["name"]), "w", encoding="utf-8") as handle:
                        handle.write(unit["content"])
            _quadlet_check(module, checks, recipe, unit_dir, result)
    if checks["ports"]:
        ports = stage_ports(recipe, result["document"], node.rank, node.nnodes)
        try:
            found = listeners(ports)
        except OSError as exc:
            raise StageCheckError(f"cannot read the node's listening sockets from /proc: {exc}") from None
        result["listeners"] = [item.as_dict() for item in found]
        strangers = foreign(found, sorted({*result["live_start_order"], *result["start_order"]}))
        if strangers:
            raise StageCheckError(refusal(strangers))
    if checks["unit_states"]:
        states = read_unit_states(runner, result["live_start_order"])
        result["live_active"] = {
            unit: states[unit]["ActiveState"] for unit in result["live_start_order"]
        }
        result["live_running"] = all_active(result["live_start_order"], states)
    installed = []
    for program in checks["programs"]:
        path = os.path.join(checks["programs_dir"], program["name"])
        if files.write(path, program["content"], "checks.programs", mode=0o755):
            installed.append(path)
    result["programs"] = installed
    return bool(installed)


def _live_checks(module, checks, recipe, unit_dir, result, runner):
    """state=verified: the live units pass the node's generator and systemd loaded every service."""
    if checks["quadlet"] and recipe["deploy_mode"] == "quadlet":
        _quadlet_check(module, checks, recipe, unit_dir, result)
    if checks["unit_states"]:
        missing = not_loaded(result["start_order"], read_unit_states(runner, result["start_order"]))
        if missing:
            raise StageCheckError(
                f"systemd has no loaded service for {', '.join(missing)}: the units are written but "
                "were not read (run systemctl daemon-reload, or the rollout again)"
            )


ARGUMENT_SPEC = {
    "recipe": {"type": "dict", "required": True},
    "plan_max_model_len": {"type": "int"},
    "node": {
        "type": "dict",
        "required": True,
        "options": {
            "host": {"type": "str", "required": True},
            "rank": {"type": "int", "required": True},
            "nnodes": {"type": "int", "required": True},
            "head_address": {"type": "str", "required": True},
            "address": {"type": "str", "default": ""},
            "env": {"type": "dict", "default": {}},
            "weights_path": {"type": "str", "required": True},
            "weights_digest": {"type": "str", "default": ""},
            "rdma": {"type": "dict", "default": {}},
        },
    },
    "state": {
        "type": "str",
        "default": "present",
        "choices": ["staged", "present", "verified", "absent"],
    },
    "path": {"type": "path", "default": "/etc/localinference/serving.json"},
    "staging_dir": {"type": "path", "default": "/etc/localinference/staging"},
    "unit_dir": {"type": "path"},
    "venv_dir": {"type": "path"},
    "help_text": {"type": "path"},
    "guards": {"type": "dict"},
    "slice_dir": {"type": "path"},
    "checks": {"type": "dict", "options": CHECKS_SPEC},
    "stop_live": {"type": "bool", "default": False},
    "stop_timeout": {"type": "float", "default": 300.0},
    "daemon_reload": {"type": "bool", "default": False},
}


def _inputs(module):
    """The validated recipe, node and paths; a bad value or combination ends the module."""
    params = module.params
    state, checks = params["state"], params["checks"]
    if checks is not None and state not in ("staged", "verified"):
        module.fail_json(msg=f"checks: only with state=staged or verified (state is {state}); remove checks")
    try:
        recipe = normalise(params["recipe"], params["plan_max_model_len"])
        try:
            node = make_node(params["node"])
        except validate.ValidationError as exc:
            source = NODE_SOURCES.get(exc.name.split(".")[1] if exc.name.startswith("node.") else "")
            if source:
                exc = validate.ValidationError(exc.name, exc.problem, f"{exc.fix} (the serve role takes it from {source})")
            raise exc from None
        found = {
            "recipe": recipe,
            "node": node,
            "state_path": _absolute("path", params["path"]),
            "staging_dir": _absolute("staging_dir", params["staging_dir"]),
            "unit_dir": validate.path("unit_dir", params["unit_dir"] or UNIT_DIRS[recipe["deploy_mode"]]),
            "venv_dir": validate.path(
                "venv_dir",
                params["venv_dir"] or f"/opt/localinference/vllm-{recipe.get('vllm_version', 'unset')}",
            ),
            "help_path": params["help_text"] and _absolute("help_text", params["help_text"]),
        }
        if checks is not None:
            _check_options(checks)
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    if not 0 <= node.rank < node.nnodes:
        module.fail_json(msg=f"node.rank {node.rank} is outside 0..{node.nnodes - 1}; the head is rank 0")
    if (params["stop_live"] or params["daemon_reload"]) and state != "present":
        module.fail_json(msg=f"stop_live and daemon_reload: only with state=present (state is {state})")
    if timeout_error(params["stop_timeout"]):
        module.fail_json(
            msg=f"stop_timeout: {params['stop_timeout']!r} is not a number of seconds above 0 and at "
            "most 86400; give the seconds one systemctl stop may take"
        )
    return found


def _memory(module, recipe, node, unit_dir):
    """``(slice_dir, guards, memory, capped)``: the units' memory guards and the node's need."""
    guards, memory, capped = None, None, []
    try:
        slice_dir = validate.path(
            "slice_dir",
            module.params["slice_dir"]
            or (unit_dir if recipe["deploy_mode"] == "systemd" else UNIT_DIRS["systemd"]),
        )
        if module.params["guards"] is not None:
            policy = parse_policy(module.params["guards"])
            capped = utilization_problems(recipe, policy)
            weights, weights_found = weights_on_disk(node.weights_path)
            guards = memory_guards(recipe, node.host, node.nnodes, policy, weights, _mem_total(module))
            gid_argv = gid_start_argv(policy.libexec_dir, node.rdma, node.address, node.env)
            if gid_argv:
                guards = dataclasses.replace(guards, gid_argv=gid_argv)
            memory = {**guards.need, "weights_found": weights_found}
            if memory["unified_memory"] and not weights and not memory["engine_bytes"]:
                module.warn(f"the admission need of {node.host} counts no weights: {weights_found}")
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    return slice_dir, guards, memory, capped


def _live(state_path, unit_dirs, document):
    """``(text, live, trusted, live_diff, findings)``: the node's document against the ask."""
    live_text, live, trusted, live_problems = _load(state_path, unit_dirs, "serving.json")
    if live_text is None and not live_problems:
        live_diff = differences(None, document)
    elif live_problems:
        # A malformed document is reported by what is wrong with it, not key by key.
        live_diff = list(live_problems) + unit_file_problems(trusted, read_text)
    else:
        # What is on disk against what was rendered: the restart path's one verifier.
        live_diff = verify_node(live, unit_dirs, read_text, wanted=document)["problems"]
    findings = [finding("F10", "error", problem, STATE_FIX) for problem in live_problems]
    return live_text, live, trusted, live_diff, findings


def _check_help(module, files, result, inputs, checks):
    """Every rendered flag exists in the targeted vLLM release (help_text or the image's cache)."""
    state, recipe, help_path = module.params["state"], inputs["recipe"], inputs["help_path"]
    text = None
    if help_path and state != "absent":
        try:
            text = read_text(help_path, MAX_HELP_BYTES)
        except StateFileError as exc:
            module.fail_json(msg=f"help_text: {exc}", **result)
        if text is None:
            module.fail_json(msg=f"help_text {help_path} does not exist", **result)
    elif state == "staged" and checks and checks["help_cache_dir"] and recipe["deploy_mode"] == "quadlet":
        text = _refused_or(module, result, _cached_help, module, files, checks, recipe)
    if text is None:
        return
    argv = (result["document"]["server_argv"] or []) + recipe["extra_args"]
    unknown = unknown_flags(argv, parse_help_flags(text))
    if unknown:
        module.fail_json(
            msg=f"vllm_recipe renders flags this vLLM release does not have: {', '.join(unknown)}; "
            "remove or rename them (see `vllm serve --help=all` of the targeted release)",
            unknown_flags=unknown,
            **result,
        )


def _current(path):
    try:
        return read_text(path)
    except StateFileError:
        return None  # a binary or unreadable file of ours is replaced


def _lstat_kind(path):
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode):
        return REMOVABLE
    return DIRECTORY if stat.S_ISDIR(info.st_mode) else SPECIAL


def _observe(state, units, trusted, state_path, staging_dir):
    """What ``decide`` weighs: the files a step may write or remove, the staged unit names."""
    writes, removals, names = [], [], ()
    if state == "staged":
        root = staged_unit_root(staging_dir)
        writes = [os.path.join(staging_dir, "serving.json"), *(os.path.join(root, u["name"]) for u in units)]
        names = tuple(os.listdir(root)) if os.path.isdir(root) else ()
        removals = [os.path.join(root, name) for name in names]
    elif state in ("present", "absent"):
        if state == "present":
            writes = [state_path, previous_path(state_path), *(u["path"] for u in units)]
        removals = [u["path"] for u in trusted["units"]]
    return Observed(
        texts={path: _current(path) for path in writes},
        directories=frozenset(path for path in {state_path, *writes} if os.path.isdir(path)),
        kinds={path: _lstat_kind(path) for path in removals},
        staged_names=names,
    )


def _apply(module, plan, files, runner, result, context):
    """Carry out ``plan`` (refused already in main) in order; returns the files left in place."""
    changed = False
    if module.params["state"] == "present":
        result["stopped"], result["reloaded"] = [], False
        if plan.stop is not None:
            result["stopped"] = _refused_or(module, result, stop_units, runner, plan.stop, module.check_mode)
        # Where the new boot's log begins (journalctl --since, the node's local time).
        result["stopped_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
        changed = bool(result["stopped"])
    refused, units_changed = list(plan.refused), False
    for step in plan.steps:
        if step.action == "write":
            done = files.write(step.path, step.text, step.option)
        else:
            done, problem = files.remove(step.path)
            refused += [problem] if problem else []
        changed |= done
        units_changed |= done and step.unit
    if plan.reload and units_changed:
        rc, _, err = runner.run(["systemctl", "daemon-reload"])
        if rc != 0:
            module.fail_json(msg=f"systemctl daemon-reload failed (rc {rc}): {err.strip()[:300]}", **result)
        result["reloaded"] = True
    checks = module.params["checks"]
    if plan.checks == "staged":
        changed |= _refused_or(module, result, _staged_checks, module, files, checks, context, runner)
    elif plan.checks == "live":
        recipe, unit_dir = context["recipe"], context["unit_dir"]
        _refused_or(module, result, _live_checks, module, checks, recipe, unit_dir, result, runner)
    result["changed"] = changed
    return refused


def _finish(module, result, findings, refused, unit_dirs, live_text, live):
    """Warn of every finding, name the rollback target and the diff, and return."""
    state_path = module.params["path"]
    findings += [finding("F10", "warning", problem, "remove it by hand if it is stale") for problem in refused]
    _, _, previous, previous_problems = _load(previous_path(state_path), unit_dirs, "serving.previous.json")
    findings += [
        finding("F10", "warning", problem, "the rollback has no target until the next update")
        for problem in previous_problems
    ]
    for item in findings:
        module.warn(f"{item['id']}: {item['message']}")
    result["previous_recipe"] = previous["recipe"] if not previous_problems else None
    result["previous_hash"] = previous["recipe_hash"] if not previous_problems else None
    if module._diff:
        before = dump(live) if live is not None else (live_text or "")[:4096]
        result["diff"] = {
            "before": before,
            "after": dump(result["document"]) if module.params["state"] != "absent" else before,
            "before_header": state_path,
            "after_header": state_path,
        }
    module.exit_json(**result)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    state, checks = params["state"], params["checks"]
    inputs = _inputs(module)
    recipe, node, unit_dir = inputs["recipe"], inputs["node"], inputs["unit_dir"]
    runner = Runner(checks["timeout"] if checks is not None else params["stop_timeout"])
    checked = {}
    if checks is not None and state == "staged":
        checked = _refused_or(module, {}, _node_checks, checks, node, runner)
    try:
        layout = layout_problems(recipe, node)
    except RecipeInputError as exc:
        module.fail_json(msg=f"vllm_recipe: {exc}")
    slice_dir, guards, memory, capped = _memory(module, recipe, node, unit_dir)
    # Unit records in a node's document are trusted only inside these directories.
    unit_dirs = sorted({unit_dir, slice_dir, *UNIT_DIRS.values()})
    try:
        wanted = desired(recipe, node, unit_dir, inputs["venv_dir"], guards, slice_dir)
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    document = wanted["document"]
    live_text, live, trusted, live_diff, findings = _live(inputs["state_path"], unit_dirs, document)
    result = {
        "changed": False,
        "recipe": recipe,
        "recipe_hash": document["recipe_hash"],
        "document": document,
        "units": wanted["units"],
        "start_order": document["start_order"],
        "server_argv": document["server_argv"],
        "ray_argv": document["ray_argv"],
        "environment": document["environment"],
        "problems": problems(recipe) + layout + capped,
        "live_hash": trusted["recipe_hash"],
        "live_start_order": trusted["start_order"],
        "live_recipe": trusted["recipe"],
        "live_matches": not live_diff,
        "differences": live_diff,
        "live_findings": findings,
        "memory": memory,
        **checked,
    }
    files = _Files(module, result)
    observed = _observe(state, wanted["units"], trusted, inputs["state_path"], inputs["staging_dir"])
    options = {
        "path": inputs["state_path"],
        "staging_dir": inputs["staging_dir"],
        "problems": result["problems"],
        "stop_live": params["stop_live"],
        "daemon_reload": params["daemon_reload"],
        "checks": checks is not None,
        "check_mode": module.check_mode,
    }
    plan = decide(state, wanted, live, trusted, live_diff, observed, options)
    if plan.refusal:  # before the image is asked for its flags or anything is written
        module.fail_json(msg=plan.refusal, **result)
    _check_help(module, files, result, inputs, checks)
    context = {"recipe": recipe, "node": node, "result": result, "unit_dir": unit_dir,
               "unit_root": staged_unit_root(inputs["staging_dir"]), "units": wanted["units"]}
    refused = _apply(module, plan, files, runner, result, context)
    _finish(module, result, findings, refused, unit_dirs, live_text, live)


if __name__ == "__main__":
    main()
