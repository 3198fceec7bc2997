# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the watchdog role (plugins/module_utils/watchdog/_config.py).

- ``watchdog_options``: the role's options alone, checked before anything is read from a node.
- ``watchdog_config``: the head's ``watchdog.json`` from the role's options, every node's saved
  fabric result, the head's saved ingress result and its ``serving.json`` (the served recipe's
  execute-model timeout; text as slurped, or None before a rollout); a bad option fails naming
  the variable.
- ``watchdog_node_config``: one node's ``watchdog-node.json``.
"""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._config import (
    ConfigError,
    build,
    check_options,
    node_config,
)


def watchdog_options(opts: dict[str, Any]) -> dict[str, Any]:
    try:
        check_options(opts)
    except (ConfigError, ValidationError, KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"watchdog: {exc}") from None
    return opts


def watchdog_config(opts: dict[str, Any], nodes: list[dict[str, Any]], ingress: dict[str, Any],
                    serving: Any = None) -> dict[str, Any]:
    if isinstance(serving, (str, bytes)):
        try:
            serving = json.loads(serving)
        except ValueError as exc:
            raise AnsibleFilterError(
                f"watchdog: {opts.get('serving_path', 'serving.json')} is not JSON ({exc}): "
                "run the rollout again (--tags rollout)") from None
    try:
        return build(opts, nodes, ingress, serving)
    except (ConfigError, ValidationError, KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"watchdog: {exc}") from None


def watchdog_node_config(fabric: dict[str, Any] | None, name: str, opts: dict[str, Any]) -> dict[str, Any]:
    try:
        return node_config(name, fabric, opts)
    except (ConfigError, ValidationError, KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"watchdog: {exc}") from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"watchdog_options": watchdog_options, "watchdog_config": watchdog_config,
                "watchdog_node_config": watchdog_node_config}
