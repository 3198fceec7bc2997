# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_log_facts: sources, the argv it runs, and the observations it hands to rollout."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
from ansible.module_utils import basic
from ansible_collections.localinference.vllm.plugins.module_utils.common import _commands
from ansible_collections.localinference.vllm.plugins.modules import vllm_log_facts
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-logs"
SEED002 = FIXTURES / "seed002-rtx-pro-6000.log"


def test_path():
    result = run_module(
        vllm_log_facts, {"path": str(SEED002), "host": "compute-server", "recipe_hash": "abc"}
    )
    facts = result.result["ansible_facts"]["vllm_log"]
    assert result.result["changed"] is False
    assert facts["kv_cache_tokens"] == 285336
    (observation,) = facts["observations"]
    assert observation["host"] == "compute-server" and observation["recipe_hash"] == "abc"
    assert (
        observation["max_model_len"],
        observation["kv_tokens"],
        observation["kv_memory_gib"],
    ) == (262144, 285336, 8.59)
    assert observation["recorded_at"].endswith("+00:00")


def test_content_and_check_mode():
    text = "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 4,096 tokens per request: 512.00x\n"
    result = run_module(vllm_log_facts, {"content": text, "kv_memory_gib": 1.0}, check_mode=True)
    facts = result.result["ansible_facts"]["vllm_log"]
    assert facts["kv_cache_device"] == "CPU"
    assert facts["observations"][0]["kv_memory_gib"] == 1.0
    assert facts["lines_read"] == 1


@pytest.mark.parametrize(
    ("args", "argv_tail", "stdout", "stderr"),
    [
        (
            {"unit": "vllm.service", "since": "2026-08-04 02:44:00"},
            [
                "-u",
                "vllm.service",
                "--no-pager",
                "-o",
                "short",
                "-n",
                "20000",
                "--since",
                "2026-08-04 02:44:00",
            ],
            SEED002.read_text(),
            "",
        ),
        (
            {"unit": "vllm", "source": "podman", "lines": 500},
            ["logs", "--tail", "500", "vllm"],
            "",
            SEED002.read_text(),
        ),
    ],
)
def test_unit_sources(args, argv_tail, stdout, stderr):
    calls = []

    def fake_run(argv, timeout, environ=None, hint=None):
        calls.append((argv, timeout, environ))
        return 0, stdout, stderr

    with (
        mock.patch.object(
            basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: f"/usr/bin/{name}"
        ),
        mock.patch.object(_commands, "run_bounded", fake_run),
    ):
        result = run_module(vllm_log_facts, args)
    ((argv, timeout, env),) = calls
    assert argv[1:] == argv_tail
    assert env["LC_ALL"] == "C" and timeout == 60
    assert result.result["ansible_facts"]["vllm_log"]["scheduled_tokens"] == 8184


def test_unit_failure_names_the_unit():
    with (
        mock.patch.object(
            basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: f"/usr/bin/{name}"
        ),
        mock.patch.object(_commands, "run_bounded", lambda *a, **kw: (1, "", "No such unit")),
    ):
        result = run_module(vllm_log_facts, {"unit": "nope.service"})
    assert result.failed and "nope.service" in result.result["msg"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "one of the following is required"),
        ({"path": "/nonexistent/vllm.log"}, "path /nonexistent/vllm.log cannot be read"),
        ({"content": "x", "unit": "y"}, "mutually exclusive"),
        ({"content": "x", "kv_memory_gib": -1.0}, "kv_memory_gib must be positive"),
        ({"content": "x", "kv_memory_gib": float("nan")}, "kv_memory_gib must be positive"),
        ({"content": ""}, "the log is empty: content"),
        ({"content": "\n  \n"}, "the log is empty: content"),
    ],
)
def test_bad_input(args, message):
    result = run_module(vllm_log_facts, args)
    assert result.failed and message in result.result["msg"]
