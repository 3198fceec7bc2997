# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``opencode_config``: opencode's config file on the node, merged and written, or checked.

state=present merges the provider, the model and the client budget (``_opencode.budget``,
fitted to the served context) into the user's config, keeping everything else, and writes it
atomically, outside check mode, as 0600 when new; a budget or config opencode would break on
is refused before anything is written. state=checked judges an existing config (JSONC
allowed). The merge and the judgement are ``_opencode``'s; here the file is read and written.

No AnsibleModule here: ``module`` is the caller's (``params``, ``check_mode``, ``_diff``,
``warn``, ``fail_json``, ``atomic_move``).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode import (
    OpencodeConfigError,
    budget,
    check_inputs,
    judge,
    merge,
    parse_config,
    render,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import (
    errors,
    sentence,
)

MAX_BYTES = 4 * 1024 * 1024


def _read(path: str) -> str | None:
    if not os.path.lexists(path):
        return None
    if not os.path.isfile(path):
        raise OpencodeConfigError(f"{path} is not a regular file")
    if os.path.getsize(path) > MAX_BYTES:
        raise OpencodeConfigError(
            f"{path} is larger than {MAX_BYTES} bytes: not an opencode config"
        )
    return _files.read_text(path, MAX_BYTES)


def _write(module: Any, path: str, text: str, exists: bool) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".opencode-config-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    # atomic_move keeps an existing file's mode and owner, and gives a new one
    # the umask's; the config names only {env:NAME}, but it may sit in a home
    # directory among the user's secrets, so a new file is 0600.
    module.atomic_move(tmp, path)
    if not exists:
        os.chmod(path, 0o600)


def _judge(
    module: Any, config: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    p = module.params
    return judge(
        config,
        provider=p["provider"],
        model=p["model"],
        max_model_len=p["max_model_len"],
        prompt_floor=p["prompt_floor"],
        reasoning_key=p["reasoning_key"],
        client_version=p["client_version"],
        reads=p["client_reads"],
    )


def _failure(findings: list[dict[str, Any]], prefix: str, hint: str = "") -> str:
    text = prefix + " " + "; ".join(sentence(f) for f in errors(findings))
    return text + (f". {hint}" if hint else "")


def run(module: Any) -> dict[str, Any]:
    """The module's result for its ``state``; a config opencode would break on ends the module."""
    p = module.params
    path = p["path"]
    check_inputs(p["provider"], p["model"], p["max_model_len"], p["prompt_floor"], p["api_key_env"])
    raw = _read(path)
    out: dict[str, Any] = {"changed": False, "path": path, "warnings_list": []}
    if p["state"] == "checked":
        if raw is None:
            raise OpencodeConfigError(
                f"{path} does not exist: nothing to check; write it with state=present"
            )
        findings, numbers = _judge(module, parse_config(raw, path, allow_jsonc=True))
        out.update(findings=findings, limits=numbers)
        if errors(findings):
            module.fail_json(msg=_failure(findings, f"{path} would break opencode:"), **out)
        return out
    current = parse_config(raw or "", path, allow_jsonc=False)
    plan = budget(p["max_model_len"], p["prompt_floor"], p["output_tokens"], p["reserved_tokens"])
    provider = (
        (current.get("provider") or {}).get(p["provider"])
        if isinstance(current.get("provider"), dict)
        else None
    )
    has_url = (
        isinstance(provider, dict)
        and isinstance(provider.get("options"), dict)
        and provider["options"].get("baseURL")
    )
    if p["base_url"] is None and not has_url:
        raise OpencodeConfigError(
            f"base_url is required: {path} has no baseURL for provider {p['provider']!r}"
        )
    new, notes = merge(
        current,
        provider=p["provider"],
        model=p["model"],
        plan=plan,
        base_url=p["base_url"],
        api_key_env=p["api_key_env"],
        provider_name=p["provider_name"],
        model_name=p["model_name"],
        settings=p["settings"],
    )
    findings, numbers = _judge(module, new)
    if not plan["ok"]:
        # The collection writes only a budget that meets its own rule (working
        # budget >= floor + WORK_ROOM), not one that merely avoids a hard error.
        findings = [dict(f, severity="error") if f["id"] in ("F8", "F9") else f for f in findings]
    out.update(findings=findings, limits=numbers, budget=plan, warnings_list=notes)
    if errors(findings):
        hint = ""
        if plan.get("additional_context_needed"):
            hint = (
                f"The server needs {plan['needed_context']} tokens of context for this client"
                f" ({plan['additional_context_needed']} more than {p['max_model_len']})."
            )
        module.fail_json(msg=_failure(findings, f"refusing to write {path}:", hint), **out)
    changed = raw is None or new != current
    before = raw or ""
    after = render(new) if changed else before
    out["changed"] = changed
    if changed and not module.check_mode:
        _write(module, path, after, raw is not None)
    if module._diff:
        out["diff"] = {
            "before": before,
            "after": after,
            "before_header": path,
            "after_header": path,
        }
    for note in notes:
        module.warn(note)
    return out
