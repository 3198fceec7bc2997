# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every coding agent from one measured budget: Claude Code, Codex, Qwen Code and Crush beside opencode.

opencode's config is written by ``opencode_config`` from the client budget of
:mod:`plan._client_budget` (context ``L``, input ``I = L - O``, output ``O``,
reserved ``R``). The other clients get the same numbers, each through its own
rules: where its compaction trigger sits, how much output it asks for, what it
reads to learn the context. A client whose own arithmetic cannot fit the
served context is refused with the numbers (:class:`ClientRefused`) before any
file is written. The key never enters a config: each config names an
environment variable, which one env file per client sets.

Every rule below cites where it comes from. Where a client's rule could not be
read from its docs or source, the comment says so.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.client._toml_write import (
    TomlWriteError,
    dumps,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._client_budget import (
    MIN_OUTPUT,
    WORK_ROOM,
)

OPENCODE = "opencode"
CLAUDE_CODE = "claude_code"
CODEX = "codex"
QWEN_CODE = "qwen_code"
CRUSH = "crush"
CLIENTS = (OPENCODE, CLAUDE_CODE, CODEX, QWEN_CODE, CRUSH)
# npm packages (the lab pins their versions in lab/agent-clients.txt).
PACKAGES = {
    OPENCODE: "opencode-ai",
    CLAUDE_CODE: "@anthropic-ai/claude-code",
    CODEX: "@openai/codex",
    QWEN_CODE: "@qwen-code/qwen-code",
    CRUSH: "@charmland/crush",
}
CONFIG_FILES = {
    CLAUDE_CODE: "settings.json",
    CODEX: "config.toml",
    QWEN_CODE: "settings.json",
    CRUSH: "crush.json",
}
ENV_FILE = "env"

# Claude Code: the assumed window of a model id it does not know is
# CLAUDE_CODE_MAX_CONTEXT_TOKENS (ids not starting with "claude-"), the output
# it asks for CLAUDE_CODE_MAX_OUTPUT_TOKENS (default 32000 for unknown ids), and
# it auto-compacts at window - min(max output, 20000) - 13000.
# https://code.claude.com/docs/en/env-vars and
# https://code.claude.com/docs/en/model-config#correct-the-window-for-a-gateway-or-custom-model-id
# (measured with 2.1.328: without it, "assumes a context window of 1m tokens"; with it, no such
# warning); the compaction formula as read from the 2.1.259 binary:
# https://github.com/calebevans/mulder/pull/192
CLAUDE_OUTPUT_RESERVE_CAP = 20000
CLAUDE_COMPACT_MARGIN = 13000
# What Claude Code assumes without those two variables (same sources): a window of 1m tokens
# for an id it does not know, and 32000 tokens of output.
CLAUDE_DEFAULT_WINDOW = 1000000
CLAUDE_DEFAULT_OUTPUT = 32000
# Crush summarizes when the free context falls to 20,000 tokens (windows above
# 200,000) or to 20 % of the window (smaller ones):
# https://github.com/charmbracelet/crush internal/agent/agent.go
# (largeContextWindowThreshold, largeContextWindowBuffer, smallContextWindowRatio).
CRUSH_LARGE_WINDOW = 200000
CRUSH_LARGE_BUFFER = 20000
CRUSH_SMALL_RATIO = 0.2
# crush.json's schema caps models.*.max_tokens at 200000
# (https://github.com/charmbracelet/crush schema.json, commit 02c270a4c5ed).
CRUSH_MAX_TOKENS_CAP = 200000

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_SAFE_PATH = re.compile(r"^/[^\s'\"$`\\;]+\Z")
_URL = re.compile(r"^https?://[!-~]+\Z")


class ClientConfigError(validate.InputError):
    """Bad input for a client config; the message names the variable."""


class ClientRefused(ClientConfigError):
    """The client's own arithmetic does not fit the served context; the message has the numbers."""


# --- input --------------------------------------------------------------------


def check_clients(value: Any) -> list[str]:
    """``agent_client_clients`` as a list of known, distinct client names with opencode first."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ClientConfigError(
            f"agent_client_clients must be a list of client names, got {json.dumps(value, default=str)[:120]}"
        )
    unknown = [v for v in value if v not in CLIENTS]
    if unknown:
        raise ClientConfigError(
            f"agent_client_clients: unknown client(s) {', '.join(map(repr, unknown))}; known: {', '.join(CLIENTS)}"
        )
    twice = sorted({v for v in value if value.count(v) > 1})
    if twice:
        raise ClientConfigError(f"agent_client_clients names {', '.join(twice)} more than once")
    if OPENCODE not in value:
        # opencode's real run is the measurement (prompt floor, reasoning field)
        # every other client's config is built from.
        raise ClientConfigError(
            "agent_client_clients must include opencode: its real run measures the budget the other"
            " clients' configs are built from"
        )
    return [OPENCODE] + [v for v in value if v != OPENCODE]


def check_floors(value: Any, clients: list[str]) -> dict[str, int]:
    """``agent_client_prompt_floors``: measured first-request tokens per client (none: not calibrated)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ClientConfigError(
            f"agent_client_prompt_floors must be a dict of client: tokens, got {type(value).__name__}"
        )
    floors: dict[str, int] = {}
    for client, tokens in value.items():
        if client not in clients or client == OPENCODE:
            raise ClientConfigError(
                f"agent_client_prompt_floors names {client!r}, which is not among the other clients of"
                f" agent_client_clients ({', '.join(c for c in clients if c != OPENCODE) or 'none'});"
                " opencode's floor is measured"
            )
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            raise ClientConfigError(
                f"agent_client_prompt_floors.{client} must be a positive number of tokens, got {tokens!r}"
            )
        floors[client] = tokens
    return floors


def _plan(plan: Any) -> tuple[int, int, int]:
    """``(L, O, R)`` of the opencode budget (``limits`` of agent_client_result)."""
    if not isinstance(plan, dict):
        raise ClientConfigError(f"the client budget must be a dict, got {type(plan).__name__}")
    values = []
    for key in ("context", "output", "reserved"):
        value = plan.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ClientConfigError(
                f"the client budget's {key} must be a token count, got {value!r}"
            )
        values.append(value)
    context, output, reserved = values
    if context <= 0:
        raise ClientConfigError(f"the client budget's context must be positive, got {context}")
    return context, output, reserved


# --- each client's budget -----------------------------------------------------


def budget_problems(
    context: int, out: int, compact_at: int, prompt_floor: int | None
) -> list[tuple[str, str]]:
    """``(id, reason)`` for each way a client's limits cannot work in the served context.

    The id is F8 (prompt + output overflow), F9 (compaction at or below the prompt floor) or
    ``output`` (too little output to answer). The renderer refuses on any of them; the doctor
    names the same ones for a config it reads back (:mod:`_check`).
    """
    reasons = []
    if out < MIN_OUTPUT:
        reasons.append(("output", f"output {out} is below {MIN_OUTPUT} tokens"))
    if out >= context:
        reasons.append(("F8", f"output {out} is not below the served context {context} (F8)"))
    if compact_at + out > context:
        reasons.append(
            (
                "F8",
                f"compaction point {compact_at} + output {out} exceeds the served context {context} (F8)",
            )
        )
    if prompt_floor is None:
        if compact_at <= 0:
            reasons.append(
                ("F9", f"compaction point {compact_at}: it would compact after every turn (F9)")
            )
    elif compact_at < prompt_floor + WORK_ROOM:
        reasons.append(
            (
                "F9",
                f"compaction point {compact_at} is below the prompt floor {prompt_floor} + {WORK_ROOM}"
                " tokens of room to work (F9)",
            )
        )
    return reasons


def _refusals(context: int, out: int, compact_at: int, prompt_floor: int | None) -> list[str]:
    """Why a client's limits cannot work in the served context (F8, F9); empty when they fit."""
    return [reason for _, reason in budget_problems(context, out, compact_at, prompt_floor)]


def claude_compact_at(context: int, out: int) -> int:
    """Where Claude Code compacts in a window of ``context`` asking for ``out`` tokens."""
    return context - min(out, CLAUDE_OUTPUT_RESERVE_CAP) - CLAUDE_COMPACT_MARGIN


def qwen_compact_at(context: int, share: float) -> int:
    """Where Qwen Code compacts (at the latest): ``autoCompactThreshold`` of its window."""
    return int(share * context)


def crush_reserve(context: int) -> int:
    """The free context at which Crush summarizes (the window's size decides which rule)."""
    return CRUSH_LARGE_BUFFER if context > CRUSH_LARGE_WINDOW else int(context * CRUSH_SMALL_RATIO)


def client_budget(
    client: str, plan: dict[str, Any], prompt_floor: int | None = None
) -> dict[str, Any]:
    """The client's own limits for the shared budget; :class:`ClientRefused` when they cannot fit."""
    context, output, reserved = _plan(plan)
    if client == CLAUDE_CODE:
        # Its prompt at the compaction point plus its output must fit: O - min(O, 20000) <= 13000.
        out = min(output, CLAUDE_OUTPUT_RESERVE_CAP + CLAUDE_COMPACT_MARGIN)
        compact_at = claude_compact_at(context, out)
        rule = f"compacts at context - min(output, {CLAUDE_OUTPUT_RESERVE_CAP}) - {CLAUDE_COMPACT_MARGIN}"
    elif client == CODEX:
        # Codex compacts at model_auto_compact_token_limit, which we set to opencode's B = I - R.
        # https://developers.openai.com/codex/config-reference (model_context_window,
        # model_auto_compact_token_limit)
        out = output
        compact_at = context - output - reserved
        rule = "compacts at model_auto_compact_token_limit = context - output - reserved"
    elif client == QWEN_CODE:
        # Qwen Code 0.24.4 compacts at context.autoCompactThreshold of the window (default 0.85; a
        # ceiling: small windows may compact earlier); model.chatCompression.contextPercentageThreshold
        # is removed and silently ignored. Read in the pinned package's own settings reference,
        # bundled/qc-helper/docs/configuration/settings.md (https://github.com/QwenLM/qwen-code, PR #4345).
        out = output
        share = max(0, (context - output - reserved) * 1000 // context) / 1000
        compact_at = qwen_compact_at(context, share)
        rule = f"compacts at autoCompactThreshold {share} x context (or earlier)"
    elif client == CRUSH:
        reserve = crush_reserve(context)
        out = min(output, reserve, CRUSH_MAX_TOKENS_CAP)
        compact_at = context - reserve
        rule = (
            f"summarizes when {CRUSH_LARGE_BUFFER} tokens (windows above {CRUSH_LARGE_WINDOW}) or 20% of"
            " the window are left"
        )
    else:
        raise ClientConfigError(
            f"no budget rules for client {client!r}; known: {', '.join(CLIENTS[1:])}"
        )
    result = {
        "client": client,
        "context": context,
        "output": out,
        "compact_at": compact_at,
        "rule": rule,
        "prompt_floor": prompt_floor,
        "work_room": WORK_ROOM,
        "calibrated": prompt_floor is not None,
        "notes": []
        if out == output
        else [f"output lowered from {output} to {out} by {client}'s own rule"],
    }
    if client == QWEN_CODE:
        result["share"] = share
    reasons = _refusals(context, out, compact_at, prompt_floor)
    if reasons:
        need = (prompt_floor or 0) + WORK_ROOM + context - compact_at
        more = f"; the served context must grow to {need} (+{need - context})" if need > context else ""
        raise ClientRefused(f"{client} ({rule}): {'; '.join(reasons)}{more}")
    return result


# --- each client's files ------------------------------------------------------


def _merge(base: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``ours`` laid over it: nested dicts merge, everything else is replaced."""
    merged = copy.deepcopy(base)
    for key, value in ours.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _existing(text: str | None, fmt: str, where: str) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        doc = tomllib.loads(text) if fmt == "toml" else json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ClientConfigError(
            f"{where} exists and is not valid {fmt.upper()} ({exc}); move it away or fix it, the collection"
            " only merges its own keys into a file it can read"
        ) from None
    if not isinstance(doc, dict):
        raise ClientConfigError(
            f"{where} holds a {type(doc).__name__}, not a config object; move it away"
        )
    return doc


def _claude_code(p: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], str]:
    model = p["model"]
    # The id must not start with "claude-": CLAUDE_CODE_MAX_CONTEXT_TOKENS only applies to ids
    # Claude Code does not know (https://code.claude.com/docs/en/env-vars).
    if model.lower().startswith("claude"):
        raise ClientConfigError(
            f"claude_code: the served model name {model!r} starts with 'claude': Claude Code would take its"
            " own window for it instead of the served context; serve the model under another name"
        )
    # settings.json "env" (https://code.claude.com/docs/en/settings): ANTHROPIC_BASE_URL is the
    # ingress route without /v1 (Claude Code appends /v1/messages); every model alias points at
    # the served model so no request asks for a model the server does not have.
    env = {
        "ANTHROPIC_BASE_URL": re.sub(r"/v1/*$", "", p["base_url"]),
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(p["budget"]["context"]),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(p["budget"]["output"]),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    # ANTHROPIC_AUTH_TOKEN is sent as "Authorization: Bearer", which the ingress checks.
    return {"env": env}, {"CLAUDE_CONFIG_DIR": p["dir"]}, "ANTHROPIC_AUTH_TOKEN"


def _codex(p: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], str]:
    budget, provider = p["budget"], p["provider"]
    # config.toml model provider: https://developers.openai.com/codex/config-reference
    # env_key names the key's variable; wire_api "responses" (vLLM serves /v1/responses; recent
    # Codex releases accept no other value).
    doc = {
        "model": p["model"],
        "model_provider": provider,
        "model_context_window": budget["context"],
        # No output limit: Codex 0.169.0 ignores model_max_output_tokens ("unrecognized
        # configuration setting", measured); the compaction limit keeps output + reserve free.
        "model_auto_compact_token_limit": budget["compact_at"],
        "model_providers": {
            provider: {
                "name": provider,
                "base_url": p["base_url"],
                "env_key": p["api_key_env"],
                "wire_api": "responses",
                "requires_openai_auth": False,
            }
        },
        # Codex 0.169.0 snapshots the shell's exported environment, the key's variable
        # included, into CODEX_HOME/shell_snapshots/ (mode 0644) while it runs, and leaves
        # it there when it is killed (measured in the lab); the agent's commands do not
        # need the endpoint's key either.
        "features": {"shell_snapshot": False},
        "shell_environment_policy": {"exclude": [p["api_key_env"]]},
    }
    return doc, {"CODEX_HOME": p["dir"]}, p["api_key_env"]


def _qwen_code(p: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], str]:
    budget, model = p["budget"], p["model"]
    # settings.json: modelProviders.openai[] with envKey (the key stays in the environment),
    # generationConfig.contextWindowSize and samplingParams.max_tokens (a fixed limit, no escalation),
    # security.auth.selectedType: https://qwenlm.github.io/qwen-code-docs/en/users/configuration/settings
    # and the same page bundled in 0.24.4.
    doc = {
        "modelProviders": {
            "openai": [
                {
                    "id": model,
                    "name": model,
                    "baseUrl": p["base_url"],
                    "envKey": p["api_key_env"],
                    "generationConfig": {
                        "contextWindowSize": budget["context"],
                        "samplingParams": {"max_tokens": budget["output"]},
                    },
                }
            ]
        },
        "security": {"auth": {"selectedType": "openai"}},
        "model": {"name": model},
        "context": {"autoCompactThreshold": budget["share"]},
        "privacy": {"usageStatisticsEnabled": False},
    }
    # QWEN_CODE_SYSTEM_SETTINGS_PATH points Qwen Code at this file (same docs page).
    return doc, {"QWEN_CODE_SYSTEM_SETTINGS_PATH": f"{p['dir']}/settings.json"}, p["api_key_env"]


def _crush(p: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], str]:
    budget, model, provider = p["budget"], p["model"], p["provider"]
    # crush.json (schema https://charm.land/crush.json; the repository's schema.json): type
    # "openai-compat" for a non-OpenAI server, api_key "$NAME" read from the environment, every
    # field the schema requires of a model.
    doc = {
        "$schema": "https://charm.land/crush.json",
        "providers": {
            provider: {
                "name": provider,
                "type": "openai-compat",
                "base_url": p["base_url"],
                "api_key": "$" + p["api_key_env"],
                "discover_models": False,
                "models": [
                    {
                        "id": model,
                        "name": model,
                        "cost_per_1m_in": 0,
                        "cost_per_1m_out": 0,
                        "cost_per_1m_in_cached": 0,
                        "cost_per_1m_out_cached": 0,
                        "context_window": budget["context"],
                        "default_max_tokens": budget["output"],
                        "can_reason": p["reasoning_key"] != "none",
                        "supports_attachments": False,
                    }
                ],
            }
        },
        "models": {
            "large": {"model": model, "provider": provider, "max_tokens": budget["output"]},
            "small": {"model": model, "provider": provider, "max_tokens": budget["output"]},
        },
        "options": {"disable_provider_auto_update": True, "disable_metrics": True},
    }
    # CRUSH_GLOBAL_CONFIG is the directory that holds crush.json.
    return doc, {"CRUSH_GLOBAL_CONFIG": p["dir"]}, p["api_key_env"]


_RENDER = {CLAUDE_CODE: _claude_code, CODEX: _codex, QWEN_CODE: _qwen_code, CRUSH: _crush}
# The ingress's CA (TLS beyond the head's loopback): Node clients add it to their store
# through NODE_EXTRA_CA_CERTS; Codex (Rust) and Crush (Go) read SSL_CERT_FILE, which stands
# for the system store in that process (measured, Codex 0.169.0 against the lab's Caddy:
# without it every request fails "Connection failed: error sending request").
_NODE = (CLAUDE_CODE, QWEN_CODE)


def render(
    client: str,
    *,
    plan: dict[str, Any],
    model: str,
    base_url: str,
    api_key_env: str,
    reasoning_key: str,
    client_dir: str,
    prompt_floor: int | None = None,
    existing: str | None = None,
    provider: str = "localinference",
    ca_file: str = "",
) -> dict[str, Any]:
    """The client's config text (merged into ``existing``), its env file's names, and its budget."""
    if client not in _RENDER:
        raise ClientConfigError(
            f"agent_client_clients: no config rules for {client!r} here; known: {', '.join(_RENDER)}"
        )
    if not model:
        raise ClientConfigError("agent_client_model: the served model name is empty")
    if not _URL.match(base_url or ""):
        raise ClientConfigError(f"agent_client_base_url must be an http(s) URL, got {base_url!r}")
    if not _ENV_NAME.match(api_key_env or ""):
        raise ClientConfigError(
            f"agent_client_api_key_env must be an environment variable name, got {api_key_env!r}"
        )
    if not _SAFE_PATH.match(client_dir or ""):
        raise ClientConfigError(
            "agent_client_dir must give an absolute path without white space, quotes, $ or ; (it goes into a"
            f" shell env file), got {client_dir!r}"
        )
    if ca_file and not _SAFE_PATH.match(ca_file):
        raise ClientConfigError(
            f"agent_client_ca_file must be an absolute path without white space, got {ca_file!r}"
        )
    if not provider or not _ENV_NAME.match(provider.replace("-", "_")):
        raise ClientConfigError(f"agent_client_provider must be a plain name, got {provider!r}")
    budget = client_budget(client, plan, prompt_floor)
    fmt = "toml" if client == CODEX else "json"
    path = f"{client_dir}/{CONFIG_FILES[client]}"
    ours, env, key_env = _RENDER[client](
        {
            "budget": budget,
            "model": model,
            "base_url": base_url.rstrip("/"),
            "api_key_env": api_key_env,
            "provider": provider,
            "reasoning_key": reasoning_key,
            "dir": client_dir,
        }
    )
    before = _existing(existing, fmt, path)
    doc = _merge(before, ours)
    theirs = (before.get("shell_environment_policy") or {}).get("exclude") if client == CODEX else None
    if isinstance(theirs, list):  # the user's own exclusions kept beside the key's
        excluded = ours["shell_environment_policy"]["exclude"]
        doc["shell_environment_policy"]["exclude"] = [*theirs, *(n for n in excluded if n not in theirs)]
    try:
        text = dumps(doc) if fmt == "toml" else json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    except TomlWriteError as exc:
        raise ClientConfigError(f"{path}: {exc}") from None
    if ca_file:
        env = {**env, ("NODE_EXTRA_CA_CERTS" if client in _NODE else "SSL_CERT_FILE"): ca_file}
    return {
        "client": client,
        "package": PACKAGES[client],
        "dir": client_dir,
        "config_path": path,
        "config": text,
        "env_path": f"{client_dir}/{ENV_FILE}",
        "env": env,
        "key_env": key_env,
        "budget": budget,
    }


def env_text(rendered: dict[str, Any], key: str | None) -> str:
    """The env file: the client's variables, then the key's line (none without a key)."""
    lines = [f"{name}={value}" for name, value in rendered["env"].items()]
    if key:
        lines.append(f"{rendered['key_env']}={key}")
    return "\n".join(lines) + "\n"
