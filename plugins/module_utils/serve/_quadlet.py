# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the output of ``quadlet -dryrun`` and find what Podman would refuse at run time.

The Quadlet generator accepts ``--ipc=host`` together with ``ShmSize=``; Podman
rejects the pair only when the container starts (F14).  ``--privileged`` passes
everywhere and grants everything (F17).  Both are checked on the command line
the generator actually produced, so PodmanArgs= and every other path are covered.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    CommandTimeout,
    Runner,
    timeout_error,
)

_SECTION = re.compile(r"^---(?P<name>[^\n]+?)---$", re.MULTILINE)


def split_dryrun(output: str) -> dict[str, str]:
    """``{service name: unit text}`` from ``quadlet -dryrun`` standard output."""
    matches = list(_SECTION.finditer(output))
    units = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(output)
        units[match.group("name")] = output[match.end() : end].strip("\n") + "\n"
    return units


class QuadletOutputError(validate.InputError):
    """Generator output this module cannot read; the message quotes the offending line."""


def systemd_split(command: str) -> list[str]:
    """Split an ExecStart= value into argv the way systemd hands it to the program.

    Raises :class:`QuadletOutputError` for an unbalanced quote or a trailing escape.
    """
    try:
        words = shlex.split(command, posix=True)
    except ValueError as exc:
        raise QuadletOutputError(f"cannot split {command[:120]!r} into words ({exc})") from None
    return [word.replace("$$", "$").replace("%%", "%") for word in words]


def exec_start(unit_text: str) -> list[str]:
    """argv of the (last) ExecStart= line of a generated service, or [].

    Raises :class:`QuadletOutputError` when the line cannot be split.
    """
    argv: list[str] = []
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            argv = systemd_split(line[len("ExecStart=") :])
    return argv


def run_time_conflicts(argv: list[str], allow_privileged: bool = False) -> list[dict[str, object]]:
    """F14/F17 findings for one generated ``podman run`` command line.

    Only Podman's own options count: flags after the image belong to vLLM.
    """
    argv = podman_options(argv)
    ipc_host = False
    shm = False
    privileged = False
    for index, token in enumerate(argv):
        nxt = argv[index + 1] if index + 1 < len(argv) else ""
        if token in ("--ipc=host",) or (token == "--ipc" and nxt == "host"):
            ipc_host = True
        elif token == "--shm-size" or token.startswith("--shm-size="):
            shm = True
        elif token in ("--privileged", "--privileged=true"):
            privileged = True
    found: list[dict[str, object]] = []
    if ipc_host and shm:
        found.append(
            {
                "id": "F14",
                "blocking": True,
                "message": "the container asks for --ipc=host and --shm-size together; Podman "
                "refuses this pair when the container starts. Set ipc_host: false (keep "
                "shm_size) or ipc_host: true without shm_size in vllm_recipe",
            }
        )
    if privileged:
        found.append(
            {
                "id": "F17",
                "blocking": not allow_privileged,
                "message": "the container runs --privileged (every device and capability). "
                "Grant GPUs with vllm_recipe.devices (AddDevice=nvidia.com/gpu=N) and keep "
                "privileged: false",
            }
        )
    return found


def image_args_start(argv: list[str]) -> int:
    """Index of the image in a ``podman run`` argv (first non-option after ``run``).

    Only needed to tell Podman options from the program's own arguments: a
    ``--privileged`` after the image belongs to vLLM, not to Podman.
    """
    takes_value = {
        "--name", "--cidfile", "--shm-size", "--entrypoint", "--ulimit", "--network", "-v",
        "--volume", "--env", "-e", "--label", "-l", "--device", "--ipc", "--publish", "-p",
        "--cgroups", "--sdnotify", "--user", "--group-add", "--hostname", "--env-file",
        "--pull", "--security-opt", "--cap-add", "--cap-drop", "--tmpfs", "--mount", "--pod",
    }  # fmt: skip
    try:
        index = argv.index("run") + 1
    except ValueError:
        return len(argv)
    while index < len(argv):
        token = argv[index]
        if token in takes_value:
            index += 2
        elif token.startswith("-"):
            index += 1
        else:
            return index
    return index


def podman_options(argv: list[str]) -> list[str]:
    """The Podman options of a ``podman run`` argv (what precedes the image)."""
    return argv[: image_args_start(argv)]


# The generator's diagnostics quoted in a failure message, at most.
MAX_MESSAGE = 2000


class QuadletCheckError(validate.Error):
    """The units fail the generator check; ``extra`` is what the module returns with it."""

    def __init__(self, msg: str, **extra: object) -> None:
        super().__init__(msg)
        self.extra = {"findings": [], "stderr": "", **extra}


