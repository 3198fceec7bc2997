# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One validator, one error type, one reader (issue 39, item 2), read from the code itself.

Three rules, each true of the tree and each checked by reading its source (ast) or its classes:

1. **No private number reader.** Outside ``common/_validate.py``, no function of
   plugins/module_utils or plugins/modules *returns* a number it made with ``int()`` or
   ``float()`` from its own input: a parameter, or text cut from one (``text.strip()``,
   ``parts[0]``).  That is the shape every hand-written reader had (``return int(value)``,
   ``number = float(text) ... return number``), and the shape that lets ``'nan'`` through:
   ``float('nan')`` compares false with every limit.  Such a function calls
   ``validate.number``/``integer``/``whole``/``counter``/``finite`` instead, which refuse NaN
   and infinity and name the variable.  What the rule leaves alone is deliberate: arithmetic
   (``int(share * context)`` truncates a computed figure, it reads nothing), a conversion
   inside a larger parser that checks its result (``fabric/_busbw._row`` refuses a NaN
   bandwidth by name), and a value a validator already returned.  The entry points that read
   a number from an option, a role variable or a node's file each have a NaN/infinity row in
   tests/unit/bad_input/test_bad_input_numbers.py: the rule keeps new helpers out, the rows
   keep the existing paths honest.
2. **One error type.** Every exception class of plugins/module_utils derives from
   ``common/_validate.Error`` (a stage keeps its own subclass where a caller tells errors
   apart), so a module or a node program can catch one type and show its message.
3. **One reader.** No module_utils file or module opens a file for reading itself: reads go
   through ``common/_files`` (a size limit, an error that names the file).  Writing is not
   reading (``open(path, "w")``, ``os.open(..., O_WRONLY)``); a directory descriptor
   (``O_DIRECTORY``) reads no file.  ``STREAM_READERS`` lists the few readers that cannot be a
   bounded read of a whole file, each with its reason.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _embed,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "plugins"
SOURCES = sorted([*(PLUGINS / "module_utils").rglob("*.py"), *(PLUGINS / "modules").glob("*.py")])
VALIDATE = PLUGINS / "module_utils" / "common" / "_validate.py"
FILES = PLUGINS / "module_utils" / "common" / "_files.py"

# (file below plugins/, call) -> why it reads a file itself.
STREAM_READERS = {
    ("module_utils/weights/_file_hash.py", "os.open"):
        "hashes multi-GB weights in constant memory with read-ahead hints and overlapped reads",
    ("module_utils/weights/_safetensors.py", "open"):
        "reads an 8-byte length, then a header bounded by MAX_SAFETENSORS_HEADER, never the tensors",
    ("module_utils/watchdog/_node.py", "os.open"):
        "/dev/kmsg is a device read one record per read(), without blocking",
    ("module_utils/common/_embed.py", ".read_text"):
        "the collection's own source, on the controller, not a node's file",
    ("module_utils/common/_embed.py", ".read_bytes"):
        "the collection's own source, on the controller, not a node's file",
}


def _rel(path: Path) -> str:
    return str(path.relative_to(PLUGINS))


# --- 1. no private number reader ---------------------------------------------------------------


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _validated(node: ast.AST) -> bool:
    """A call of ``validate.<kind>(...)``: its result is checked, not raw input."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("validate", "_validate")
    )


def _inputs(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The parameters, and every local assigned from an expression that uses one."""
    args = function.args
    found = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} - {"self", "cls"}
    grown = True
    while grown:
        grown = False
        for node in ast.walk(function):
            if (
                isinstance(node, (ast.Assign, ast.AnnAssign))
                and node.value is not None
                and _names(node.value) & found
                and not _validated(node.value)
            ):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                new = {n for t in targets for n in _names(t)} - found
                grown = grown or bool(new)
                found |= new
    return found


def _regex_digits(node: ast.AST) -> bool:
    """``match.group(...)``: text a pattern already held to its characters."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "group"
    )


def _conversion(node: ast.AST, inputs: set[str]) -> bool:
    """``int(x)``/``float(x)`` (or ``round()`` of one) of raw input.

    Not raw: arithmetic (``int(share * context)``), a validator's result, a typed field
    (``float(boot.kv_tokens)``: an attribute of an object built from checked input) and, for
    ``int()``, a regex group (a pattern of digits; int() cannot make a NaN of it).
    """
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "round":
        return bool(node.args) and _conversion(node.args[0], inputs)
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("int", "float")
        and len(node.args) == 1
    ):
        return False
    arg = node.args[0]
    if isinstance(arg, (ast.BinOp, ast.Attribute)) or _validated(arg):
        return False
    if node.func.id == "int" and _regex_digits(arg):
        return False
    return bool(_names(arg) & inputs)


def number_readers(source: str) -> list[str]:
    """``name:line`` of each function that returns int()/float() of its own input."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        inputs = _inputs(function)
        converted = {
            n
            for node in ast.walk(function)
            if isinstance(node, ast.Assign) and _conversion(node.value, inputs)
            for t in node.targets
            if isinstance(t, ast.Name)
            for n in _names(t)
        }
        for node in ast.walk(function):
            if not isinstance(node, ast.Return) or node.value is None:
                continue
            value = node.value
            branches = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
            if any(
                _conversion(b, inputs) or (isinstance(b, ast.Name) and b.id in converted)
                for b in branches
            ):
                found.append(f"{function.name}:{node.lineno}")
    return found


