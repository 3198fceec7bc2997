# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tree shows the pipeline: plugins/module_utils has one folder per stage (and common/,
engine/ for what every stage shares), and no module imports, directly or through others,
a module that imports it back. A stage imports only the shared folders, its own and the stages
before it in site.yml's order, so shared code cannot hide in one stage's folder. A file's name
says what it holds, not the folder it is in. The modules stay thin: no function in plugins/ over
80 lines. The unit tests mirror the tree: tests/unit/plugins/module_utils/<stage>/ beside
plugins/module_utils/<stage>/."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.common import _embed

ROOT = Path(__file__).resolve().parents[2]
UTILS = ROOT / "plugins" / "module_utils"
UTILS_TESTS = ROOT / "tests" / "unit" / "plugins" / "module_utils"
# The stage table (README) in pipeline order, then what every stage shares. The first ten run in
# playbooks/site.yml's order (the serve stage is its rollout play); the doctor, the upgrade and
# the tune are playbooks of their own that read what the pipeline left, so they come after it.
STAGES = ["preflight", "fabric", "weights", "plan", "serve", "ingress", "watchdog", "monitoring",
          "client", "qualify", "doctor", "upgrade", "tune"]
SHARED = ["common", "engine"]
# site.yml's plays that are stages, by the module_utils folder of their judgement.
SITE_PLAYS = {"rollout": "serve"}


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


def order_violations(modules: list[str], imports: Callable[[str], list[str]]) -> list[str]:
    """Every import of a stage module from a later stage (or of a shared one from any stage)."""
    found = []
    for name in modules:
        folder = name.split(".")[0]
        allowed = set(SHARED) | {folder}
        if folder in STAGES:
            allowed |= set(STAGES[: STAGES.index(folder)])
        for dep in imports(name):
            if dep.split(".")[0] not in allowed:
                found.append(f"{name} imports {dep}")
    return found


def test_a_stage_imports_only_the_shared_folders_and_the_stages_before_it() -> None:
    found = order_violations(_embed.modules(), _embed.imports)
    assert found == [], (
        "plugins/module_utils imports against the stage order (STAGES): " + "; ".join(found)
        + ". Move what both need to common/ or engine/, or to the earlier stage"
    )


@pytest.mark.parametrize(
    ("imports", "expected"),
    [
        ({"serve._units": ["plan._kv_model", "common._recipe", "serve._argv"]}, []),
        ({"preflight._host_stack": ["plan._recipe"]}, ["preflight._host_stack imports plan._recipe"]),
        ({"common._recipe": ["fabric._gid_start"]}, ["common._recipe imports fabric._gid_start"]),
        ({"engine._token_probe": ["engine._sse", "serve._ready"]}, ["engine._token_probe imports serve._ready"]),
        ({"tune._rules": ["qualify._report", "doctor._judge"]}, []),
    ],
)
def test_an_import_against_the_stage_order_is_named(imports, expected) -> None:
    assert order_violations(list(imports), imports.__getitem__) == expected


def test_the_stage_order_is_site_yml_order() -> None:
    plays = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text(encoding="utf-8"))
    ran = [Path(play["ansible.builtin.import_playbook"]).stem for play in plays]
    stages = [SITE_PLAYS.get(name, name) for name in ran if SITE_PLAYS.get(name, name) in STAGES]
    assert stages == [stage for stage in STAGES if stage in stages], (
        f"STAGES in tests/unit/test_layout.py is not playbooks/site.yml's order {stages}"
    )
    assert len(stages) == 10, f"site.yml runs the stages {stages}; name a new one in SITE_PLAYS or STAGES"


def test_no_file_name_repeats_its_folder() -> None:
    # qualify/_qualify_load.py says "qualify" twice; qualify/_load.py says what it holds.
    repeated = []
    for tree in (UTILS, UTILS_TESTS):
        for path in sorted(tree.glob("*/*")):
            stem = path.name.split(".")[0].removeprefix("_").removeprefix("test_")
            if path.is_file() and path.name != "__init__.py" and stem.startswith(path.parent.name):
                repeated.append(str(path.relative_to(ROOT)))
    assert repeated == [], (
        "file names that repeat their folder's name: " + ", ".join(repeated)
        + "; name the file by what it holds (a test by the module it tests: test_<name>.py)"
    )


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
