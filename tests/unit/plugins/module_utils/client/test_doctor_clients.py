# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor judges Claude Code's, Codex's, Qwen Code's and Crush's configs like opencode's
(module_utils/client/_check.py through doctor/_context.py).

Every config is rendered by the collection's own renderer (``_agents.render``) from the budget of
the recorded lab (65,536 served tokens, opencode's measured floor 11,123, reasoning streamed in
``delta.reasoning``), the client stage's saved result gets the summary the role saves
(``agent_clients_summary``), and the doctor reads the files as ``doctor_facts`` records. Then one
defect is planted in one client's file and the doctor must name it for that client (id, client,
file, ``--tags client``); the configs as rendered give no F7, F8 or F9.
"""

from __future__ import annotations

import copy
import json
import tomllib
from collections.abc import Callable
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.clients import agent_clients_summary
from ansible_collections.localinference.vllm.plugins.filter.doctor import (
    doctor_client_paths,
    doctor_findings,
)
from ansible_collections.localinference.vllm.plugins.filter.stage import findings_table
from ansible_collections.localinference.vllm.plugins.module_utils.client import _agents as c
from ansible_collections.localinference.vllm.plugins.module_utils.client._check import (
    config_paths,
    judge_clients,
    read_limits,
)
from ansible_collections.localinference.vllm.plugins.module_utils.client._toml_write import dumps
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._judge import COLUMNS
from ansible_collections.localinference.vllm.plugins.module_utils.plan._client_budget import (
    plan_client,
)

from tests.unit.plugins.module_utils.doctor.test_judge import build

SERVED = 65536
FLOOR = 11123  # opencode's measured floor in the recorded lab's client.json
MODEL = "localinference/tiny-deepseek"
URL = "http://127.0.0.1:18080/localinference/tiny-deepseek/v1"
DIR = "/home/op/.config/localinference/clients"
OTHERS = [c.CLAUDE_CODE, c.CODEX, c.QWEN_CODE, c.CRUSH]
# Codex and Qwen Code measured (agent_client_prompt_floors); Claude Code and Crush uncalibrated.
FLOORS = {c.CODEX: 9000, c.QWEN_CODE: 12000}


def render_all(reasoning_key: str = "reasoning", served: int = SERVED) -> list[dict[str, Any]]:
    """Every other client's config, as the role renders it for the recorded lab."""
    plan = plan_client(served, FLOOR)
    return [
        c.render(
            client,
            plan=plan,
            model=MODEL,
            base_url=URL,
            api_key_env="LOCALINFERENCE_API_KEY",
            reasoning_key=reasoning_key,
            client_dir=f"{DIR}/{client}",
            prompt_floor=FLOORS.get(client),
        )
        for client in OTHERS
    ]


RENDERED = {r["client"]: r for r in render_all()}