def test_no_private_number_reader() -> None:
    found = {
        _rel(path): readers
        for path in SOURCES
        if path != VALIDATE and (readers := number_readers(path.read_text(encoding="utf-8")))
    }
    assert found == {}, (
        "functions that read a number themselves (int()/float() of their input, returned); "
        f"use common/_validate (number, integer, whole, counter, finite): {found}"
    )


def test_the_number_rule_sees_the_shapes_it_forbids() -> None:
    # the check itself, on the shapes the old helpers had and the ones it leaves alone
    forbidden = '''
def a(value):
    return float(value)
def b(text, what):
    value = text.strip()
    return int(value)
def c(text):
    number = float(text)
    if number < 0:
        raise ValueError(text)
    return number
def d(value):
    return None if value is None else round(float(value), 1)
'''
    allowed = '''
def e(share, context):
    return int(share * context)
def f(value):
    return validate.number("x", value)
def g(text):
    row = {"size": int(text)}
    return row
def h():
    return float("inf")
def i(key, value):
    number = validate.number(key, value)
    return int(number) if number.is_integer() else number
def j(boot):
    return float(boot.kv_tokens)
def k(text):
    match = PATTERN.match(text)
    return int(match.group(1))
'''
    assert number_readers(forbidden) == ["a:3", "b:6", "c:11", "d:13"]
    assert number_readers(allowed) == []


# --- 2. one error type -------------------------------------------------------------------------


def test_every_module_utils_error_derives_from_the_one_error_type() -> None:
    strays = []
    for name in _embed.modules():
        module = importlib.import_module(f"{_embed.PACKAGE}.{name}")
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            mine = cls.__module__ == module.__name__ and issubclass(cls, BaseException)
            if mine and not issubclass(cls, validate.Error):
                strays.append(f"{name}.{cls_name}")
    assert strays == [], f"errors that do not derive from common/_validate.Error: {strays}"


def test_old_except_clauses_still_catch_what_they_caught() -> None:
    # InputError is a ValueError, ValidationError an InputError: nothing caught before is lost
    assert issubclass(validate.InputError, ValueError)
    assert issubclass(validate.ValidationError, validate.InputError)
    assert not issubclass(validate.Error, ValueError)


# --- 3. one reader -----------------------------------------------------------------------------


def _constant_text(node: ast.AST | None) -> str:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def _mode(call: ast.Call, position: int) -> str:
    if len(call.args) > position:
        return _constant_text(call.args[position])
    return next((_constant_text(k.value) for k in call.keywords if k.arg == "mode"), "r")


def file_reads(source: str) -> list[tuple[str, int]]:
    """``(call, line)`` of each read of a file: open() and os.fdopen() to read, os.open() of a
    file, Path.read_text()/read_bytes()/open()."""
    tree = ast.parse(source)
    assigned = {
        t.id: ast.unparse(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    found = []
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        if isinstance(func, ast.Name) and func.id == "open":
            if not set(_mode(call, 1)) & set("wax"):
                found.append(("open", call.lineno))
        elif isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if owner in ("os", "io") and func.attr == "fdopen":
                if not set(_mode(call, 1)) & set("wax"):
                    found.append(("os.fdopen", call.lineno))
            elif owner == "os" and func.attr == "open":
                flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
                flags = assigned.get(flags, flags)  # os.open(path, flags) with flags = ...
                if not any(f in flags for f in ("O_WRONLY", "O_DIRECTORY")):
                    found.append(("os.open", call.lineno))
            elif owner == "io" and func.attr == "open":
                found.append(("io.open", call.lineno))
            elif func.attr in ("read_text", "read_bytes") and owner != "_files":
                found.append((f".{func.attr}", call.lineno))  # Path(...).read_text()
    return found


def test_node_files_are_read_through_common_files() -> None:
    found = {}
    for path in SOURCES:
        if path == FILES:
            continue
        reads = [
            f"{call}:{line}"
            for call, line in file_reads(path.read_text(encoding="utf-8"))
            if (_rel(path), call) not in STREAM_READERS
        ]
        if reads:
            found[_rel(path)] = reads
    assert found == {}, f"files read outside common/_files (use its readers): {found}"


def test_every_stream_reader_is_still_there() -> None:
    # an entry whose reader went through common/_files since is dropped from the list
    for (where, call), _why in STREAM_READERS.items():
        calls = {c for c, _ in file_reads((PLUGINS / where).read_text(encoding="utf-8"))}
        assert call in calls, f"{where} no longer reads with {call}: drop it from STREAM_READERS"


def test_the_reader_rule_sees_reads_and_not_writes() -> None:
    source = '''
open(p)
open(p, "rb")
open(p, encoding="utf-8")
open(p, "w")
open(p, mode="a")
os.fdopen(fd, "w")
os.open(p, os.O_RDONLY)
os.open(p, os.O_WRONLY | os.O_CREAT)
os.open(d, os.O_RDONLY | os.O_DIRECTORY)
Path(p).read_text()
_files.read_text(p, 10)
'''
    assert file_reads(source) == [("open", 2), ("open", 3), ("open", 4), ("os.open", 8), (".read_text", 11)]
