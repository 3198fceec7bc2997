# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The configs ``_agents.render`` wrote, read back and judged like opencode's (the doctor's F7, F8, F9).

Each of Claude Code's, Codex's, Qwen Code's and Crush's configs is parsed and schema-checked (the
keys the renderer writes; a token count where one is expected). From it come the window the client
assumes (``context``), the output it asks for and where it compacts, by the client's own rule in
:mod:`_agents` (``claude_compact_at``, ``qwen_compact_at``, ``crush_reserve``: the arithmetic is
not written twice). :func:`_agents.budget_problems` then says what the renderer would refuse:
prompt + output past the served context (F8), compaction below the client's prompt floor (F9). A
window above the served length is F8 too.

F7 (the client does not read the field the server streams reasoning in) is judged only where the
client's format has a setting for it: Crush's ``can_reason`` on the model. Claude Code (Anthropic
Messages: thinking blocks), Codex (Responses API: reasoning items) and Qwen Code have no reasoning
setting in the configs as the renderer writes them (none in the sources cited in ``_agents.py``),
so no F7 is named for them.

Pure functions; the doctor (``doctor/_context.py``) hands them the file records ``doctor_facts``
read on the controller with the bounded reader. Anything malformed is a ``client-config`` warning,
never an exception.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.client._agents import (
    CLAUDE_CODE,
    CLAUDE_DEFAULT_OUTPUT,
    CLAUDE_DEFAULT_WINDOW,
    CLIENTS,
    CODEX,
    CONFIG_FILES,
    CRUSH,
    OPENCODE,
    QWEN_CODE,
    ClientConfigError,
    _existing,
    budget_problems,
    claude_compact_at,
    crush_reserve,
    qwen_compact_at,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding

# The measured reasoning_key that means the server streams no reasoning.
NO_REASONING = "none"


def _tokens(value: Any, where: str, *, text: bool = False) -> int:
    """A positive whole number of tokens (``text``: also its decimal string, as in an env map)."""
    if text and isinstance(value, str) and value.strip().isdigit():
        value = validate.counter(where, value, error=ClientConfigError)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ClientConfigError(f"{where} must be a positive number of tokens, got {value!r}")
    return value


def _dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ClientConfigError(f"{where} must be a table/object, got {type(value).__name__}")
    return value


def _claude_code(doc: dict[str, Any], budget: dict[str, Any]) -> dict[str, Any]:
    env = _dict(doc.get("env"), "env")
    # Without the variables Claude Code assumes its own window and output (_agents.py).
    context = (
        _tokens(env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"], "env.CLAUDE_CODE_MAX_CONTEXT_TOKENS", text=True)
        if "CLAUDE_CODE_MAX_CONTEXT_TOKENS" in env
        else CLAUDE_DEFAULT_WINDOW
    )
    out = (
        _tokens(env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"], "env.CLAUDE_CODE_MAX_OUTPUT_TOKENS", text=True)
        if "CLAUDE_CODE_MAX_OUTPUT_TOKENS" in env
        else CLAUDE_DEFAULT_OUTPUT
    )
    return {
        "context": context,
        "context_key": "env.CLAUDE_CODE_MAX_CONTEXT_TOKENS",
        "output": out,
        "output_key": "env.CLAUDE_CODE_MAX_OUTPUT_TOKENS",
        "compact_at": claude_compact_at(context, out),
    }


def _codex(doc: dict[str, Any], budget: dict[str, Any]) -> dict[str, Any]:
    # Codex has no output limit in its config (_agents._codex): the budget's output is what the
    # compaction limit keeps free.
    return {
        "context": _tokens(doc.get("model_context_window"), "model_context_window"),
        "context_key": "model_context_window",
        "output": _tokens(budget.get("output"), "the saved budget's output"),
        "output_key": "the budget's output (Codex sets none)",
        "compact_at": _tokens(
            doc.get("model_auto_compact_token_limit"), "model_auto_compact_token_limit"
        ),
    }


def _named(entries: Any, model: str, where: str) -> dict[str, Any]:
    """The entry of ``entries`` (a list of objects) whose ``id`` is ``model``."""
    if not isinstance(entries, list):
        raise ClientConfigError(f"{where} must be a list, got {type(entries).__name__}")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == model:
            return entry
    raise ClientConfigError(f"{where} has no model with id {model!r}")


def _qwen_code(doc: dict[str, Any], budget: dict[str, Any]) -> dict[str, Any]:
    model = _dict(doc.get("model"), "model").get("name")
    if not isinstance(model, str) or not model:
        raise ClientConfigError(f"model.name must name the served model, got {model!r}")
    providers = _dict(doc.get("modelProviders"), "modelProviders")
    entry = _named(providers.get("openai"), model, "modelProviders.openai")
    generation = _dict(entry.get("generationConfig"), "modelProviders.openai[].generationConfig")
    sampling = _dict(generation.get("samplingParams"), "generationConfig.samplingParams")
    share = _dict(doc.get("context"), "context").get("autoCompactThreshold")
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise ClientConfigError(
            f"context.autoCompactThreshold must be a share of the window above 0 and at most 1, got {share!r}"
        )
    context = _tokens(generation.get("contextWindowSize"), "generationConfig.contextWindowSize")
    return {
        "context": context,
        "context_key": "generationConfig.contextWindowSize",
        "output": _tokens(sampling.get("max_tokens"), "generationConfig.samplingParams.max_tokens"),
        "output_key": "generationConfig.samplingParams.max_tokens",
        "compact_at": qwen_compact_at(context, share),
    }


def _crush(doc: dict[str, Any], budget: dict[str, Any]) -> dict[str, Any]:
    chosen = _dict(doc.get("models"), "models")
    large = _dict(chosen.get("large"), "models.large")
    provider, model = large.get("provider"), large.get("model")
    providers = _dict(doc.get("providers"), "providers")
    if not isinstance(provider, str) or provider not in providers:
        raise ClientConfigError(f"models.large.provider {provider!r} is not among providers")
    entry = _named(
        _dict(providers[provider], f"providers.{provider}").get("models"),
        model,
        f"providers.{provider}.models",
    )
    context = _tokens(entry.get("context_window"), "models[].context_window")
    outputs = [_tokens(entry.get("default_max_tokens"), "models[].default_max_tokens")]
    # The chosen models' max_tokens win over the model's default (the renderer writes both).
    for size in ("large", "small"):
        pick = chosen.get(size)
        if (
            isinstance(pick, dict)
            and (pick.get("provider"), pick.get("model")) == (provider, model)
            and pick.get("max_tokens") is not None
        ):
            outputs.append(_tokens(pick["max_tokens"], f"models.{size}.max_tokens"))
    return {
        "context": context,
        "context_key": "models[].context_window",
        "output": max(outputs),
        "output_key": "models.large/small.max_tokens (models[].default_max_tokens)",
        "compact_at": context - crush_reserve(context),
        "can_reason": entry.get("can_reason"),
    }


_READ = {CLAUDE_CODE: _claude_code, CODEX: _codex, QWEN_CODE: _qwen_code, CRUSH: _crush}


def read_limits(client: str, text: str, path: str, budget: dict[str, Any]) -> dict[str, Any]:
    """``{context, output, compact_at, ...}`` of a client's config text; ClientConfigError when not ours."""
    if client not in _READ:
        raise ClientConfigError(f"no config rules for client {client!r}; known: {', '.join(_READ)}")
    doc = _existing(text, "toml" if client == CODEX else "json", path)
    try:
        return _READ[client](doc, budget)
    except ClientConfigError as exc:
        raise ClientConfigError(f"{path}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ClientConfigError(f"{path}: not the shape the collection writes ({exc})") from None


def _fix(client: str, path: str) -> str:
    return (
        f"rewrite {client}'s {path} from the served context: run the client stage (--tags client;"
        " the client is in agent_client_clients)"
    )


def judge_config(
    client: str,
    text: str,
    path: str,
    *,
    served: int,
    budget: dict[str, Any],
    reasoning_key: str,
) -> list[dict[str, Any]]:
    """F7, F8 and F9 for one client's config against the served context; raises ClientConfigError."""
    limits = read_limits(client, text, path, budget)
    floor = budget.get("prompt_floor")
    floor = floor if isinstance(floor, int) and not isinstance(floor, bool) and floor > 0 else None
    context, out, compact_at = limits["context"], limits["output"], limits["compact_at"]
    evidence = (
        f"{client} {path}: context {context}, output {out}, compacts at {compact_at}, served"
        f" {served}, prompt floor {floor if floor is not None else 'not measured'}"
    )
    found = []
    if context > served:
        found.append(
            ("F8", "error", f"{client}: {limits['context_key']} {context} in {path} is above the served"
             f" max_model_len {served}: long prompts get HTTP 400; it must be {served}")
        )
    for fid, reason in budget_problems(served, out, compact_at, floor):
        found.append(
            (fid if fid != "output" else "client-config", "error" if fid != "output" else "warning",
             f"{client}: {reason} ({limits['context_key']} {context}, {limits['output_key']} {out})")
        )
    can_reason = limits.get("can_reason", True)
    if reasoning_key != NO_REASONING and can_reason is not True:
        found.append(
            ("F7", "error", f"{client}: can_reason is {str(can_reason).lower()} for the served model in"
             f" {path}, but the server streams reasoning (delta.{reasoning_key}): the client drops it")
        )
    return [
        finding(fid, severity, message, _fix(client, path), evidence=evidence, client=client)
        for fid, severity, message in found
    ]


def _warning(client: str, message: str, path: str) -> dict[str, Any]:
    return finding(
        "client-config", "warning", f"{client}: {message}", _fix(client, path),
        evidence=f"{client} {path}", client=client,
    )


def _one(
    client: str, record: Any, budget: Any, served: int, reasoning_key: str
) -> list[dict[str, Any]]:
    """The findings of one client's file record (``doctor_facts``: path, found, text, error)."""
    record = record if isinstance(record, dict) else {}
    path = str(record.get("path") or f"<agent_client_dir>/{client}/{CONFIG_FILES[client]}")
    if not isinstance(budget, dict):
        return [_warning(client, "the head's saved client result (client.json) has no budget for it:"
                         " the client stage did not write this config", path)]
    if record.get("error"):
        return [_warning(client, f"its config cannot be read: {record['error']}", path)]
    if not record.get("found") or not isinstance(record.get("text"), str):
        return [_warning(client, f"its config {path} is missing (the client stage writes it)", path)]
    try:
        return judge_config(
            client, record["text"], path, served=served, budget=budget, reasoning_key=reasoning_key
        )
    except ClientConfigError as exc:
        return [_warning(client, f"its config is not the one the collection writes: {exc}", path)]


def judge_clients(
    records: Any, saved_clients: Any, *, served: int, reasoning_key: str
) -> list[dict[str, Any]]:
    """Every other client's config record judged; ``saved_clients`` is client.json's ``clients``."""
    if not isinstance(records, dict):
        return []
    budgets = {
        entry.get("client"): entry.get("budget")
        for entry in (saved_clients if isinstance(saved_clients, list) else [])
        if isinstance(entry, dict)
    }
    found: list[dict[str, Any]] = []
    for client in CLIENTS:
        if client != OPENCODE and client in records:
            found += _one(client, records[client], budgets.get(client), served, reasoning_key)
    return found


def config_paths(
    saved_clients: Any, clients: Any, client_dir: Any, name: str = "agent_client_dir"
) -> dict[str, str]:
    """Where each other client's config is on the controller: the path the client stage recorded
    (client.json ``clients``), else ``client_dir/<client>/<file>`` for a client of ``clients``.

    ``client_dir`` (the option ``name``) is empty for none, else an absolute path without white space.
    """
    paths: dict[str, str] = {}
    names = [c for c in clients if isinstance(c, str) and c in CONFIG_FILES] if isinstance(clients, list) else []
    if names and client_dir != "" and not (
        isinstance(client_dir, str) and client_dir.startswith("/") and not any(c.isspace() for c in client_dir)
    ):
        raise ClientConfigError(
            f"{name} must be an absolute path without white space (empty for none), got {str(client_dir)[:120]!r}"
        )
    for client in names if client_dir else []:
        paths[client] = f"{client_dir.rstrip('/')}/{client}/{CONFIG_FILES[client]}"
    for entry in saved_clients if isinstance(saved_clients, list) else []:
        if isinstance(entry, dict) and entry.get("client") in CONFIG_FILES:
            path = entry.get("config_path")
            if isinstance(path, str) and path.startswith("/") and path.isprintable():
                paths[entry["client"]] = path
    return {name: path for name, path in paths.items() if path.isprintable()}
