# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admission as the serving units run it (F4): ``--drop-caches`` on unified memory and the
refusal line the rollout finds in the journal (``REFUSAL_MARKER``)."""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _admission
from ansible_collections.localinference.vllm.plugins.module_utils.serve._admission import (
    REFUSAL_MARKER,
    check,
    drop_caches,
    main,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    start_refusals,
)


def test_drop_caches_syncs_then_writes_3(tmp_path):
    target = tmp_path / "drop_caches"
    target.write_text("0\n")
    calls = []
    assert drop_caches(str(target), sync=lambda: calls.append("sync")) is None
    assert calls == ["sync"]
    assert target.read_text() == "3\n"


def test_drop_caches_that_cannot_write_says_why(tmp_path):
    reason = drop_caches(str(tmp_path), sync=lambda: None)  # a directory cannot be written
    assert reason is not None
    assert reason.startswith("page caches not dropped (") and str(tmp_path) in reason


@pytest.mark.parametrize(
    ("drop", "said"),
    [
        (None, None),
        (lambda: None, "page caches dropped first"),
        (lambda: "page caches not dropped (x: Read-only file system)", "Read-only file system"),
    ],
    ids=["not asked", "dropped", "could not drop"],
)
def test_the_decision_says_what_happened_to_the_caches(drop, said):
    """Dropping caches changes the engine's view, not the measurement (MemAvailable already
    counts reclaimable cache): a failed drop is said, never a refusal by itself."""
    admitted = check(0, 0, drop=drop, host="h")
    assert admitted["admitted"]
    refused = check(2**60, 0, drop=drop, host="h")
    assert not refused["admitted"]
    for decision in (admitted, refused):
        if said is None:
            assert "page caches" not in decision["message"]
        else:
            assert said in decision["message"]
    assert refused["message"].startswith(f"{REFUSAL_MARKER} on h: ")


def test_the_program_drops_caches_only_when_asked(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(_admission, "drop_caches", lambda: calls.append(1))
    assert main(["--need-bytes", "0", "--host", "h"]) == 0
    assert calls == []
    assert main(["--need-bytes", "0", "--host", "h", "--drop-caches"]) == 0
    assert calls == [1]
    assert "page caches dropped first" in capsys.readouterr().out


def test_the_refusal_line_is_what_the_rollout_finds_in_the_journal(capsys):
    assert main(["--need-gib", "100000", "--reserve-gib", "2", "--host", "spark-worker"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    journal = [
        "Dec 01 10:00:00 spark-worker systemd[1]: Starting localinference-vllm.service...",
        f"Dec 01 10:00:01 spark-worker admission[4242]: {line}",
        "Dec 01 10:00:01 spark-worker systemd[1]: localinference-vllm.service: Control process"
        " exited, code=exited, status=1/FAILURE",
    ]
    assert start_refusals(journal) == [line]
    assert line.startswith("localinference admission refused the start on spark-worker: ")
    assert "largest processes by RSS: " in line
    assert line.endswith("(docs/failure-catalog.md#f4)")
