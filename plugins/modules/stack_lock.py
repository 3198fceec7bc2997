#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: stack_lock
short_description: Record the whole stack that served, diff it against the last good one, read it back
version_added: 0.2.0
description:
  - The stack lockfile (default C(/etc/localinference/stack.lock.json), on the head) keeps the newest
    O(keep) stacks that served, newest first. Each entry has C(recorded_at), C(stack_hash) and, per node,
    the image reference, digest and local id, the vLLM version, the recipe hash and the full normalised
    recipe, the model revision and the digest of its weights manifest, the kernel, the driver and CUDA
    versions, the GPU names, the NCCL version and the firmware of the cluster NICs and RDMA devices.
    A value the node cannot tell is null.
  - O(state=gathered) reads one node (run it on every node). Every command runs with a timeout and a C
    locale; a command that fails or times out leaves its value null with a warning. It changes nothing.
  - O(state=recorded) puts the stack made of the O(nodes) records on top of the history (on the head).
    The same stack as the newest entry adds nothing and reports no change. A file that cannot be
    trusted is kept beside it as C(<path>.malformed) and a new history starts (RV(findings) lists why).
  - O(state=diffed) changes nothing. With O(nodes) it returns what recording them would change; without,
    what the last change brought (the last good stack to the current one).
  - O(state=read) changes nothing and returns the history and what C(--tags revert) would do (RV(revert)).
  - The file read back from the node is schema-checked (the types of every key, each entry against its
    C(stack_hash), each recipe against its C(recipe_hash)); what is wrong is returned as findings, never
    a traceback.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes.CHANGES
options:
  state:
    description: What to do (see the description).
    type: str
    choices: [gathered, recorded, diffed, read]
    default: read
  path:
    description: The lockfile (O(state=recorded), O(state=diffed), O(state=read)).
    type: path
    default: /etc/localinference/stack.lock.json
  nodes:
    description:
      - Each node's inventory name mapped to the C(node) that O(state=gathered) returned on it
        (O(state=recorded), O(state=diffed)).
    type: dict
  keep:
    description: How many entries the history keeps (O(state=recorded)).
    type: int
    default: 10
  state_path:
    description: The node's reconciled state document, whose recipe, hash, rank and environment are read (O(state=gathered)).
    type: path
    default: /etc/localinference/serving.json
  weights_path:
    description:
      - The model snapshot directory on the node; the digest is taken from its manifest
        C(<repo>/localinference-manifests/<revision>.json) (O(state=gathered)). Empty leaves it null.
    type: str
    default: ''
  vllm_version:
    description: The vLLM version this run read from the boot log, if it read one (O(state=gathered)).
    type: str
  read_log:
    description:
      - Read the current run of C(localinference-vllm.service) from the journal for the vLLM and NCCL
        versions (O(state=gathered)); for a boot this rollout started.
    type: bool
    default: false
  previous:
    description:
      - This node's record in the current stack (the newest entry), from O(state=read) on the head.
        Its vLLM and NCCL versions are reused when the node runs the same image (O(state=gathered)).
    type: dict
    default: {}
  query_image:
    description:
      - When the vLLM version is still unknown, run C(<entrypoint> --version) in the image
        (C(podman run --rm --pull=never --network=none), bounded by O(image_timeout)) (O(state=gathered), quadlet).
    type: bool
    default: false
  venv_root:
    description: Root of the venvs of deploy_mode systemd (C(<root>/vllm-<vllm_version>)), for the dist-info versions.
    type: path
    default: /opt/localinference
  sys_root:
    description: Where sysfs is mounted (C(class/net), C(class/infiniband)).
    type: path
    default: /sys
  timeout:
    description: Seconds each read command (podman image inspect, journalctl, nvidia-smi, ethtool) may take.
    type: float
    default: 30
  image_timeout:
    description: Seconds C(vllm --version) in the image may take (it imports vLLM).
    type: float
    default: 180
notes:
  - Commands run with C(LC_ALL=C).
"""

EXAMPLES = r"""
- name: Read the head's lockfile
  localinference.vllm.stack_lock:
    state: read
  register: stack

