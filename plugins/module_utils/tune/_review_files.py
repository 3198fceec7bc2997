# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the tune leaves for review in ``tune_dir``: tune.json, tuned-recipe.diff, trials.png.

Each file is replaced atomically (a temporary file in the same directory, then rename), so an
interrupted tune leaves the previous complete file, never half of one. The plot is drawn with
matplotlib (a controller requirement, as the qualification's plots) when there is a trial.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.qualify._plots import (
    HAS_MATPLOTLIB,
)
from ansible_collections.localinference.vllm.plugins.module_utils.tune import _trials

if HAS_MATPLOTLIB:
    from matplotlib import pyplot

TUNE_JSON, DIFF, PLOT = "tune.json", "tuned-recipe.diff", "trials.png"
COLOURS = {"promoted": "tab:green", "reverted": "tab:red", "failed": "tab:gray"}


def _replace(directory: str, name: str, data: bytes) -> str:
    path = os.path.join(directory, name)
    handle, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return path


def _plot(document: dict[str, Any], directory: str) -> str | None:
    trials = document.get("trials") or []
    if not trials or not HAS_MATPLOTLIB:
        return None
    figure, axis = pyplot.subplots(figsize=(7, 4))
    labels = ["serving\n(before)"] + [f"{t['trial']}: {t['candidate']['rule']}" for t in trials]
    stalls = [document["before"].get("figures", {}).get("head_of_line_stall_s") or 0]
    stalls += [(t.get("figures") or {}).get("head_of_line_stall_s") or 0 for t in trials]
    colours = ["tab:blue"] + [COLOURS.get(t.get("outcome"), "tab:gray") for t in trials]
    axis.bar(range(len(labels)), stalls, color=colours)
    for index, trial in enumerate(trials, start=1):
        axis.annotate(f"{trial.get('outcome')}\nscore {trial.get('score', 0):+.2f}", (index, stalls[index]),
                      ha="center", va="bottom", fontsize=8)
    axis.set_xticks(range(len(labels)), labels, fontsize=8)
    axis.set_ylabel("short request's wait behind a long prefill (s)")
    axis.set_title("Tune trials (green promoted, red reverted)")
    figure.tight_layout()
    path = os.path.join(directory, PLOT)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


def write(directory: str, document: dict[str, Any], diff: str) -> dict[str, Any]:
    """Write the three files; returns their paths (``plot`` None without a trial or matplotlib)."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    paths = {
        "tune_json": _replace(directory, TUNE_JSON, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()),
        "diff": _replace(directory, DIFF, diff.encode()),
    }
    paths["plot"] = _plot(document, directory)
    return paths


def record(module: Any) -> dict[str, Any]:
    """The ``tune_record`` module: the tune's document and diff, written into ``dest`` outside check mode.

    ``module`` is the caller's AnsibleModule (``params``, ``check_mode``, ``fail_json``).
    """
    p = module.params
    diff = _trials.recipe_diff(p["inventory_recipe"], p["after"].get("recipe") or p["inventory_recipe"])
    document = _trials.document(
        status=p["status"], findings_found=p["findings"], candidates=p["candidates"], dropped=p["dropped"],
        skipped=p["skipped"], trials=p["trials"], before=p["before"], after=p["after"],
        weights=p["weights"], stopped=p["stopped"],
    )
    figures = _trials.before_after(p["before"], p["after"])
    if module.check_mode:
        return {"changed": False, "tune_json": None, "diff": diff, "plot": None, "figures": figures}
    try:
        paths = write(p["dest"], document, diff)
    except OSError as exc:
        module.fail_json(msg=f"tune_record: cannot write the tune's record into {p['dest']}: {exc}")
    return {"changed": False, "diff": diff, "figures": figures, **{k: v for k, v in paths.items() if k != "diff"}}
