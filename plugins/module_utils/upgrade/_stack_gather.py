# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``stack_lock`` state=gathered: this node's record, read from the node.

Bounded commands and reads (the serving state, the image, the journal, the GPU, the NIC and
HCA firmware, the weights manifest, the venv), each a warning and a null when it fails; the
record itself is ``_stack_facts.node_record``'s, judged by ``_stack_lock.node_problems``.

No AnsibleModule here: ``module`` is the caller's (``params``, ``get_bin_path``, ``warn``,
``fail_json``).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._manifest_file import (
    ManifestError,
    default_manifest_path,
    validate_manifest,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import recipe_hash
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_log import parse_log
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._ethtool_facts import (
    EthtoolParseError,
    parse_driver,
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

SERVER_UNIT = "localinference-vllm.service"
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
LOG_LINES = 20000


class _Gather:
    """The bounded reads of one node; a read that fails leaves null and a warning."""

    def __init__(self, module: Any) -> None:
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
                devices[name] = _files.read_sysfs(os.path.join(directory, "fw_ver"))
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


def gather(module: Any) -> dict[str, Any]:
    """This node's record of the lockfile (state=gathered); a stack that cannot be recorded ends the module."""
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