- name: Gather each node's stack
  localinference.vllm.stack_lock:
    state: gathered
    weights_path: /srv/models/hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567
    previous: "{{ (stack.entry.nodes | default({}))[inventory_hostname] | default({}) }}"
  register: node_stack

- name: Record the stack on the head
  localinference.vllm.stack_lock:
    state: recorded
    nodes: "{{ dict(groups['vllm_cluster'] | zip(groups['vllm_cluster'] | map('extract', hostvars, ['node_stack', 'node']))) }}"
  when: inventory_hostname == groups['vllm_head'][0]
  register: recorded

- name: Print what changed since the last good stack
  ansible.builtin.debug:
    msg: "{{ recorded.changes }}"
  when: recorded is changed
"""

RETURN = r"""
node:
  description: This node's record (O(state=gathered)).
  returned: state=gathered
  type: dict
  sample:
    rank: 0
    deploy_mode: quadlet
    image: localhost/localinference-vllm-cpu@sha256:6f1d...
    image_digest: sha256:6f1d...
    image_id: 0b7e...
    vllm_version: 0.32.0
    recipe_hash: 39c6af1567e6a9c3c59447fc395848a1e42f53aff98c82106197aef08916d166
    recipe: {model: localinference/tiny-deepseek, max_num_seqs: 4}
    model: localinference/tiny-deepseek
    revision: 5eed0c0ffee0000000000000000000000000000a
    manifest_digest: 2c26...
    kernel: 6.8.0-49-generic
    driver_version: "580.173.02"
    cuda_version: "13.0"
    gpus: [NVIDIA GB10]
    nccl_version: null
    nics: {enp1s0f0np0: null}
    hcas: {}
sources:
  description:
    - Where C(vllm_version) and C(nccl_version) came from (C(boot log), C(journal), C(last good stack),
      C(image env), C(venv), C(image)); null when unknown.
  returned: state=gathered
  type: dict
entry:
  description: The stack recorded (or that would be), or the current one (O(state=read)); null when none.
  returned: state=recorded, state=diffed, state=read
  type: dict
changes:
  description:
    - "What changed since the last good stack, one line each (C(image: A -> B), C(recipe.max_num_seqs: 4 -> 8),
      C(spark-worker kernel: A -> B)). Empty when the stack is the one already recorded."
  returned: state=recorded, state=diffed, state=read
  type: list
  elements: str
last_good:
  description: The good stack before RV(entry), or null.
  returned: state=recorded, state=diffed, state=read
  type: dict
added:
  description: Whether RV(entry) is a new stack on top of the history (false when it is the newest entry already).
  returned: state=recorded, state=diffed
  type: bool
entries:
  description: The whole history, newest first (entries that failed the schema check left out).
  returned: state=read
  type: list
  elements: dict
revert:
  description:
    - What C(--tags revert) would do. C(possible), C(reason) (why not), C(recipe) and C(recipe_hash) of
      the last good stack's head, its C(recorded_at), and C(changes) from the current stack to it.
  returned: state=read
  type: dict
findings:
  description: Problems with the lockfile read back (C(id) stack_lock, C(severity), C(message), C(fix)).
  returned: state=recorded, state=diffed, state=read
  type: list
  elements: dict
found:
  description: Whether the lockfile exists.
  returned: state=recorded, state=diffed, state=read
  type: bool
path:
  description: The lockfile.
  returned: state=recorded, state=diffed, state=read
  type: str
