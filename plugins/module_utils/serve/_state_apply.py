# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``serving_state`` on one node: observe, decide, apply; the module is its docs, spec and :func:`run`.

The order of :func:`run`:

1. Check the options (``_state_inputs.inputs``); with ``checks`` on a staged step, the node's
   load and cluster address first (``_state_checks.node_checks``).
2. Render what the node should hold (``_state.desired``: the document and the units), with
   the parallel layout and the memory guards judged.
3. Observe the node (``_state_observe``: the live document against the rendered one, the
   files a step may write or remove).
4. Decide (``_reconcile.decide``, pure): the refusal, the stop, the writes and removals, the
   reload, the checks. A refusal ends the module before anything changes.
5. Check the rendered flags against the targeted vLLM release (``_state_checks.check_help``).
6. Apply the plan in order (:class:`Files` honours check mode), then the checks on the
   staged or live units.
7. Warn of every finding, name the rollback target and return the result (with the diff).

No AnsibleModule here: ``module`` is the caller's (``params``, ``check_mode``, ``_diff``,
``warn``, ``fail_json``, ``atomic_move``); a failure ends the module through it.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import Runner
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    problems as recipe_problems,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    RecipeInputError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._reconcile import (
    Plan,
    decide,
    previous_path,
    staged_unit_root,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._restart import stop_units
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    StateFileError,
    desired,
    dump,
    read_text,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state_checks import (
    check_help,
    live_checks,
    node_checks,
    refused_or,
    staged_checks,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state_inputs import (
    UNIT_DIRS,
    inputs,
    layout_problems,
    memory,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state_observe import (
    live,
    load,
    observe,
)


class Files:
    """Writes and removals of this module; failures end the module with a clear message."""

    def __init__(self, module: Any, result: dict[str, Any]) -> None:
        self.module = module
        self.result = result

    def fail(self, msg: str) -> None:
        self.module.fail_json(msg=msg, **self.result)

    def require_file(self, path: str, option: str) -> None:
        """Stop before anything changes when ``path`` exists and is a directory."""
        if os.path.isdir(path):
            self.fail(
                f"{option}: {path} is a directory where a file belongs; remove it or choose "
                f"another {option}"
            )

    def write(self, path: str, text: str, option: str, mode: int = 0o644) -> bool:
        """Write ``text`` atomically; return True when the file changed."""
        self.require_file(path, option)
        try:
            current = read_text(path)
        except StateFileError:
            current = None  # a binary or unreadable file of ours is replaced
        if current == text:
            return False
        if self.module.check_mode:
            return True
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".serving-")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(tmp, mode)
        except OSError as exc:
            self.fail(f"{option}: cannot write {path} ({exc.strerror}); check {directory}")
        self.module.atomic_move(tmp, path)
        try:
            os.chmod(path, mode)  # atomic_move gives a new file the umask's mode
        except OSError as exc:
            self.fail(f"{option}: cannot set the mode of {path} ({exc.strerror})")
        return True

    def remove(self, path: str) -> tuple[bool, str | None]:
        """Remove a regular file or a symbolic link (never followed); ``(changed, problem)``."""
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False, None
        except OSError as exc:
            return False, f"{path}: cannot be inspected ({exc.strerror}); left in place"
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            return False, f"{path}: is {kind}, not a unit file the collection wrote; left in place"
        if not self.module.check_mode:
            try:
                os.unlink(path)
            except OSError as exc:
                return False, f"{path}: cannot be removed ({exc.strerror})"
        return True, None


def _apply(
    module: Any, plan: Plan, files: Files, runner: Runner, result: dict[str, Any], context: dict[str, Any]
) -> list[str]:
    """Carry out ``plan`` (refused already in run) in order; returns the files left in place."""
    changed = False
    if module.params["state"] == "present":
        result["stopped"], result["reloaded"] = [], False
        if plan.stop is not None:
            result["stopped"] = refused_or(module, result, stop_units, runner, plan.stop, module.check_mode)
        # Where the new boot's log begins (journalctl --since, the node's local time).
        result["stopped_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
        changed = bool(result["stopped"])
    refused, units_changed = list(plan.refused), False
    for step in plan.steps:
        if step.action == "write":
            done = files.write(step.path, step.text, step.option)
        else:
            done, problem = files.remove(step.path)
            refused += [problem] if problem else []
        changed |= done
        units_changed |= done and step.unit
    if plan.reload and units_changed:
        rc, _, err = runner.run(["systemctl", "daemon-reload"])
        if rc != 0:
            module.fail_json(msg=f"systemctl daemon-reload failed (rc {rc}): {err.strip()[:300]}", **result)
        result["reloaded"] = True
    checks = module.params["checks"]
    if plan.checks == "staged":
        changed |= refused_or(module, result, staged_checks, module, files, checks, context, runner)
    elif plan.checks == "live":
        recipe, unit_dir = context["recipe"], context["unit_dir"]
        refused_or(module, result, live_checks, module, checks, recipe, unit_dir, result, runner)
    result["changed"] = changed
    return refused


def _finish(
    module: Any,
    result: dict[str, Any],
    findings: list[dict[str, Any]],
    refused: list[str],
    unit_dirs: list[str],
    live_text: str | None,
    live: Any,
) -> dict[str, Any]:
    """Warn of every finding, name the rollback target and the diff; the module's result."""
    state_path = module.params["path"]
    findings += [finding("F10", "warning", problem, "remove it by hand if it is stale") for problem in refused]
    _, _, previous, previous_problems = load(previous_path(state_path), unit_dirs, "serving.previous.json")
    findings += [
        finding("F10", "warning", problem, "the rollback has no target until the next update")
        for problem in previous_problems
    ]
    for item in findings:
        module.warn(f"{item['id']}: {item['message']}")
    result["previous_recipe"] = previous["recipe"] if not previous_problems else None
    result["previous_hash"] = previous["recipe_hash"] if not previous_problems else None
    if module._diff:
        before = dump(live) if live is not None else (live_text or "")[:4096]
        result["diff"] = {
            "before": before,
            "after": dump(result["document"]) if module.params["state"] != "absent" else before,
            "before_header": state_path,
            "after_header": state_path,
        }
    return result


def _result(
    recipe: dict[str, Any], wanted: dict[str, Any], trusted: dict[str, Any], live_diff: list[str],
    findings: list[dict[str, Any]], problems: list[dict[str, Any]], memory: Any, checked: dict[str, Any],
) -> dict[str, Any]:
    """The module's result before anything is applied (``changed`` False until then)."""
    document = wanted["document"]
    return {
        "changed": False,
        "recipe": recipe,
        "recipe_hash": document["recipe_hash"],
        "document": document,
        "units": wanted["units"],
        "start_order": document["start_order"],
        "server_argv": document["server_argv"],
        "ray_argv": document["ray_argv"],
        "environment": document["environment"],
        "problems": problems,
        "live_hash": trusted["recipe_hash"],
        "live_start_order": trusted["start_order"],
        "live_recipe": trusted["recipe"],
        "live_matches": not live_diff,
        "differences": live_diff,
        "live_findings": findings,
        "memory": memory,
        **checked,
    }


def run(module: Any) -> dict[str, Any]:
    """The whole of ``serving_state`` on this node, in the order of this file's docstring."""
    params = module.params
    state, checks = params["state"], params["checks"]
    given = inputs(module)
    recipe, node, unit_dir = given["recipe"], given["node"], given["unit_dir"]
    runner = Runner(checks["timeout"] if checks is not None else params["stop_timeout"])
    checked = {}
    if checks is not None and state == "staged":
        checked = refused_or(module, {}, node_checks, checks, node, runner)
    try:
        layout = layout_problems(recipe, node)
    except RecipeInputError as exc:
        module.fail_json(msg=f"vllm_recipe: {exc}")
    slice_dir, guards, need, capped = memory(module, recipe, node, unit_dir)
    # Unit records in a node's document are trusted only inside these directories.
    unit_dirs = sorted({unit_dir, slice_dir, *UNIT_DIRS.values()})
    try:
        wanted = desired(recipe, node, unit_dir, given["venv_dir"], guards, slice_dir)
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    document = wanted["document"]
    live_text, live_doc, trusted, live_diff, findings = live(given["state_path"], unit_dirs, document)
    problems = recipe_problems(recipe) + layout + capped
    result = _result(recipe, wanted, trusted, live_diff, findings, problems, need, checked)
    files = Files(module, result)
    observed = observe(state, wanted["units"], trusted, given["state_path"], given["staging_dir"])
    options = {
        "path": given["state_path"],
        "staging_dir": given["staging_dir"],
        "problems": result["problems"],
        "stop_live": params["stop_live"],
        "daemon_reload": params["daemon_reload"],
        "checks": checks is not None,
        "check_mode": module.check_mode,
    }
    plan = decide(state, wanted, live_doc, trusted, live_diff, observed, options)
    if plan.refusal:  # before the image is asked for its flags or anything is written
        module.fail_json(msg=plan.refusal, **result)
    check_help(module, files, result, given, checks)
    context = {"recipe": recipe, "node": node, "result": result, "unit_dir": unit_dir,
               "unit_root": staged_unit_root(given["staging_dir"]), "units": wanted["units"]}
    refused = _apply(module, plan, files, runner, result, context)
    return _finish(module, result, findings, refused, unit_dirs, live_text, live_doc)
