# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tree shows the pipeline: plugins/module_utils has one folder per stage (and common/,
engine/ for what every stage shares), and no module imports, directly or through others,
a module that imports it back. The modules stay thin: no function in plugins/ over 80 lines.
The unit tests mirror the tree: tests/unit/plugins/module_utils/<stage>/ beside plugins/module_utils/<stage>/."""

from __future__ import annotations

import ast
from pathlib import Path

from ansible_collections.localinference.vllm.plugins.module_utils.common import _embed

ROOT = Path(__file__).resolve().parents[2]
UTILS = ROOT / "plugins" / "module_utils"
UTILS_TESTS = ROOT / "tests" / "unit" / "plugins" / "module_utils"
# The stage table (README) in pipeline order, then what every stage shares.
STAGES = ["preflight", "fabric", "weights", "plan", "serve", "ingress", "watchdog", "monitoring",
          "client", "qualify", "doctor", "upgrade", "tune"]
SHARED = ["common", "engine"]


def test_every_module_is_in_a_stage_folder() -> None:
    loose = sorted(p.name for p in UTILS.glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"module_utils files outside a stage folder: {loose}"
    folders = sorted(p.name for p in UTILS.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(STAGES + SHARED)
    for folder in folders:
        assert (UTILS / folder / "__init__.py").is_file(), f"{folder}/ has no __init__.py"


def test_the_unit_tests_mirror_the_stage_folders() -> None:
    # A test, its case table and its helpers sit in the folder of the stage they test; nothing
    # but the package's __init__.py lies directly in tests/unit/plugins/module_utils.
    entries = [p for p in UTILS_TESTS.iterdir() if p.name != "__pycache__"]
    loose = sorted(p.name for p in entries if not p.is_dir() and p.name != "__init__.py")
    assert loose == [], f"tests/unit/plugins/module_utils/ files outside a stage folder: {loose}"
    assert (UTILS_TESTS / "__init__.py").is_file()
    folders = sorted(p.name for p in entries if p.is_dir())
    strays = sorted(set(folders) - set(STAGES + SHARED))
    assert strays == [], f"tests/unit/plugins/module_utils/ folders with no plugins/module_utils twin: {strays}"
    for folder in folders:
        assert (UTILS_TESTS / folder / "__init__.py").is_file(), f"tests/.../{folder}/ has no __init__.py"


def test_no_import_cycle() -> None:
    for name in _embed.modules():
        _embed.closure(name)  # raises with the cycle named


def test_the_shared_folders_import_no_stage() -> None:
    for name in _embed.modules():
        if name.split(".")[0] in SHARED:
            stages = {dep.split(".")[0] for dep in _embed.imports(name)} - set(SHARED)
            assert not stages, f"{name} (shared) imports from the stages {sorted(stages)}"


def test_a_cycle_is_named(monkeypatch) -> None:
    # the check itself: a module that imports itself through another is refused by name
    fake = {"a._x": ["b._y"], "b._y": ["a._x"]}
    monkeypatch.setattr(_embed, "imports", fake.__getitem__)
    try:
        _embed.closure("a._x")
    except ValueError as err:
        assert str(err) == "import cycle in plugins/module_utils: a._x -> b._y -> a._x"
    else:
        raise AssertionError("the cycle was not found")


def test_no_function_in_plugins_over_80_lines() -> None:
    long = []
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], "functions over 80 lines: " + "; ".join(long)
