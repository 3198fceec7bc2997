# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A module is its docs, its argument spec and one call into module_utils (issue 39 item 3).

Every file of plugins/modules/ is held to this shape, as community.general keeps its modules:
what the module does on the node (observe, decide, apply) lives in ``plugins/module_utils/``
beside its pure core, where it is unit-tested without Ansible, and the module only declares
itself. Three checks:

- **The bound: at most MAX_CODE_LINES lines of code**, counted with ``ast`` and ``tokenize``:
  the DOCUMENTATION, EXAMPLES and RETURN strings, the license header and every other comment
  and blank line are not code. The bound is 70 because a thin module needs no more: the
  largest argument spec, serving_state's (55 lines with its ``node`` and ``checks``
  suboptions), plus its imports, ``main`` and the ``__main__`` guard is 63 lines; the others
  are 14 to 49. Seventy leaves room for a few options more, not for a helper.
- **No helper in the module**: the only function is ``main`` and there is no class.
- **main is one call**: it makes exactly one call into module_utils (a lambda handed to that
  call is its argument, not a second call) and branches nowhere (no ``if``, ``for`` or
  ``while``); a ``try`` that turns module_utils' errors into ``fail_json`` is allowed.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted((ROOT / "plugins" / "modules").glob("*.py"))
PACKAGE = "ansible_collections.localinference.vllm.plugins.module_utils"
DOCS = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
MAX_CODE_LINES = 70


def code_lines(source: str) -> int:
    """Lines that hold a token of code, outside the DOCUMENTATION, EXAMPLES and RETURN strings."""
    docs: set[int] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id in DOCS for target in node.targets
        ):
            docs.update(range(node.lineno, node.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            code.update(range(token.start[0], token.end[0] + 1))
    return len(code - docs)


def utils_names(tree: ast.Module) -> set[str]:
    """The names a module binds by importing from plugins/module_utils."""
    return {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE)
        for alias in node.names
    }


def calls_into(node: ast.AST, names: set[str]) -> list[str]:
    """The calls of ``names`` (``f(...)``, ``mod.f(...)``) under ``node``, not inside a lambda."""
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Lambda):
            continue
        if isinstance(child, ast.Call):
            root = child.func
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in names:
                found.append(ast.unparse(child.func))
        found += calls_into(child, names)
    return found


def shape_problems(source: str) -> list[str]:
    """What keeps ``source`` from being docs, spec and one call (empty when it is)."""
    tree = ast.parse(source)
    problems = []
    lines = code_lines(source)
    if lines > MAX_CODE_LINES:
        problems.append(f"{lines} lines of code (at most {MAX_CODE_LINES})")
    helpers = [node.name for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name != "main"]
    if helpers:
        problems.append(f"defines {', '.join(helpers)} (move it to module_utils)")
    mains = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
    if not mains:
        return [*problems, "has no main()"]
    calls = calls_into(mains[0], utils_names(tree))
    if len(calls) != 1:
        problems.append(f"main calls module_utils {len(calls)} times ({', '.join(calls) or 'never'}), not once")
    branches = sorted({type(node).__name__ for node in ast.walk(mains[0])
                       if isinstance(node, (ast.If, ast.For, ast.While, ast.IfExp, ast.comprehension))})
    if branches:
        problems.append(f"main branches ({', '.join(branches)}): decide in module_utils")
    return problems


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_a_module_is_its_docs_its_spec_and_one_call(path: Path) -> None:
    assert shape_problems(path.read_text(encoding="utf-8")) == []


THIN = '''#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
from __future__ import annotations

DOCUMENTATION = r"""
module: thin
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common import _facts_module
from ansible_collections.localinference.vllm.plugins.module_utils.serve._x import XError, run

ARGUMENT_SPEC = {"path": {"type": "path"}}  # a comment is no code


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module)
    except XError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
'''


@pytest.mark.parametrize(
    ("source", "problems"),
    [
        (THIN, []),
        (THIN.replace("result = run(module)", "result = _facts_module.run_facts(module, 'k', lambda r: run(r))"), []),
        (THIN.replace("    module.exit_json(**result)", "    run(module)\n    module.exit_json(**result)"),
         ["main calls module_utils 2 times (run, run), not once"]),
        (THIN.replace("        result = run(module)", "        result = {}"),
         ["main calls module_utils 0 times (never), not once"]),
        (THIN.replace("    module.exit_json(**result)", "    if result:\n        module.exit_json(**result)"),
         ["main branches (If): decide in module_utils"]),
        (THIN.replace("def main()", "def _helper():\n    pass\n\n\ndef main()"),
         ["defines _helper (move it to module_utils)"]),
        (THIN.replace('ARGUMENT_SPEC = {"path": {"type": "path"}}',
                      "ARGUMENT_SPEC = {\n" + "    'o': {},\n" * 60 + "}"),
         ["75 lines of code (at most 70)"]),
    ],
    ids=["thin", "a facts module's lambda", "two calls", "no call", "a branch", "a helper", "over the bound"],
)
def test_the_shape_check_itself(source: str, problems: list[str]) -> None:
    assert shape_problems(source) == problems


def test_docs_header_comments_and_blanks_are_not_code() -> None:
    assert code_lines(THIN) == 14