def container_files(unit_dir: str) -> list[str]:
    """Names of the ``.container`` files in ``unit_dir``; anything else is an error so named."""
    try:
        names = sorted(n for n in os.listdir(unit_dir) if n.endswith(".container"))
    except OSError as exc:
        raise QuadletCheckError(f"unit_dir: {unit_dir} cannot be listed ({exc.strerror})") from None
    for name in names:
        path = os.path.join(unit_dir, name)
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise QuadletCheckError(
                f"unit_dir: {path} cannot be read ({exc.strerror}); remove or fix it"
            ) from None
        if not stat.S_ISREG(mode):
            raise QuadletCheckError(
                f"unit_dir: {path} is not a regular file; remove it (only unit files belong "
                "in a Quadlet directory)"
            )
    if not names:
        raise QuadletCheckError(
            f"unit_dir: {unit_dir} holds no .container file; nothing to check (render the "
            "units first: serving_state state=staged or present)"
        )
    return names


def check_units(
    unit_dir: str, quadlet: str, allow_privileged: bool = False, timeout: float = 60.0
) -> dict[str, object]:
    """Run the node's generator on ``unit_dir``: ``{services, findings, stderr}``.

    Raises :class:`QuadletCheckError` when the generator is missing, rejects the
    units, produces no service or no ExecStart= for one of them, or when a
    blocking F14/F17 finding is on a generated ``podman run`` line.
    """
    if not (os.path.isfile(quadlet) and os.access(quadlet, os.X_OK)):
        raise QuadletCheckError(
            f"quadlet: {quadlet} is not an executable file; Quadlet needs Podman 4.4 or later "
            "(Debian trixie, Ubuntu 24.04) or set deploy_mode: systemd"
        )
    if not os.path.isdir(unit_dir):
        why = "does not exist" if not os.path.lexists(unit_dir) else "is not a directory"
        raise QuadletCheckError(f"unit_dir: {unit_dir} {why}")
    expected = set(container_files(unit_dir))
    runner = Runner(timeout, {"QUADLET_UNIT_DIRS": unit_dir})
    try:
        rc, out, err = runner.run(
            [quadlet, "-dryrun"], hint="raise timeout only if the generator is merely slow"
        )
    except CommandTimeout as exc:
        raise QuadletCheckError(f"quadlet: {exc}") from None
    except CommandError as exc:
        reason = str(exc).split(": ", 1)[-1]
        raise QuadletCheckError(
            f"quadlet: {quadlet} cannot be run ({reason}); point quadlet at Podman's "
            "generator (/usr/libexec/podman/quadlet)"
        ) from None
    if rc != 0:
        lines = [line for line in err.splitlines() if "Loading source unit file" not in line]
        detail = " ".join(lines).strip() or f"no diagnostics, exit code {rc}"
        raise QuadletCheckError(
            f"the Quadlet generator rejected the units in {unit_dir}: {detail[:MAX_MESSAGE]}",
            stderr=err,
            rc=rc,
        )
    services: dict[str, dict[str, list[str]]] = {}
    for name, text in split_dryrun(out).items():
        try:
            services[name] = {"exec_start": exec_start(text)}
        except QuadletOutputError as exc:
            raise QuadletCheckError(
                f"the Quadlet generator's ExecStart= for {name} is unreadable: {exc}", stderr=err
            ) from None
    produced = {name.rsplit(".", 1)[0] + ".container" for name in services}
    missing = sorted(expected - produced)
    if missing:
        raise QuadletCheckError(
            f"the Quadlet generator produced no service for {', '.join(missing)}",
            stderr=err,
            services=services,
        )
    empty = sorted(name for name, service in services.items() if not service["exec_start"])
    if empty:
        raise QuadletCheckError(
            f"the Quadlet generator produced no ExecStart= for {', '.join(empty)}",
            stderr=err,
            services=services,
        )
    findings = []
    for name, service in sorted(services.items()):
        for found in run_time_conflicts(service["exec_start"], allow_privileged):
            findings.append({**found, "service": name})
    blocking = [f for f in findings if f["blocking"]]
    if blocking:
        raise QuadletCheckError(
            "; ".join(f"{f['service']}: {f['id']}: {f['message']}" for f in blocking),
            findings=findings,
            services=services,
            stderr=err,
        )
    return {"services": services, "findings": findings, "stderr": err}


def run(module: Any) -> dict[str, Any]:
    """The ``quadlet_verify`` module: the node's generator on ``unit_dir``, findings that do not block warned.

    ``module`` is the caller's AnsibleModule (``params``, ``warn``, ``fail_json``).
    """
    problem = timeout_error(module.params["timeout"])
    if problem:
        module.fail_json(msg=problem, findings=[], stderr="")
    try:
        result = check_units(
            module.params["unit_dir"],
            module.params["quadlet"],
            module.params["allow_privileged"],
            module.params["timeout"],
        )
    except QuadletCheckError as exc:
        module.fail_json(msg=str(exc), **exc.extra)
    for finding in result["findings"]:
        module.warn(f"{finding['service']}: {finding['id']}: {finding['message']}")
    return {"changed": False, **result}
