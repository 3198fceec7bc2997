# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the output of ``quadlet -dryrun`` and find what Podman would refuse at run time.

The Quadlet generator accepts ``--ipc=host`` together with ``ShmSize=``; Podman
rejects the pair only when the container starts (F14).  ``--privileged`` passes
everywhere and grants everything (F17).  Both are checked on the command line
the generator actually produced, so PodmanArgs= and every other path are covered.
"""

from __future__ import annotations

import re
import shlex

_SECTION = re.compile(r"^---(?P<name>[^\n]+?)---$", re.MULTILINE)


def split_dryrun(output: str) -> dict[str, str]:
    """``{service name: unit text}`` from ``quadlet -dryrun`` standard output."""
    matches = list(_SECTION.finditer(output))
    units = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(output)
        units[match.group("name")] = output[match.end() : end].strip("\n") + "\n"
    return units


class QuadletOutputError(ValueError):
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
