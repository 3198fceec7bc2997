# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's own code as a program for a node that has no collection installed.

The node programs (``shm-offload``, ``gid-start``, the ``watchdog``) are built the one
way this file describes: the entry module and everything it imports from
``plugins/module_utils``, each after what it imports, embedded byte for byte (base64) and
loaded under their collection names by a small loader; the entry module's ``main()`` runs.
``imports`` and ``closure`` are also what the layout test reads (no import cycle).
"""

from __future__ import annotations

import ast
import base64
from pathlib import Path

PACKAGE = "ansible_collections.localinference.vllm.plugins.module_utils"
ROOT = Path(__file__).resolve().parents[1]

LOADER = '''

def load() -> types.ModuleType:
    """Register the packages and modules above in sys.modules; return the last (the entry)."""
    module = None
    for name, encoded in SOURCES:
        parts = f"{PACKAGE}.{name}".split(".")
        for depth in range(1, len(parts)):
            package_name = ".".join(parts[:depth])
            if package_name not in sys.modules:
                package = sys.modules[package_name] = types.ModuleType(package_name)
                package.__path__ = []
                if depth > 1:
                    setattr(sys.modules[".".join(parts[: depth - 1])], parts[depth - 1], package)
        module = types.ModuleType(".".join(parts))
        module.__file__ = f"<{module.__name__}>"
        sys.modules[module.__name__] = module
        setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)
        code = compile(base64.b64decode(encoded).decode("utf-8"), module.__file__, "exec")
        exec(code, module.__dict__)  # noqa: S102 - the collection's own code, embedded above
    return module


if __name__ == "__main__":
    sys.exit(load().main())
'''


def path(name: str) -> Path:
    """``serve._units`` -> plugins/module_utils/serve/_units.py."""
    return ROOT.joinpath(*name.split(".")).with_suffix(".py")


def modules() -> list[str]:
    """Every module of plugins/module_utils as a dotted name below the package."""
    return sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in ROOT.rglob("*.py")
        if p.name != "__init__.py"
    )


def imports(name: str) -> list[str]:
    """The collection modules ``name`` imports, anywhere in the file (deferred imports too)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path(name).read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(PACKAGE + "."):
            continue
        module = node.module[len(PACKAGE) + 1:]
        if path(module).is_file():
            found.append(module)
        else:  # from PACKAGE.stage import _a, _b
            found += [f"{module}.{alias.name}" for alias in node.names]
    return list(dict.fromkeys(found))


def closure(entry: str) -> list[str]:
    """``entry`` and what it imports, transitively, each after what it imports; a cycle is an error."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            cycle = " -> ".join([*visiting[visiting.index(name):], name])
            raise ValueError(f"import cycle in plugins/module_utils: {cycle}")
        visiting.append(name)
        for needed in imports(name):
            visit(needed)
        visiting.pop()
        order.append(name)

    visit(entry)
    return order


def program(entry: str, header: list[str]) -> str:
    """The node program: shebang, the header as comments, the sources, the loader."""
    if not path(entry).is_file():
        raise ValueError(f"no module plugins/module_utils/{entry.replace('.', '/')}.py to embed")
    sources = "".join(
        f'    ("{name}", "{base64.b64encode(path(name).read_bytes()).decode()}"),\n'
        for name in closure(entry)
    )
    comments = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header)
    return (
        "#!/usr/bin/python3 -I\n"
        + comments
        + f"# The code is the collection's plugins/module_utils/{entry.replace('.', '/')}.py and what it\n"
        "# imports, unchanged: embedded (base64, byte for byte) and loaded under their collection\n"
        "# names, because the collection is not installed here.\n"
        "from __future__ import annotations\n\nimport base64\nimport sys\nimport types\n\n"
        f'PACKAGE = "{PACKAGE}"\nSOURCES = (\n{sources})\n'
        + LOADER
    )
