# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan's F4/F8/F9/F12 judgements (``plan/_kv_judge.py``) from case tables, no mocks."""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_judge import (
    capacity_violations,
    client_violations,
    first_boot_violations,
    weakest_rank_check,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_model import (
    GIB,
    KvInputError,
)

F4 = (
    "the recipe pins 8.00 GiB of KV cache per rank, but the weakest rank spark-2 has only 6.00 GiB"
    " free (preflight): the start would fail there, not on the head; free memory on that rank"
    " (other tenants, swap) or pin less"
)

# (case, weakest_rank, pinned bytes) -> (weakest_rank result, violation ids and messages)
WEAKEST = [
    ("no-weakest-rank", None, 8 * GIB, {}, []),
    ("nothing-pinned", {"host": "spark-2", "free_gib": 6}, None, {"host": "spark-2", "fits": None}, []),
    ("fits-in-gib", {"host": "spark-2", "free_gib": 8}, 8 * GIB, {"host": "spark-2", "fits": True}, []),
    ("fits-in-bytes", {"host": "spark-2", "free_bytes": 9 * GIB}, 8 * GIB,
     {"host": "spark-2", "fits": True}, []),
    ("too-little-f4", {"host": "spark-2", "free_gib": 6}, 8 * GIB,
     {"host": "spark-2", "fits": False}, [("F4", F4)]),
    ("unnamed-rank", {"free_gib": 1}, None, {"host": "the weakest rank", "fits": None}, []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("weakest", "pinned", "result", "found"), [c[1:] for c in WEAKEST], ids=[c[0] for c in WEAKEST]
)
def test_weakest_rank_check(weakest, pinned, result, found) -> None:
    got, violations = weakest_rank_check(weakest, pinned)
    assert got == result
    assert [(v["id"], v["message"]) for v in violations] == found
    assert all(v["severity"] == "error" for v in violations)


def test_weakest_rank_without_free_memory_names_the_option() -> None:
    with pytest.raises(KvInputError, match="weakest_rank needs free_gib or free_bytes"):
        weakest_rank_check({"host": "spark-2"}, GIB)


def client(ok, floor=None, output=4096, reason="", more=0, needed=0):
    return {"ok": ok, "prompt_floor": floor, "output": output, "reason": reason,
            "additional_context_needed": more, "needed_context": needed}  # fmt: skip


# (case, client budget, max_model_len) -> violations (id, message)
CLIENT = [
    ("sound-budget", client(True, 12000), 32768, []),
    ("no-floor-no-judgement", client(None), 32768, []),
    ("no-floor-but-no-room-f8", client(False, reason="output 4096 leaves no input"), 4096,
     [("F8", "output 4096 leaves no input")]),
    ("overflow-f8-and-f9", client(False, 30000, 4096, "too short", 1328, 34096), 32768,
     [("F8", "prompt floor 30000 + output_tokens 4096 = 34096 > max_model_len 32768: full"
             " requests overflow; lower output_tokens or raise max_model_len by 1328"),
      ("F9", "no sound opencode budget at max_model_len 32768: too short; 1328 more tokens of"
             " context are needed (34096)")]),
    ("fits-but-no-headroom-f9", client(False, 20000, 4096, "no compaction room", 8000, 40768), 32768,
     [("F9", "no sound opencode budget at max_model_len 32768: no compaction room; 8000 more"
             " tokens of context are needed (40768)")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("budget", "length", "found"), [c[1:] for c in CLIENT], ids=[c[0] for c in CLIENT]
)
def test_client_violations(budget, length, found) -> None:
    assert [(v["id"], v["message"]) for v in client_violations(budget, length)] == found


@pytest.mark.parametrize(
    ("explicit", "ids"), [(None, ["F12"]), (8192, [])], ids=["no-boot-no-length", "explicit-length"]
)
def test_first_boot_violations(explicit, ids) -> None:
    assert [v["id"] for v in first_boot_violations(explicit)] == ids


PLAN = {"memory": {"worst": 0.5}, "model": {"unit": "GiB"}}


@pytest.mark.parametrize(
    ("length", "found"),
    [
        (0, ["the worst boot (0.5 GiB per rank) holds no request of 1024 tokens at min_concurrency"
             " 1: free memory (preflight) or lower min_concurrency"]),
        (1024, []),
    ],
    ids=["no-room-f12", "room-for-one"],
)  # fmt: skip
def test_capacity_violations(length, found) -> None:
    got = capacity_violations({**PLAN, "max_model_len": length}, 1024, 1.0)
    assert [v["message"] for v in got] == found
    assert all(v["id"] == "F12" for v in got)
