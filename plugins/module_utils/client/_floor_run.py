# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``agent_client_floor``: each agent client's prompt floor, measured with the client itself.

The clients' programs are found (``programs`` or ``PATH``) and their versions read and judged
against the range the collection's rules cover (refused unless ``allow_unknown_versions``);
then each installed client of ``measure`` is run once against a recorder on the loopback and
its first request is sent to the server, whose count of the prompt is the floor
(``_floor.measure``). A client that is not installed is skipped, with why.

No AnsibleModule here: ``module`` is the caller's (``params``, ``fail_json``).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.client._floor import (
    PROGRAMS,
    FloorError,
    measure,
    read_version,
    version_problem,
)


def program_of(client: str, programs: dict[str, Any]) -> tuple[str | None, str]:
    """The client's program path, or None and why not."""
    given = programs.get(client)
    if given is None:
        found = shutil.which(PROGRAMS[client])
        return found, "" if found else f"{PROGRAMS[client]} is not on PATH (agent_client_programs.{client} names it)"
    if not isinstance(given, str) or not os.path.isabs(given) or "\n" in given:
        raise FloorError(f"agent_client_programs.{client} must be an absolute path, got {given!r}")
    if not os.access(given, os.X_OK) or os.path.isdir(given):
        raise FloorError(f"agent_client_programs.{client}: {given} is not an executable file")
    return given, ""


def installed(clients: list[str], programs: dict[str, Any], timeout: float, allow: bool) -> dict[str, Any]:
    """Each client's program and version, or why it is skipped; refuses versions outside the rules."""
    found, versions, skipped, problems = {}, {}, [], []
    for client in clients:
        program, why = program_of(client, programs)
        if program is None:
            skipped.append({"client": client, "why": why})
            continue
        found[client] = program
        versions[client] = read_version(client, program, min(timeout, 60))
        problem = version_problem(client, versions[client])
        if problem:
            problems.append(problem)
    if problems and not allow:
        raise FloorError("; ".join(problems))
    return {"programs": found, "versions": versions, "skipped": skipped, "warnings_versions": problems}


def run(module: Any) -> dict[str, Any]:
    """The prompt floor of each client to measure, with every version; a refusal ends the module."""
    p = module.params
    wanted = p["clients"] if p["measure"] is None else p["measure"]
    unknown = [c for c in p["clients"] if c not in PROGRAMS]
    if unknown:
        module.fail_json(msg=f"clients: no measurement for {unknown}; known: {', '.join(PROGRAMS)}")
    if not set(wanted) <= set(p["clients"]):
        module.fail_json(msg=f"measure: {sorted(set(wanted) - set(p['clients']))} are not among clients")
    if not 0 < p["timeout"] <= 3600:
        module.fail_json(msg=f"timeout must be 1-3600 seconds, got {p['timeout']}")
    try:
        found = installed(p["clients"], p["programs"], p["timeout"], p["allow_unknown_versions"])
    except FloorError as exc:
        module.fail_json(msg=str(exc))
    result = {"changed": False, "floors": {}, "measurements": [], **found}
    del result["programs"]
    for client in [c for c in wanted if c in found["programs"]]:
        try:
            done = measure(
                client, found["programs"][client], plan=p["plan"], model=p["model"], base_url=p["base_url"],
                api_key_env=p["api_key_env"], reasoning_key=p["reasoning_key"], key=p["api_key"],
                ca_file=p["ca_file"], timeout=p["timeout"],
            )  # fmt: skip
        except FloorError as exc:
            module.fail_json(
                msg=f"{client}'s prompt floor: {exc}. Fix it, or set agent_client_prompt_floors.{client} (tokens)"
                " to skip the measurement.",
                **result,
            )  # fmt: skip
        result["floors"][client] = done["prompt_floor"]
        result["measurements"].append({**done, "version": found["versions"][client]})
    return result