def records(rendered: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What doctor_facts returns for each config on the controller."""
    return {
        r["client"]: {"path": r["config_path"], "found": True, "text": r["config"], "error": None}
        for r in rendered
    }


def evidence(
    others: dict[str, Any],
    rendered: list[dict[str, Any]] | None = None,
    saved: dict[str, Any] | None = None,
    served: int | None = None,
) -> dict[str, Any]:
    """The recorded lab's evidence with the client stage's saved clients and the read configs."""
    result = {"clients": agent_clients_summary(rendered if rendered is not None else render_all())}
    result.update(saved or {})
    case: dict[str, Any] = {"name": "clients", "saved": {"spark-head": {"client": {"result": result}}}}
    if served is not None:
        case["saved"]["spark-head"]["serving"] = {"recipe": {"max_model_len": served}}
    built = build(case)
    built["client"]["others"] = others
    return built


def edit_json(change: Callable[[dict[str, Any]], None]) -> Callable[[str], str]:
    def edit(text: str) -> str:
        doc = json.loads(text)
        change(doc)
        return json.dumps(doc, indent=2)

    return edit


def edit_toml(change: Callable[[dict[str, Any]], None]) -> Callable[[str], str]:
    def edit(text: str) -> str:
        doc = tomllib.loads(text)
        change(doc)
        return dumps(doc)

    return edit


def claude_env(key: str, value: str | None) -> Callable[[str], str]:
    def change(doc: dict[str, Any]) -> None:
        if value is None:
            del doc["env"][key]
        else:
            doc["env"][key] = value

    return edit_json(change)


def qwen_generation(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["modelProviders"]["openai"][0]["generationConfig"]


def crush_model(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["providers"]["localinference"]["models"][0]


def _set(target: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any) -> Callable:
    def change(doc: dict[str, Any]) -> None:
        if value is None:
            target(doc).pop(key)
        else:
            target(doc)[key] = value

    return change


def _top(doc: dict[str, Any]) -> dict[str, Any]:
    return doc


# (name, client, plant, id, severity, words of the message)
PLANTED = [
    ("claude_code window above the served length", c.CLAUDE_CODE,
     claude_env("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "131072"),
     "F8", "error", ["env.CLAUDE_CODE_MAX_CONTEXT_TOKENS 131072", "above the served max_model_len 65536"]),
    ("claude_code without its window assumes 1m tokens", c.CLAUDE_CODE,
     claude_env("CLAUDE_CODE_MAX_CONTEXT_TOKENS", None),
     "F8", "error", ["1000000", "above the served max_model_len 65536"]),
    ("claude_code output past its compaction room", c.CLAUDE_CODE,
     claude_env("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "40000"),
     "F8", "error", ["compaction point 32536 + output 40000 exceeds the served context 65536"]),
    ("codex window above the served length", c.CODEX,
     edit_toml(_set(_top, "model_context_window", 131072)),
     "F8", "error", ["model_context_window 131072", "above the served max_model_len"]),
    ("codex compaction limit at the whole window", c.CODEX,
     edit_toml(_set(_top, "model_auto_compact_token_limit", SERVED)),
     "F8", "error", ["compaction point 65536 + output", "exceeds the served context 65536"]),
    ("codex compaction limit below its measured floor", c.CODEX,
     edit_toml(_set(_top, "model_auto_compact_token_limit", 12000)),
     "F9", "error", ["compaction point 12000 is below the prompt floor 9000"]),
    ("qwen_code window above the served length", c.QWEN_CODE,
     edit_json(_set(qwen_generation, "contextWindowSize", 131072)),
     "F8", "error", ["generationConfig.contextWindowSize 131072", "above the served"]),
    ("qwen_code output as large as the served context", c.QWEN_CODE,
     edit_json(lambda d: qwen_generation(d)["samplingParams"].update(max_tokens=SERVED)),
     "F8", "error", ["output 65536 is not below the served context 65536"]),
    ("qwen_code compacting at 5 % of the window", c.QWEN_CODE,
     edit_json(lambda d: d["context"].update(autoCompactThreshold=0.05)),
     "F9", "error", ["compaction point 3276 is below the prompt floor 12000"]),
    ("crush window above the served length", c.CRUSH,
     edit_json(_set(crush_model, "context_window", 131072)),
     "F8", "error", ["models[].context_window 131072", "above the served"]),
    ("crush large model asking past its summary room", c.CRUSH,
     edit_json(lambda d: d["models"]["large"].update(max_tokens=60000)),
     "F8", "error", ["compaction point 52429 + output 60000"]),
    ("crush told the model does not reason", c.CRUSH,
     edit_json(_set(crush_model, "can_reason", False)),
     "F7", "error", ["can_reason is false", "delta.reasoning"]),
    ("crush without can_reason", c.CRUSH,
     edit_json(_set(crush_model, "can_reason", None)),
     "F7", "error", ["can_reason is none", "delta.reasoning"]),
]


def _shown(found: list[dict[str, Any]]) -> str:
    return "\n".join(findings_table(found, COLUMNS)) if found else "(no findings)"


def _client_rows(found: list[dict[str, Any]], client: str) -> list[dict[str, Any]]:
    return [f for f in found if f["message"].startswith(f"{client}:")]


@pytest.mark.parametrize(
    ("name", "client", "plant", "fid", "severity", "words"),
    PLANTED,
    ids=[row[0] for row in PLANTED],
)
def test_a_planted_defect_is_named_for_its_client(name, client, plant, fid, severity, words):
    others = records(render_all())
    others[client]["text"] = plant(others[client]["text"])
    found = doctor_findings(evidence(others))["findings"]
    shown = _shown(found)
    hits = [f for f in _client_rows(found, client) if f["id"] == fid]
    assert hits, f"no {fid} for {client}:\n{shown}"
    hit = next((f for f in hits if all(w in f["message"] for w in words)), None)
    assert hit, f"{fid} for {client} without {words}:\n{shown}"
    assert hit["severity"] == severity and hit["host"] == "controller"
    path = RENDERED[client]["config_path"]
    assert hit["evidence"].startswith(f"{client} {path}: context "), hit["evidence"]
    assert "--tags client" in hit["fix"] and client in hit["fix"]
    # Only the planted client is named: the others' configs are sound.
    for other in OTHERS:
        if other != client:
            assert not _client_rows(found, other), f"{other} named for {client}'s defect:\n{shown}"


@pytest.mark.parametrize("reasoning_key", ["reasoning", "reasoning_content", "none"])
def test_the_configs_as_rendered_give_no_f7_f8_f9(reasoning_key):
    rendered = render_all(reasoning_key)
    result = doctor_findings(
        evidence(records(rendered), rendered, saved={"reasoning_key": reasoning_key})
    )
    named = [f for f in result["findings"] if f["message"].split(":")[0] in OTHERS]
    assert not named, _shown(named)
    assert not [f for f in result["findings"] if f["id"] in ("F7", "F8", "F9", "client-config")]
    assert result["healthy"], result["verdict"]


def test_a_server_that_stopped_reasoning_needs_no_can_reason():
    others = records(render_all())
    others[c.CRUSH]["text"] = edit_json(_set(crush_model, "can_reason", False))(
        others[c.CRUSH]["text"]
    )
    found = doctor_findings(evidence(others, saved={"reasoning_key": "none"}))["findings"]
    assert not _client_rows(found, c.CRUSH), _shown(found)


def test_a_shrunk_served_context_is_f8_for_every_client():
    """The rollout halved max_model_len; every client still assumes 65,536 (opencode too)."""
    found = doctor_findings(evidence(records(render_all()), served=32768))["findings"]
    shown = _shown(found)
    for client in OTHERS:
        assert any(
            f["id"] == "F8" and "above the served max_model_len 32768" in f["message"]
            for f in _client_rows(found, client)
        ), f"{client}:\n{shown}"


def _garbage(client: str) -> str:
    return "model = [" if client == c.CODEX else '{"env": '


UNREADABLE = [
    ("missing", lambda r: {**r, "found": False, "text": None}, "is missing"),
    ("unreadable", lambda r: {**r, "text": None, "error": f"{r['path']} is a directory, not a file"},
     "cannot be read"),
    ("not parseable", lambda r: {**r, "text": _garbage(r["path"].split("/")[-2])}, "is not valid"),
    ("empty", lambda r: {**r, "text": ""}, "not the one the collection writes"),
    ("a list", lambda r: {**r, "text": "[]" if not r["path"].endswith(".toml") else "x = 1"},
     "not the one the collection writes"),
    ("a token count as text", lambda r: {**r, "text": r["text"].replace("65536", '"many"')},
     "not the one the collection writes"),
    ("not a record", lambda r: "garbage", "is missing"),
]


@pytest.mark.parametrize("client", OTHERS)
@pytest.mark.parametrize(("name", "spoil", "words"), UNREADABLE, ids=[u[0] for u in UNREADABLE])
def test_a_missing_or_unparseable_config_is_a_warning(client, name, spoil, words):
    others = records(render_all())
    others[client] = spoil(others[client])
    result = doctor_findings(evidence(others))
    rows = _client_rows(result["findings"], client)
    assert rows, _shown(result["findings"])
    assert all(f["id"] == "client-config" and f["severity"] == "warning" for f in rows), _shown(rows)
    assert any(words in f["message"] for f in rows), _shown(rows)
    assert all("--tags client" in f["fix"] for f in rows)
    assert result["healthy"], result["verdict"]


def test_a_config_the_client_stage_did_not_write_is_a_warning():
    """The inventory names crush, but the saved client result has no budget for it."""
    rendered = render_all()
    others = records(rendered)
    saved = [r for r in rendered if r["client"] != c.CRUSH]
    rows = _client_rows(doctor_findings(evidence(others, saved))["findings"], c.CRUSH)
    assert [f["id"] for f in rows] == ["client-config"]
    assert "has no budget for it" in rows[0]["message"]


def test_no_client_measurement_on_the_head_judges_no_config():
    others = records(render_all())
    others[c.CODEX]["text"] = "garbage"
    case = {"name": "no client.json", "missing": {"spark-head": ["client"]}}
    built = build(case)
    built["client"]["others"] = others
    found = doctor_findings(built)["findings"]
    assert not [f for f in found if f["id"] in ("F7", "F8", "F9", "client-config")], _shown(found)


@pytest.mark.parametrize(
    ("records_", "saved", "expect"),
    [
        (None, [], []),
        ("x", [], []),
        ({"opencode": {"text": "{}"}}, [], []),
        ({"aider": {"text": "{}"}}, [], []),
    ],
)
def test_judge_clients_ignores_what_is_not_another_client(records_, saved, expect):
    assert judge_clients(records_, saved, served=SERVED, reasoning_key="reasoning") == expect


@pytest.mark.parametrize("client", OTHERS)
def test_the_doctor_reads_back_the_budget_the_renderer_wrote(client):
    """The same rules both ways: what the doctor reads from a rendered config is its budget."""
    rendered = RENDERED[client]
    limits = read_limits(client, rendered["config"], rendered["config_path"], rendered["budget"])
    assert limits["context"] == SERVED
    assert limits["output"] == rendered["budget"]["output"]
    assert limits["compact_at"] == rendered["budget"]["compact_at"]


def test_config_paths_from_the_saved_result_and_the_inventory():
    saved = agent_clients_summary(render_all())
    assert config_paths(saved, None, "") == {r: RENDERED[r]["config_path"] for r in OTHERS}
    assert config_paths([], ["opencode", "codex"], "/home/u/clients/") == {
        "codex": "/home/u/clients/codex/config.toml"
    }
    # The recorded path wins; a relative or unprintable one is never read.
    moved = copy.deepcopy(saved)
    moved[0]["config_path"] = "relative/settings.json"
    moved[1]["config_path"] = "/x/\nconfig.toml"
    paths = config_paths(moved, ["claude_code"], "/d")
    assert paths["claude_code"] == "/d/claude_code/settings.json" and "codex" not in paths
    assert config_paths("x", "y", 5) == {}


def test_the_playbook_filter_finds_the_saved_paths():
    built = evidence({})
    assert doctor_client_paths(built, ["opencode"], "") == {
        r: RENDERED[r]["config_path"] for r in OTHERS
    }
    assert doctor_client_paths(None) == {}


@pytest.mark.parametrize("directory", ["clients", "~/clients", "/home/u/my clients", 5])
def test_the_playbook_filter_refuses_a_client_dir_that_is_no_absolute_path(directory):
    """doctor_client_dir named, never silently ignored (an unexpanded ~ included)."""
    with pytest.raises(AnsibleFilterError, match="doctor_client_dir must be an absolute path"):
        doctor_client_paths(evidence({}), ["opencode", "codex"], directory)
