# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""opencode's config file: merge the collection's provider into it, and judge it.

The client budget arithmetic is :mod:`plan._client_budget` (opencode 1.18.33's
rules); this file only reads and writes opencode's JSON and turns a config plus
what the server measured (its context, the prompt floor, the reasoning field it
streams) into findings of the failure catalog:

- F8: ``limit.context`` above the server's context, input plus output above it,
  or the prompt floor plus ``limit.output`` above it.
- F9: opencode's compaction trigger (working budget) below the prompt floor, or
  less than ``WORK_ROOM`` tokens above it.
- F7: the server streams reasoning in a delta field the configured client does
  not read.

``compaction`` is a top-level key of opencode's config: ``compaction.reserved``
applies to every model of every provider that has ``limit.input``.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.plan._client_budget import (
    WORK_ROOM,
    ClientInputError,
    check_client_limits,
    plan_client,
    working_budget,
)

PROVIDER_NPM = "@ai-sdk/openai-compatible"
SCHEMA_URL = "https://opencode.ai/config.json"
REASONING_KEYS = ("reasoning", "reasoning_content")
SERVER_REASONING = (*REASONING_KEYS, "none")
DEFAULT_CLIENT_VERSION = "1.18.33"
CONFIG_CHECK = "client-config"

# Which delta fields opencode's bundled @ai-sdk/openai-compatible reads for
# reasoning, in order. 1.18.33: ``delta.reasoning_content ?? delta.reasoning``
# (read in the 1.18.33 binary's doStream). The two-Spark field report's 1.18.15 showed vLLM's
# ``reasoning`` chunks as nothing ("thinking" forever): reasoning_content only.
# Versions in between were not measured.
_READS_MEASURED = (
    ((1, 18, 33), ("reasoning_content", "reasoning")),
    ((1, 18, 15), ("reasoning_content",)),
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$")


class OpencodeConfigError(validate.InputError):
    """A config or an input that cannot be used; the message names it and the fix."""


# --- reading -----------------------------------------------------------------


def strip_jsonc(text: str) -> tuple[str, bool]:
    """JSON text of a JSONC document (comments and trailing commas removed), and whether it had any."""
    out: list[str] = []
    i, n, found = 0, len(text), False
    while i < n:
        char = text[i]
        if char == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            found = True
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise OpencodeConfigError("unterminated /* comment")
            i = end + 2
            found = True
        elif char == ",":
            j = i + 1
            while j < n and text[j] in " \t\r\n":
                j += 1
            if j < n and text[j] in "}]":
                found = True
            else:
                out.append(char)
            i += 1
        else:
            out.append(char)
            i += 1
    return "".join(out), found


def parse_config(text: str, where: str, allow_jsonc: bool) -> dict[str, Any]:
    """The config as a dict. JSONC (comments, trailing commas) only with ``allow_jsonc``.

    The module rewrites the file with O(state=present), which would drop a
    user's comments, so it refuses JSONC there rather than lose them.
    """
    if not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        try:
            stripped, had_jsonc = strip_jsonc(text)
            doc = json.loads(stripped) if had_jsonc else None
        except (ValueError, RecursionError):
            had_jsonc, doc = False, None
        if doc is None:
            raise OpencodeConfigError(
                f"{where} is not valid JSON ({exc}); fix or move the file"
            ) from None
        if not allow_jsonc:
            raise OpencodeConfigError(
                f"{where} is JSONC (comments or trailing commas): writing it would drop them."
                " Remove the comments, or point path at a separate opencode.json (opencode merges"
                " the global and the project config); state=checked reads JSONC"
            ) from None
    if not isinstance(doc, dict):
        raise OpencodeConfigError(
            f"{where} holds a JSON {type(doc).__name__}, not an opencode config object"
        )
    return doc


def render(config: dict[str, Any]) -> str:
    return json.dumps(config, indent=2, ensure_ascii=False) + "\n"


# --- the client --------------------------------------------------------------


def parse_version(version: str) -> tuple[int, int, int]:
    match = _VERSION.match(str(version).strip())
    if not match:
        raise OpencodeConfigError(f"client_version must look like 1.18.33, got {version!r}")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def client_reads(version: str) -> tuple[tuple[str, ...], str]:
    """Reasoning delta fields opencode ``version`` reads, and where that knowledge comes from."""
    wanted = parse_version(version)
    newest, newest_reads = _READS_MEASURED[0]
    if wanted >= newest:
        return (
            newest_reads,
            f"read in opencode {'.'.join(map(str, newest))}'s openai-compatible provider",
        )
    oldest, oldest_reads = _READS_MEASURED[-1]
    if wanted <= oldest:
        return oldest_reads, "the two-Spark field report (opencode 1.18.15 showed vLLM's reasoning field as nothing)"
    return oldest_reads, (
        f"not measured for {version}; assuming the older behaviour (reasoning_content only);"
        " upgrade to 1.18.33 or pass client_reads"
    )


# --- building ----------------------------------------------------------------


def check_inputs(
    provider: str, model: str, max_model_len: int, prompt_floor: int, api_key_env: str | None
) -> None:
    if not provider or "/" in provider:
        raise OpencodeConfigError(
            f"provider must be a non-empty name without '/', got {provider!r} (opencode's -m is provider/model)"
        )
    if not model:
        raise OpencodeConfigError("model must be the served model name, got an empty string")
    if max_model_len <= 0:
        raise OpencodeConfigError(f"max_model_len must be positive, got {max_model_len}")
    if prompt_floor < 0:
        raise OpencodeConfigError(f"prompt_floor must not be negative, got {prompt_floor}")
    if api_key_env is not None and not _ENV_NAME.match(api_key_env):
        raise OpencodeConfigError(
            f"api_key_env must be an environment variable name like LOCALINFERENCE_API_KEY, got {api_key_env!r}"
        )


def budget(
    max_model_len: int, prompt_floor: int, output: int | None = None, reserved: int | None = None
) -> dict[str, Any]:
    """The client budget of :mod:`plan._client_budget` for this server context."""
    try:
        return plan_client(max_model_len, prompt_floor, output, reserved)
    except ClientInputError as exc:
        raise OpencodeConfigError(str(exc)) from None


def merge(
    config: dict[str, Any],
    *,
    provider: str,
    model: str,
    plan: dict[str, Any],
    base_url: str | None = None,
    api_key_env: str | None = None,
    provider_name: str | None = None,
    model_name: str | None = None,
    settings: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """A copy of ``config`` with this provider and model set; the user's other keys are kept.

    Only the keys the collection manages change: the provider's ``npm``,
    ``options.baseURL`` and ``options.apiKey``, the model's ``limit.*`` and the
    top-level ``compaction.reserved`` (plus ``settings``). Returns warnings.
    """
    new = copy.deepcopy(config)
    warnings: list[str] = []
    if not new:
        new["$schema"] = SCHEMA_URL
    for key, value in (settings or {}).items():
        if key in ("provider", "compaction"):
            raise OpencodeConfigError(f"settings must not set {key!r}: the module manages it")
        new[key] = value
    providers = _child(new, "provider", "the config")
    entry = _child(providers, provider, "provider")
    entry["npm"] = PROVIDER_NPM
    entry.setdefault("name", provider_name or provider)
    options = _child(entry, "options", f"provider.{provider}")
    if base_url is not None:
        options["baseURL"] = base_url
    if api_key_env is not None:
        options["apiKey"] = "{env:" + api_key_env + "}"
    models = _child(entry, "models", f"provider.{provider}")
    model_entry = _child(models, model, f"provider.{provider}.models")
    model_entry.setdefault("name", model_name or model)
    limit = _child(model_entry, "limit", f"provider.{provider}.models.{model}")
    limit.update({"context": plan["context"], "input": plan["input"], "output": plan["output"]})
    compaction = _child(new, "compaction", "the config")
    old_reserved = compaction.get("reserved")
    if old_reserved is not None and old_reserved != plan["reserved"]:
        warnings.append(
            f"compaction.reserved was {old_reserved}, now {plan['reserved']}: it is global in"
            " opencode and also applies to the other providers' models that set limit.input"
        )
    compaction["reserved"] = plan["reserved"]
    return new, warnings


def _child(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise OpencodeConfigError(
            f"{where} has {key!r} as a {type(value).__name__}, not an object; fix the file"
        )
    return value


# --- judging -----------------------------------------------------------------


def model_limits(config: dict[str, Any], provider: str, model: str) -> dict[str, Any]:
    """``{context, input, output, reserved, auto, npm}`` of the model as opencode would read them."""
    providers = config.get("provider")
    entry = providers.get(provider) if isinstance(providers, dict) else None
    if not isinstance(entry, dict):
        raise OpencodeConfigError(
            f"the config has no provider {provider!r}; write it with state=present"
        )
    models = entry.get("models")
    model_entry = models.get(model) if isinstance(models, dict) else None
    if not isinstance(model_entry, dict):
        raise OpencodeConfigError(
            f"provider {provider!r} has no model {model!r}; write it with state=present"
        )
    limit = model_entry.get("limit")
    limit = limit if isinstance(limit, dict) else {}
    compaction = config.get("compaction") if isinstance(config.get("compaction"), dict) else {}
    values = {
        "context": limit.get("context"),
        "input": limit.get("input"),
        "output": limit.get("output"),
        "reserved": compaction.get("reserved"),
    }
    for key, value in values.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise OpencodeConfigError(
                f"provider.{provider}.models.{model} {key} is {value!r}, not a token count"
            )
    return {
        **values,
        "auto": compaction.get("auto", True),
        "npm": entry.get("npm"),
        "api_key": (entry.get("options") or {}).get("apiKey")
        if isinstance(entry.get("options"), dict)
        else None,
    }


def judge(
    config: dict[str, Any],
    *,
    provider: str,
    model: str,
    max_model_len: int,
    prompt_floor: int,
    reasoning_key: str,
    client_version: str = DEFAULT_CLIENT_VERSION,
    reads: list[str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Findings for the model in ``config`` against the measured server, and the numbers used."""
    if reasoning_key not in SERVER_REASONING:
        raise OpencodeConfigError(
            f"reasoning_key must be one of {', '.join(SERVER_REASONING)}, got {reasoning_key!r}"
        )
    limits = model_limits(config, provider, model)
    found: list[dict[str, Any]] = []
    where = f"provider.{provider}.models.{model}"
    if limits["npm"] != PROVIDER_NPM:
        found.append(
            finding(
                CONFIG_CHECK,
                "error",
                f"provider.{provider}.npm is {limits['npm']!r}: the limits and reasoning fields are"
                f" judged for {PROVIDER_NPM} only",
                f"set npm to {PROVIDER_NPM} (state=present does)",
            )
        )
    api_key = limits["api_key"]
    if isinstance(api_key, str) and api_key and not api_key.startswith("{env:"):
        found.append(
            finding(
                CONFIG_CHECK,
                "error",
                f"provider.{provider}.options.apiKey holds the key itself",
                'name an environment variable instead: "{env:NAME}" (api_key_env)',
            )
        )
    if limits["context"] is None or limits["output"] is None:
        found.append(
            finding(
                "F8",
                "error",
                f"{where}.limit lacks context or output: opencode cannot know the server's"
                f" context {max_model_len} and sends requests it rejects",
                "write the limits with state=present",
            )
        )
        numbers = {"server_context": max_model_len, "prompt_floor": prompt_floor, **limits}
        return found + _reasoning(reasoning_key, client_version, reads), numbers
    for item in check_client_limits(limits, max_model_len, prompt_floor):
        found.append(finding(item["id"], item["severity"], f"{where}: {item['message']}"))
    if limits["auto"] is False:
        found.append(
            finding(
                "F9",
                "warning",
                "compaction.auto is false: opencode never compacts, so a long session ends in"
                f" HTTP 400 once it exceeds the server's context {max_model_len}",
                "remove compaction.auto or set it to true",
            )
        )
    found += _reasoning(reasoning_key, client_version, reads)
    numbers = {
        "server_context": max_model_len,
        "prompt_floor": prompt_floor,
        "context": limits["context"],
        "input": limits["input"],
        "output": limits["output"],
        "reserved": limits["reserved"],
        "working_budget": working_budget(
            limits["context"], limits["output"], limits["input"], limits["reserved"]
        ),
        "work_room": WORK_ROOM,
    }
    return found, numbers


def _reasoning(
    server_key: str, client_version: str, reads: list[str] | None
) -> list[dict[str, Any]]:
    if server_key == "none":
        return []
    if reads:
        fields, source = tuple(reads), "client_reads"
    else:
        fields, source = client_reads(client_version)
    if server_key in fields:
        return []
    return [
        finding(
            "F7",
            "error",
            f"the server streams reasoning in delta.{server_key}, but opencode {client_version}"
            f" reads {' then '.join('delta.' + f for f in fields)} ({source}): the reasoning is"
            " invisible and the client looks stuck thinking",
            "use opencode 1.18.33 or later (it reads delta.reasoning_content then delta.reasoning),"
            " or declare the model non-reasoning in the client",
        )
    ]