"""

import glob
import json
import os
import tempfile
from datetime import UTC, datetime
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
    timeout_error,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import recipe_hash
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_log import parse_log
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._ethtool_facts import (
    EthtoolParseError,
    parse_driver,
    sysfs_text,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._gpu_facts import (
    NvidiaSmiParseError,
    parse_table,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    StateFileError,
    parse_document,
    read_text,
)
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade import (
    _stack_facts as facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade import _stack_lock as lock
from ansible_collections.localinference.vllm.plugins.module_utils.weights._manifest import (
    ManifestError,
    default_manifest_path,
    validate_manifest,
)

SERVER_UNIT = "localinference-vllm.service"
MAX_LOCK_BYTES = 16 * 1024 * 1024
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
LOG_LINES = 20000

ARGUMENT_SPEC: dict[str, Any] = {
    "state": {
        "type": "str",
        "default": "read",
        "choices": ["gathered", "recorded", "diffed", "read"],
    },
    "path": {"type": "path", "default": "/etc/localinference/stack.lock.json"},
    "nodes": {"type": "dict"},
    "keep": {"type": "int", "default": lock.DEFAULT_KEEP},
    "state_path": {"type": "path", "default": "/etc/localinference/serving.json"},
    "weights_path": {"type": "str", "default": ""},
    "vllm_version": {"type": "str"},
    "read_log": {"type": "bool", "default": False},
    "previous": {"type": "dict", "default": {}},
    "query_image": {"type": "bool", "default": False},
    "venv_root": {"type": "path", "default": "/opt/localinference"},
    "sys_root": {"type": "path", "default": "/sys"},
    "timeout": {"type": "float", "default": 30.0},
    "image_timeout": {"type": "float", "default": 180.0},
}


class _Gather:
    """The bounded reads of one node; a read that fails leaves null and a warning."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.runner = Runner(self.params["timeout"])
        self.warnings: list[str] = []

    def run(self, argv: list[str], what: str, timeout: float | None = None) -> str | None:
        try:
            rc, out, err = self.runner.run(argv, timeout=timeout)
        except CommandError as exc:
            self.warnings.append(f"{what}: {exc}")
            return None
        if rc != 0:
            self.warnings.append(
                f"{what}: {' '.join(argv)} failed (rc={rc}): {(err or out).strip()[:300]}"
            )
            return None
        return out

    def binary(self, name: str) -> str | None:
        return self.module.get_bin_path(name)

    def serving_state(self) -> tuple[dict[str, Any], int, dict[str, Any]]:
        path = self.params["state_path"]
        fix = "run the rollout (it writes the node's reconciled state) before recording its stack"
        try:
            text = read_text(path)
        except StateFileError as exc:
            self.module.fail_json(msg=f"state_path: {exc}; {fix}")
        if text is None:
            self.module.fail_json(
                msg=f"state_path: {path} does not exist: nothing serves here; {fix}"
            )
        document, problems = parse_document(text, path)
        node = document.get("node") if isinstance(document, dict) else None
        recipe = document.get("recipe") if isinstance(document, dict) else None
        digest = document.get("recipe_hash") if isinstance(document, dict) else None
        rank = node.get("rank") if isinstance(node, dict) else None
        if not problems:
            if not isinstance(recipe, dict) or not isinstance(digest, str):
                problems.append(f"{path} has no recipe and recipe_hash")
            elif recipe_hash(recipe) != digest:
                problems.append(f"{path}: the recipe does not hash to its recipe_hash (edited?)")
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                problems.append(f"{path}: node.rank is {rank!r}, not a rank")
        if problems:
            self.module.fail_json(msg=f"state_path: {'; '.join(problems)}; {fix}")
        environment = document.get("environment")
        return recipe, rank, environment if isinstance(environment, dict) else {}

    def image(self, recipe: dict[str, Any]) -> dict[str, Any]:
        podman = self.binary("podman")
        if recipe.get("deploy_mode", "quadlet") != "quadlet" or not recipe.get("image"):
            return {}
        if not podman:
            self.warnings.append(
                "podman not found: the image's local id and environment are unknown"
            )
            return {}
        out = self.run([podman, "image", "inspect", recipe["image"]], "image")
        if out is None:
            return {}
        try:
            return facts.parse_image_inspect(out)
        except facts.StackFactsError as exc:
            self.warnings.append(f"image: {exc}")
            return {}

    def journal(self) -> str:
        systemctl, journalctl = self.binary("systemctl"), self.binary("journalctl")
        if not (systemctl and journalctl):
            return ""
        out = self.run([systemctl, "show", "-p", "InvocationID", "--value", SERVER_UNIT], "journal")
        invocation = facts.invocation_id(out or "")
        if invocation is None:
            return ""
        argv = [journalctl, "--unit", SERVER_UNIT, f"_SYSTEMD_INVOCATION_ID={invocation}"]
        argv += ["--output", "cat", "--no-pager", "--lines", str(LOG_LINES)]
        return self.run(argv, "journal") or ""

    def gpu(self) -> dict[str, Any]:
        nvidia_smi = self.binary("nvidia-smi")
        if not nvidia_smi:
            return {}
        out = self.run([nvidia_smi], "GPU")
        if out is None:
            return {}
        try:
            table = parse_table(out)
        except NvidiaSmiParseError as exc:
            self.warnings.append(f"GPU: {exc}")
            return {}
        return {
            "driver_version": table["driver_version"],
            "cuda_version": table["cuda_version"],
            "gpus": [gpu["name"] for gpu in table["gpus"]],
        }

    def firmware(self, interfaces: list[str], hcas: list[str]) -> tuple[dict, dict]:
        sys_root = self.params["sys_root"]
        ethtool = self.binary("ethtool")
        nics: dict[str, str | None] = {}
        for name in interfaces:
            if not os.path.isdir(os.path.join(sys_root, "class", "net", name)):
                continue
            nics[name] = None
            out = self.run([ethtool, "-i", name], f"NIC {name}") if ethtool else None
            if out is not None:
                try:
                    nics[name] = parse_driver(out)["firmware_version"]
                except EthtoolParseError as exc:
                    self.warnings.append(f"NIC {name}: {exc}")
        devices: dict[str, str | None] = {}
        for name in hcas:
            directory = os.path.join(sys_root, "class", "infiniband", name)
            if os.path.isdir(directory):
                devices[name] = _sysfs(os.path.join(directory, "fw_ver"))
        return nics, devices

    def manifest(self, recipe: dict[str, Any]) -> str | None:
        snapshot = self.params["weights_path"]
        if not snapshot:
            return None
        path = default_manifest_path(snapshot)
        try:
            text = read_text(path, MAX_MANIFEST_BYTES)
            if text is None:
                self.warnings.append(f"weights: no manifest at {path} (run the weights stage)")
                return None
            document = validate_manifest(json.loads(text), path)
        except (StateFileError, ManifestError, ValueError, RecursionError) as exc:
            self.warnings.append(f"weights: {exc}")
            return None
        return facts.manifest_digest(document)

    def venv_versions(self, recipe: dict[str, Any]) -> dict[str, str | None]:
        version = recipe.get("vllm_version")
        if recipe.get("deploy_mode") != "systemd" or not version:
            return {}
        pattern = os.path.join(
            self.params["venv_root"], f"vllm-{version}", "lib", "python*", "site-packages"
        )
        names = [name for directory in glob.glob(pattern) for name in os.listdir(directory)]
        return {
            "vllm_version": facts.dist_info_version(names, "vllm"),
            "nccl_version": facts.dist_info_version(names, "nvidia_nccl_cu*"),
        }

    def image_version(self, recipe: dict[str, Any]) -> str | None:
        podman = self.binary("podman")
        if not podman:
            return None
        argv = [podman, "run", "--rm", "--pull=never", "--network=none", "--entrypoint"]
        argv += [recipe.get("entrypoint") or "vllm", recipe["image"], "--version"]
        out = self.run(argv, "vLLM version", timeout=self.params["image_timeout"])
        return facts.version_from_output(out) if out is not None else None


