# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``vllm_log_facts``: what vLLM reported in one log, read from a file, the journal or Podman.

The log (``content``, ``path``, or a unit's last ``lines`` through ``journalctl -u`` or
``podman logs``), bounded and decoded, then parsed by ``_vllm_log`` into its reports and the
observations the plan sizes the KV cache with. An empty log is refused unless ``empty_ok``;
lines that look like vLLM's but carry impossible numbers are a warning.

No AnsibleModule here: ``module`` is the caller's (``params``, ``get_bin_path``, ``warn``,
``fail_json``).
"""

from __future__ import annotations

import datetime
import math
import os
import platform
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
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


# A vLLM log worth parsing is megabytes; a larger file is read in part by unit+since instead.
MAX_LOG_BYTES = 1024**3
MAX_LINES = 10_000_000
HINT = "the journal may be huge or journald busy; pass since, lower lines, or raise timeout"


def unit_command(module: Any) -> list[str]:
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


def read_text(module: Any, runner: Runner) -> str:
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
            text = decode_log(_files.read_bytes(params["path"], MAX_LOG_BYTES), origin)
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


def _check_params(module: Any) -> None:
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


def facts(module: Any, runner: Runner) -> dict:
    """The facts of ``ansible_facts.vllm_log``; a log that cannot be read or is not text ends the module."""
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


def run(module: Any) -> None:
    """Check the options, then read and parse the log; ends the module with the facts."""
    _check_params(module)
    run_facts(module, "vllm_log", lambda runner: facts(module, runner))
