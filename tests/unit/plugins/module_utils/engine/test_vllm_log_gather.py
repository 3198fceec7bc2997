# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One vLLM log read for its facts (module_utils/engine/_vllm_log_gather.py).

The log comes from ``content``, a file or a unit (journalctl or podman logs, bounded by
``lines`` and ``since``), and every message names where it came from. The parsing is
test_vllm_log.py's; the module on recorded boots is tests/unit/plugins/modules/
test_vllm_log_facts.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.engine import _vllm_log_gather
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit

BINS = {"journalctl": "/usr/bin/journalctl", "podman": "/usr/bin/podman"}


def params(**given) -> dict:
    base = {"path": None, "content": None, "unit": None, "source": "journal", "since": None, "lines": 20000,
            "host": None, "recipe_hash": None, "kv_memory_gib": None, "timeout": 60.0, "empty_ok": False}
    return {**base, **given}


@pytest.mark.parametrize(
    ("given", "argv"),
    [
        ({"unit": "localinference-vllm.service"},
         ["/usr/bin/journalctl", "-u", "localinference-vllm.service", "--no-pager", "-o", "short", "-n", "20000"]),
        ({"unit": "localinference-vllm.service", "since": "2026-12-05 10:00:00", "lines": 50},
         ["/usr/bin/journalctl", "-u", "localinference-vllm.service", "--no-pager", "-o", "short", "-n", "50",
          "--since", "2026-12-05 10:00:00"]),
        ({"unit": "vllm-head", "source": "podman", "since": "10m"},
         ["/usr/bin/podman", "logs", "--tail", "20000", "--since", "10m", "vllm-head"]),
    ],
    ids=["the journal", "the journal since a boot", "a container"],
)
def test_a_units_log_is_read_bounded(given, argv):
    assert _vllm_log_gather.unit_command(FakeModule(params(**given), bins=BINS)) == argv


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ({"content": "x"}, "content"),
        ({"path": "/var/log/vllm.log"}, "path /var/log/vllm.log"),
        ({"unit": "u.service", "since": "1h"}, "unit u.service (journalctl -u since 1h; check the unit name and since)"),
        ({"unit": "c", "source": "podman"}, "unit c (podman logs; check the unit name and since)"),
    ],
    ids=["content", "a file", "a unit", "a container"],
)
def test_every_message_names_where_the_log_came_from(given, name):
    assert _vllm_log_gather.source_name(params(**given)) == name


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"content": "x", "lines": 0}, "lines must be between 1 and 10000000, got 0"),
        ({"content": "x", "kv_memory_gib": float("inf")}, "kv_memory_gib must be positive and finite, got inf"),
        ({"content": "x", "host": "a\nb"}, "host must be a non-empty printable string"),
        ({"unit": "-rm", "source": "podman"}, "unit: '-rm' is not a container name"),
    ],
    ids=["lines", "infinite memory", "a two-line host", "a container name like an option"],
)
def test_options_are_refused_before_the_log_is_read(given, message):
    with pytest.raises(ModuleExit) as caught:
        _vllm_log_gather.run(FakeModule(params(**given)))
    assert caught.value.result["msg"].startswith(message)