def _sysfs(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return sysfs_text(handle.read(4096))
    except (OSError, ValueError):
        return None


def gather(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    reader = _Gather(module)
    recipe, rank, environment = reader.serving_state()
    interfaces, hcas = facts.cluster_devices(environment)
    image = reader.image(recipe)
    log = reader.journal() if params["read_log"] else ""
    venv = reader.venv_versions(recipe)
    nics, devices = reader.firmware(interfaces, hcas)
    gathered = {
        "image_id": image.get("id"),
        "image_digest": image.get("digest"),
        "kernel": os.uname().release,
        "manifest_digest": reader.manifest(recipe),
        "nics": nics,
        "hcas": devices,
        **reader.gpu(),
    }
    fresh = {
        "vllm_version": [
            ("boot log", params["vllm_version"]),
            ("journal", parse_log(log)["version"] if log else None),
        ],
        "nccl_version": [("journal", facts.nccl_from_log(log) if log else None)],
    }
    fallback = {
        "vllm_version": [("venv", venv.get("vllm_version"))],
        "nccl_version": [
            ("image env", facts.nccl_from_env(image.get("env") or {})),
            ("venv", venv.get("nccl_version")),
        ],
    }
    record, sources, warnings = facts.node_record(
        rank=rank,
        recipe=recipe,
        recipe_hash=recipe_hash(recipe),
        facts=gathered,
        fresh=fresh,
        fallback=fallback,
        previous=params["previous"] or None,
    )
    if record["vllm_version"] is None and params["query_image"] and record["image"]:
        version = reader.image_version(recipe)
        if version:
            record["vllm_version"], sources["vllm_version"] = version, "image"
    problems = lock.node_problems(record)
    if problems:
        module.fail_json(
            msg=f"this node's stack cannot be recorded: {'; '.join(problems)}", node=record
        )
    for warning in reader.warnings + warnings:
        module.warn(f"stack_lock: {warning}")
    return {"changed": False, "node": record, "sources": sources}


def _read_lock(path: str) -> tuple[bool, str | None, list[dict[str, Any]], list[dict[str, Any]]]:
    """``(found, text, entries, findings)``; a file that cannot be read is a finding."""
    try:
        text = read_text(path, MAX_LOCK_BYTES)
    except StateFileError as exc:
        fix = f"move {path} aside (the next good rollout records a new history)"
        return True, None, [], [finding(lock.CHECK, "error", str(exc), fix, path=path)]
    if text is None:
        return False, None, [], []
    entries, findings = lock.check_document(text, path)
    return True, text, entries, findings


def _write(module: AnsibleModule, path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".stack-lock-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    module.atomic_move(tmp, path)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def history(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    path = params["path"]
    found, text, entries, findings = _read_lock(path)
    for item in findings:
        module.warn(f"stack_lock: {item['message']}")
    out: dict[str, Any] = {"changed": False, "path": path, "found": found, "findings": findings}
    state = params["state"]
    if state == "read":
        current = entries[0] if entries else None
        last_good = entries[1] if len(entries) > 1 else None
        out.update(
            entry=current,
            last_good=last_good,
            changes=lock.diff_entries(last_good, current) if last_good else [],
            entries=entries,
            revert=lock.revert_plan(entries, findings, path),
        )
        return out
    if params["nodes"] is None:
        if state == "recorded":
            raise lock.StackLockError(
                "nodes is required with state=recorded (the gathered records)"
            )
        current = entries[0] if entries else None
        last_good = entries[1] if len(entries) > 1 else None
        out.update(
            entry=current,
            last_good=last_good,
            changes=lock.diff_entries(last_good, current) if last_good else [],
        )
        return out
    entry = lock.build_entry(params["nodes"], _now())
    result = lock.record(entries, entry, params["keep"])
    out.update(
        entry=result["entry"],
        changes=result["changes"],
        last_good=result["last_good"],
        added=result["added"],
    )
    if state == "diffed":
        return out
    new_text = lock.render(result["entries"])
    out["changed"] = changed = new_text != text
    if changed and not module.check_mode:
        if findings and text is not None and any(f["severity"] == "error" for f in findings):
            _write(module, path + ".malformed", text)
        _write(module, path, new_text)
    if module._diff:
        out["diff"] = {
            "before": text or "",
            "after": new_text,
            "before_header": path,
            "after_header": path,
        }
    return out


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    for option in ("timeout", "image_timeout"):
        problem = timeout_error(module.params[option], option)
        if problem:
            module.fail_json(msg=problem)
    try:
        result = gather(module) if module.params["state"] == "gathered" else history(module)
    except lock.StackLockError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"cannot access the stack lockfile {module.params['path']}: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
