# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""External commands with a deadline, a C locale and output that always decodes.

``AnsibleModule.run_command`` (ansible-core 2.19) has no timeout: a wedged
``nvidia-smi`` (a GPU driver stuck in the kernel) hangs the task forever, and
preflight is the stage meant to diagnose such nodes.  Every facts module runs
its commands through :class:`Runner`, created once per module with the C
locale, so that output parses the same everywhere and nothing waits forever.

On timeout the whole process group is killed.  A process stuck in the kernel
(uninterruptible sleep) survives SIGKILL; it is then left behind rather than
waited for, and the error says so.

No AnsibleModule here: this file is unit-tested on its own.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

C_LOCALE = {"LC_ALL": "C", "LANG": "C", "LANGUAGE": "C"}
DEFAULT_TIMEOUT = 30.0
# How long a killed process gets to disappear before it is left behind.
KILL_GRACE = 2.0


class CommandError(validate.Error):
    """A command could not be run or did not finish; the message says which and why."""


class CommandTimeout(CommandError):
    """A command did not finish within its timeout."""

    def __init__(self, argv: Sequence[str], timeout: float, hint: str | None, killed: bool) -> None:
        self.argv = list(argv)
        self.timeout = timeout
        self.killed = killed
        name = os.path.basename(argv[0]) if argv else "command"
        message = f"{name} did not answer within {timeout:g} s"
        if not killed:
            message += " and survived SIGKILL (stuck in the kernel)"
        message += f" (ran: {' '.join(argv)})"
        if hint:
            message += f": {hint}"
        super().__init__(message)


def timeout_error(value: object, option: str = "timeout") -> str | None:
    """Why ``value`` is not a usable timeout in seconds, or None when it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{option} must be a number of seconds, got {value!r}"
    if not math.isfinite(value) or value <= 0:
        return f"{option} must be a positive, finite number of seconds, got {value!r}"
    if value > 86400:
        return f"{option} must be at most 86400 seconds (one day), got {value!r}"
    return None


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def _stop(proc: subprocess.Popen) -> bool:
    """Kill the process group; True when the process is gone."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()
    try:
        proc.wait(timeout=KILL_GRACE)
        gone = True
    except subprocess.TimeoutExpired:
        gone = False
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    return gone


def run_bounded(
    argv: Sequence[str],
    timeout: float,
    environ: Mapping[str, str] | None = None,
    hint: str | None = None,
) -> tuple[int, str, str]:
    """Run ``argv`` (no shell) and return ``(rc, stdout, stderr)`` as text.

    Raises :class:`CommandTimeout` when it does not finish within ``timeout``
    seconds and :class:`CommandError` when it cannot be started.
    """
    env = dict(os.environ)
    env.update(C_LOCALE)
    env.update(environ or {})
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        raise CommandError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CommandTimeout(argv, timeout, hint, _stop(proc)) from None
    return proc.returncode, _text(out), _text(err)


class Runner:
    """Runs a module's commands: one timeout and one C locale for all of them."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, environ: Mapping[str, str] | None = None):
        self.timeout = timeout
        self.environ = {**C_LOCALE, **(environ or {})}
        self.ran: list[list[str]] = []

    def run(
        self, argv: Sequence[str], hint: str | None = None, timeout: float | None = None
    ) -> tuple[int, str, str]:
        self.ran.append(list(argv))
        return run_bounded(argv, timeout or self.timeout, self.environ, hint)
