# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent_client role's other clients (Claude Code, Codex, Qwen Code, Crush); the rules live in
module_utils/client/_agents.py.

- ``agent_clients_check``: ``agent_client_clients`` (known names, once each, opencode first) and
  ``agent_client_prompt_floors`` checked.
- ``agent_clients_render``: every other client's config, env names and budget from opencode's budget;
  fails with every refused client's numbers at once, before the role writes any file.
- ``agent_client_env_text``: one client's env file (its variables and the key's line).
- ``agent_clients_summary``: what agent_client_result says of each (paths, budget; no config text).
- ``agent_client_files``: every other client's config and env file under ``agent_client_dir``, which
  the stage's shortcut watches (a config edited in place makes the stage write it again).
- ``agent_client_programs``: every other client's program (``agent_client_programs`` or its name on
  PATH), which the stage's shortcut also watches (an upgraded client is measured again).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.client._agents import (
    ENV_FILE,
    OPENCODE,
    ClientConfigError,
    check_clients,
    check_floors,
    env_text,
    render,
)
from ansible_collections.localinference.vllm.plugins.module_utils.client._check import (
    config_paths,
)
from ansible_collections.localinference.vllm.plugins.module_utils.client._floor import (
    PROGRAMS,
)


def agent_clients_check(clients: Any, prompt_floors: Any = None) -> list[str]:
    try:
        names = check_clients(clients)
        check_floors(prompt_floors, names)
    except ClientConfigError as exc:
        raise AnsibleFilterError(str(exc)) from None
    return names


def agent_clients_render(
    plan: dict[str, Any],
    clients: Any,
    model: str,
    base_url: str,
    api_key_env: str,
    reasoning_key: str,
    client_dir: str,
    prompt_floors: Any = None,
    existing: dict[str, str] | None = None,
    provider: str = "localinference",
    ca_file: str = "",
) -> list[dict[str, Any]]:
    """Every client but opencode, rendered; all refusals in one error."""
    try:
        names = check_clients(clients)
        floors = check_floors(prompt_floors, names)
    except ClientConfigError as exc:
        raise AnsibleFilterError(str(exc)) from None
    done, refused = [], []
    for name in names:
        if name == OPENCODE:
            continue
        try:
            done.append(
                render(
                    name,
                    plan=plan,
                    model=model,
                    base_url=base_url,
                    api_key_env=api_key_env,
                    reasoning_key=reasoning_key,
                    client_dir=f"{client_dir.rstrip('/')}/{name}",
                    prompt_floor=floors.get(name),
                    existing=(existing or {}).get(name),
                    provider=provider,
                    ca_file=ca_file,
                )
            )
        except ClientConfigError as exc:
            refused.append(str(exc))
    if refused:
        raise AnsibleFilterError("no client config was written: " + " | ".join(refused))
    return done


def agent_clients_summary(rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What agent_client_result says of each client: paths and budget, not the config text."""
    keep = ("client", "package", "config_path", "env_path", "key_env", "budget")
    return [{k: r[k] for k in keep} for r in rendered or []]


def agent_client_env_text(rendered: dict[str, Any], key: str | None = None) -> str:
    return env_text(rendered, key or None)


def agent_client_files(clients: Any, client_dir: Any) -> list[str]:
    try:
        paths = config_paths(None, clients, client_dir)
    except ClientConfigError as exc:
        raise AnsibleFilterError(str(exc)) from None
    return [file for path in paths.values() for file in (path, f"{path.rsplit('/', 1)[0]}/{ENV_FILE}")]


def agent_client_programs(clients: Any, programs: Any = None) -> list[str]:
    """Each other client's program: the path agent_client_programs gives, else its name (on PATH)."""
    try:
        names = check_clients(clients)
    except ClientConfigError as exc:
        raise AnsibleFilterError(str(exc)) from None
    programs = {} if programs is None else programs
    if not isinstance(programs, dict):
        raise AnsibleFilterError(f"agent_client_programs must be a dict (client: program path), got {programs!r}")
    unknown = sorted(set(programs) - set(PROGRAMS))
    if unknown:
        raise AnsibleFilterError(f"agent_client_programs: unknown client {unknown}; known: {', '.join(PROGRAMS)}")
    for client, path in programs.items():
        if not isinstance(path, str) or not path.startswith("/") or any(c in path for c in "\n\r\0"):
            raise AnsibleFilterError(f"agent_client_programs.{client} must be an absolute path, got {path!r}")
    return [programs.get(name, PROGRAMS[name]) for name in names if name != OPENCODE]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "agent_clients_check": agent_clients_check,
            "agent_clients_render": agent_clients_render,
            "agent_client_env_text": agent_client_env_text,
            "agent_clients_summary": agent_clients_summary,
            "agent_client_files": agent_client_files,
            "agent_client_programs": agent_client_programs,
        }
