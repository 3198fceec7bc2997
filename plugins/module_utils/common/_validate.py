# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One validator per kind of value that reaches a unit file, a command line or a path.

Validate at the boundary, once: the recipe (``_recipe.normalise``) and the node
description (``serve/_argv.make_node``) pass every string through one of these
functions before anything is rendered.  Each returns the value in its canonical
form or raises :class:`ValidationError`, whose message names the variable, the
offending character (``'\\n' at position 17``) or value, and the fix.

Kinds: :func:`text` (one line of printable text), :func:`systemd_value` (written
raw after ``Key=`` in a unit file), :func:`image_reference`, :func:`path`,
:func:`device`, :func:`interface_name`, :func:`unit_name`, :func:`host`,
:func:`env_name`, :func:`env_value`, :func:`port`, :func:`size`; numbers: :func:`integer`,
:func:`number`, :func:`whole` (a count that may come as a float), :func:`counter` (a kernel's
or a tool's digits) and :func:`finite` (a figure a program wrote, or None; never raises);
:func:`existing_directory` also looks at the node (a path option that must be a directory);
:func:`table_errors` checks a role's table of inputs with them.

Every number read from outside goes through one of these (tests/unit/test_one_validator.py):
``float('nan')`` compares false with every limit, so a hand-written ``value > limit`` lets it
through.  A stage that wants its own error type passes ``error=`` instead of wrapping.

``%`` (systemd specifiers) and ``$`` (variable expansion): systemd expands
``%h``, ``%n``... in most settings and ``$VAR`` in command lines.  Words of a
command line and ``Environment=`` assignments are quoted by
``_units.systemd_quote``, which doubles both (``%%``, ``$$``), and free text in
``Description=`` has ``%`` doubled; so these may contain them.  A value written
raw after ``Key=`` (image, paths, devices, ulimits, sizes, names) is *rejected*
when it contains ``%`` or ``$``: no legitimate value of those kinds has one, and
silently escaping would hide a typo such as ``%h`` that the user meant systemd
to expand.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Longest free-text value (one argv word, one environment value) accepted.
MAX_TEXT = 16384
# PATH_MAX is 4096 with the terminating NUL.
MAX_PATH = 4095
# IFNAMSIZ is 16 with the terminating NUL.
MAX_INTERFACE = 15
# systemd's UNIT_NAME_MAX is 256 with the terminating NUL.
MAX_UNIT = 255

# Control characters, format characters (bidi overrides, zero-width joiners),
# surrogates and Unicode line/paragraph separators: none belongs in a unit file.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# Characters systemd or Quadlet would interpret in a value written raw after Key=.
_RAW_SPECIAL = {
    "%": "a systemd specifier such as %h would be expanded",
    "$": "systemd would expand it as a variable in the generated command line",
    "\\": "systemd and Quadlet read backslashes as escapes or line continuations",
    '"': "Quadlet and systemd read quotes as word delimiters",
    "'": "Quadlet and systemd read quotes as word delimiters",
}

_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]{{1,5}})?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>[a-z0-9]+:[0-9a-f]{32,}))?"
)
_SHA256_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]+")
UNIT_SUFFIXES = (
    ".service", ".socket", ".target", ".mount", ".timer", ".path", ".slice", ".scope",
    ".device", ".swap", ".automount",
    # Quadlet source units
    ".container", ".volume", ".network", ".kube", ".image", ".pod", ".build",
)  # fmt: skip
_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTEGER = re.compile(r"[+-]?[0-9][0-9_]*")
_SIZE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>[kKmMgGtTpP]?[iI]?[bB]?)")
# A CDI device name, VENDOR/CLASS=NAME (the CDI parser's rules, pkg/parser/parser.go of
# github.com/cncf-tags/container-device-interface): nvidia.com/gpu=0, nvidia.com/gpu=all.
_CDI_PART = r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
_CDI_DEVICE = re.compile(rf"{_CDI_PART}/{_CDI_PART}=[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
# r, w and m, each at most once.
_DEVICE_PERMISSIONS = re.compile(r"(?!.*(.).*\1)[rwm]{1,3}")


class Error(Exception):
    """The collection's one error type: every error of plugins/module_utils derives from it.

    Its message says what failed (the variable, the file or the command) and the fix, so a
    module or a node program can catch this one type and show ``str()``.  A stage keeps its
    own subclass (``PreflightInputError``...) where a caller must tell errors apart; an error
    that was a ValueError or a RuntimeError stays one too (:class:`InputError`), so every
    ``except`` written before this base existed catches what it caught.
    """


class InputError(Error, ValueError):
    """A value that cannot be used (an option, a fact, a file's text); the message names it."""


class ValidationError(InputError):
    """A value that must not reach a unit file, a command line or a path.

    ``name`` is the variable (``vllm_recipe.served_model_name``), ``problem``
    what is wrong with the value, ``fix`` what to do; ``str()`` joins them.
    """

    def __init__(self, name: str, problem: str, fix: str) -> None:
        self.name = name
        self.problem = problem
        self.fix = fix
        super().__init__(f"{name}: {problem}; {fix}")


def _char_name(char: str) -> str:
    if char in "\n\r\x0b\x0c\x85\u2028\u2029":
        return "a line break"
    if char == "\x00":
        return "a NUL byte"
    if char.isspace():
        return "whitespace"
    category = unicodedata.category(char)
    if category == "Cf":
        return "an invisible formatting character"
    if category == "Cs":
        return "a lone surrogate (not valid UTF-8)"
    return "a control character"


def _first_bad(value: str, forbidden: str = "", whitespace: bool = False) -> int | None:
    for index, char in enumerate(value):
        if (
            char in forbidden
            or (whitespace and char.isspace())
            or unicodedata.category(char) in _FORBIDDEN_CATEGORIES
        ):
            return index
    return None


def _bad_char(name: str, value: str, index: int, why: str, fix: str) -> ValidationError:
    return ValidationError(name, f"contains {value[index]!r} ({why}) at position {index}", fix)


def text(
    name: str,
    value: Any,
    *,
    allow_empty: bool = False,
    max_length: int = MAX_TEXT,
    strip_ok: bool = True,
) -> str:
    """One line of printable text (an argv word, a served name, an environment value).

    Numbers and booleans become their text; lists, dicts and None are refused.
    ``strip_ok=False`` also refuses leading or trailing whitespace.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(name, f"{value!r} is not a finite number", "set a finite value")
    if isinstance(value, (bool, int, float)):
        try:
            value = str(value)
        except ValueError:  # an int of more than 4300 digits
            raise ValidationError(
                name, "is an absurdly large number", "set a sensible value"
            ) from None
    if not isinstance(value, str):
        raise ValidationError(
            name, f"expected text, got {type(value).__name__} {shown(value)}", "set a string"
        )
    if not value and not allow_empty:
        raise ValidationError(name, "is empty", "set a value")
    if len(value) > max_length:
        raise ValidationError(
            name, f"is {len(value)} characters long (at most {max_length})", "shorten it"
        )
    index = _first_bad(value)
    if index is not None:
        raise _bad_char(
            name,
            value,
            index,
            _char_name(value[index]),
            "remove it: a value that reaches a unit file or a command line is one line of "
            "printable text",
        )
    if not strip_ok and value != value.strip():
        index = 0 if value[0].isspace() else len(value) - 1
        raise _bad_char(
            name,
            value,
            index,
            "leading or trailing whitespace, which systemd strips",
            "remove the surrounding spaces",
        )
    return value


def systemd_value(
    name: str, value: Any, *, allow_empty: bool = False, max_length: int = MAX_TEXT
) -> str:
    """A value written raw after ``Key=`` in a unit file, read back exactly as written.

    No control characters, no leading/trailing whitespace (systemd strips it),
    no whitespace inside (Quadlet splits some keys on it) and none of
    ``% $ \\ " '`` (specifiers, variables, escapes, quotes; see the module doc).
    """
    value = text(name, value, allow_empty=allow_empty, max_length=max_length)
    index = _first_bad(value, "".join(_RAW_SPECIAL), whitespace=True)
    if index is not None:
        char = value[index]
        raise _bad_char(
            name,
            value,
            index,
            _RAW_SPECIAL.get(char) or _char_name(char),
            "remove it: this value is written as is into a unit file",
        )
    return value


def image_reference(name: str, value: Any, *, require_digest: bool = True) -> str:
    """A container image reference, ``[REGISTRY/]NAME[:TAG][@sha256:<64 hex>]``.

    With ``require_digest`` the reference must end in ``@sha256:`` and 64
    lower-case hex digits: the digest, not the tag, says what runs.
    """
    if value in (None, ""):
        raise ValidationError(name, "missing: not pinned by digest", "use NAME@sha256:<64 hex>")
    value = systemd_value(name, value, max_length=512)
    match = _IMAGE.fullmatch(value)
    if match is None:
        raise ValidationError(
            name,
            f"{value!r} is not an image reference",
            "use [REGISTRY/]NAME[:TAG]@sha256:<64 hex> (lower-case repository name)",
        )
    digest = match.group("digest")
    if require_digest and not (digest and _SHA256_DIGEST.fullmatch(digest)):
        raise ValidationError(name, f"{value}: not pinned by digest", "use NAME@sha256:<64 hex>")
    return value


def path(
    name: str,
    value: Any,
    *,
    under: tuple[str, ...] | list[str] = (),
    allow_empty: bool = False,
) -> str:
    """An absolute, normalised file-system path that can go into a unit file.

    Refuses relative paths, ``.`` and ``..`` components, ``//``, whitespace,
    control characters and ``: % $ \\ " '`` (``:`` separates Volume= fields).
    A single trailing ``/`` is dropped.  With ``under``, the path must be one of
    those roots or lie below one of them.
    """
    if allow_empty and value in (None, ""):
        return ""
    value = text(name, value, max_length=MAX_PATH)
    index = _first_bad(value, ":" + "".join(_RAW_SPECIAL), whitespace=True)
    if index is not None:
        char = value[index]
        why = "it separates the fields of Volume=" if char == ":" else None
        raise _bad_char(
            name,
            value,
            index,
            why or _RAW_SPECIAL.get(char) or _char_name(char),
            "use a path without it",
        )
    if not value.startswith("/"):
        raise ValidationError(name, f"{value!r} is not an absolute path", "start it with /")
    if len(value) > 1 and value.endswith("/"):
        value = value[:-1]
    parts = value.split("/")[1:]
    if value != "/" and any(part in ("", ".", "..") for part in parts):
        bad = next(part or "//" for part in parts if part in ("", ".", ".."))
        raise ValidationError(
            name,
            f"{value!r} is not normalised (contains {bad!r})",
            "write the path without '.', '..' or '//' components",
        )
    if under and not any(_is_under(value, root) for root in under):
        raise ValidationError(
            name,
            f"{value!r} is outside {', '.join(under)}",
            f"use a path under {' or '.join(under)}",
        )
    return value


def existing_directory(name: str, value: Any, *, must_exist: bool = True) -> str:
    """:func:`path` that names a directory (links followed): ``/sys``, ``/dev/shm``.

    A regular file there would be read as an empty tree, or measured as the file system that
    holds it, without a word.  ``must_exist=False`` lets an absent path through (a module that
    reports the absence itself).
    """
    value = path(name, value)
    if not os.path.isdir(value) and (must_exist or os.path.lexists(value)):
        what = "is not a directory" if os.path.lexists(value) else "does not exist"
        raise ValidationError(name, f"{value} {what}", "give an existing directory")
    return value


def _is_under(value: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return value == root or value.startswith(root if root == "/" else root + "/")


def is_under(value: str, roots: tuple[str, ...] | list[str]) -> bool:
    """Whether the (already validated) path ``value`` is one of ``roots`` or below one."""
    return any(_is_under(value, root) for root in roots)


def device(name: str, value: Any) -> str:
    """A device for Quadlet's ``AddDevice=`` (Podman's ``--device``): a CDI name or a node under /dev.

    ``VENDOR/CLASS=NAME`` (``nvidia.com/gpu=0``), or ``[-]HOST[:CONTAINER][:PERMISSIONS]``
    (podman-systemd.unit(5)) with ``HOST`` a normalised path under ``/dev``, ``CONTAINER``
    a normalised absolute path and ``PERMISSIONS`` of ``r``, ``w`` and ``m``; the ``-`` prefix
    adds the device only when the host has it.
    """
    value = systemd_value(name, value, max_length=MAX_PATH)
    if not value.startswith(("/", "-/")):
        if not _CDI_DEVICE.fullmatch(value):
            raise ValidationError(
                name,
                f"{value!r} is neither a CDI device name nor a device path under /dev",
                "name a CDI device such as nvidia.com/gpu=0 or a device node such as /dev/infiniband",
            )
        return value
    optional = "-" if value.startswith("-") else ""
    fields = value[len(optional) :].split(":")
    if len(fields) > 1 and _DEVICE_PERMISSIONS.fullmatch(fields[-1]):
        fields, permissions = fields[:-1], [fields[-1]]
    else:
        permissions = []
    if len(fields) > 2:
        raise ValidationError(
            name,
            f"{value!r} has more fields than HOST[:CONTAINER][:PERMISSIONS]",
            "write e.g. /dev/nvidia0 or /dev/nvidia0:/dev/nvidia0:rw (permissions of r, w, m)",
        )
    paths = [path(name, fields[0], under=("/dev",)), *(path(name, f) for f in fields[1:])]
    if paths[0] == "/dev":
        raise ValidationError(
            name, f"{value!r} hands over all of /dev", "name the device node, e.g. /dev/infiniband"
        )
    return optional + ":".join(paths + permissions)


def interface_name(name: str, value: Any) -> str:
    """A Linux network interface name: 1-15 bytes, no ``/``, ``:`` or whitespace, not ``.``/``..``."""
    value = text(name, value, max_length=64)
    index = _first_bad(value, "/:", whitespace=True)
    if index is not None:
        raise _bad_char(
            name,
            value,
            index,
            "the kernel refuses it in an interface name",
            "use the name `ip -o link` shows",
        )
    if value in (".", ".."):
        raise ValidationError(
            name, f"{value!r} is not an interface name", "use the name `ip -o link` shows"
        )
    if len(value.encode("utf-8")) > MAX_INTERFACE:
        raise ValidationError(
            name,
            f"{value!r} is longer than {MAX_INTERFACE} bytes (IFNAMSIZ)",
            "use the name `ip -o link` shows",
        )
    return value


def unit_name(name: str, value: Any, *, suffixes: tuple[str, ...] = UNIT_SUFFIXES) -> str:
    """A systemd unit name (``name[@instance].type``) that cannot be read as an option."""
    value = text(name, value, max_length=MAX_UNIT)
    if not _UNIT_NAME.fullmatch(value) or value.startswith(("-", ".", "@")):
        raise ValidationError(
            name,
            f"{value!r} is not a systemd unit name",
            "use letters, digits and : _ . @ - (not first), e.g. localinference-vllm.service",
        )
    if not value.endswith(suffixes) or value in suffixes:
        raise ValidationError(
            name, f"{value!r} has no unit type suffix", f"end it with one of {', '.join(suffixes)}"
        )
    return value


def host(name: str, value: Any, *, allow_empty: bool = False) -> str:
    """A host name (RFC 1123 labels; ``_`` tolerated, as in inventory names) or an IP address."""
    if allow_empty and value in (None, ""):
        return ""
    value = text(name, value, max_length=253)
    candidate = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        pass
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    bad = next((label for label in labels if not _HOST_LABEL.fullmatch(label)), None)
    if bad is None and labels[-1].isdigit():
        # 10.077.0.1 or 2130706433: not an IP address, and no host name is all digits.
        bad = labels[-1]
    if bad is not None:
        index = _first_bad(value, "/:%$\\\"'", whitespace=True)
        where = f" ({value[index]!r} at position {index})" if index is not None else ""
        raise ValidationError(
            name,
            f"{value!r} is neither an IP address nor a host name{where}",
            "use an address such as 10.77.0.11 or a name of letters, digits, '-' and '.'",
        )
    return value


def env_name(name: str, value: Any) -> str:
    """An environment variable name: a letter or ``_``, then letters, digits, ``_``."""
    value = text(name, value, max_length=255)
    if not _ENV_NAME.fullmatch(value):
        index = next(
            (i for i, c in enumerate(value) if not (c.isascii() and (c.isalnum() or c == "_"))), 0
        )
        raise _bad_char(
            name,
            value,
            index,
            "not allowed in an environment variable name",
            "use letters, digits and '_', not starting with a digit",
        )
    return value


def env_value(name: str, value: Any) -> str:
    """An environment value: one line of printable text (may be empty)."""
    return text(name, value, allow_empty=True)


def integer(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[Exception] = ValidationError,
    fix: str | None = None,
) -> int:
    """A whole number in ``[minimum, maximum]``; ``"4_096"`` reads as 4096, ``True`` and 4096.0 do not.

    ``error`` and ``fix``: see :func:`number`.
    """
    with _raising(error, fix):
        result: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            result = value
        elif isinstance(value, str) and len(value) <= 40 and _INTEGER.fullmatch(value.strip()):
            result = int(value.strip().replace("_", ""))
        if result is None:
            raise ValidationError(
                name, f"expected an integer, got {shown(value)}", "set a whole number"
            )
        _check_range(name, result, minimum, maximum)
    return result


def port(name: str, value: Any) -> int:
    """A TCP/UDP port, 1-65535."""
    return integer(name, value, minimum=1, maximum=65535)


def number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    error: type[Exception] = ValidationError,
    fix: str | None = None,
    text: bool = True,
) -> float:
    """A finite number in range (``above`` is an exclusive minimum); NaN and inf are refused.

    An int, a float or its text (``-e x=0.5`` arrives as text); never a bool.  ``error`` is the
    type raised (a stage's own, such as ``PreflightInputError``, so its callers' ``except`` need
    not change): a :class:`ValidationError` subclass gets name, problem and fix, any other type
    the joined message.  ``fix`` replaces the generic fix (``set a fraction such as 0.85``).
    ``text=False`` refuses text: a value that must be a number in the document it came from
    (an opencode config, the watchdog's JSON), where ``"4096"`` is a bug of its writer.
    """
    with _raising(error, fix):
        result: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                result = float(value)
            except OverflowError:
                result = math.inf
        elif isinstance(value, str) and text and len(value) <= 64:
            try:
                result = float(value.replace("_", ""))
            except ValueError:
                result = None
        if result is None:
            raise ValidationError(name, f"expected a number, got {shown(value)}", "set a number")
        if not math.isfinite(result):
            raise ValidationError(
                name, f"{shown(value)} is not a finite number", "set a finite number"
            )
        if above is not None and result <= above:
            raise ValidationError(
                name, f"{shown(value)} is not above {above}", f"set more than {above}"
            )
        _check_range(name, result, minimum, maximum, value)
    return result


# The largest whole number a float holds exactly: a "whole" float beyond it may be rounded.
MAX_EXACT = 2**53


def whole(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[Exception] = ValidationError,
    fix: str | None = None,
    text: bool = True,
) -> int:
    """A whole number that may arrive as a float or text (``4096``, ``4096.0``, ``'4096'``).

    YAML, JSON and Jinja give either, so a count read from them is checked here: an int is
    taken exactly; anything else is read by :func:`number` (NaN and infinity refused) and must
    have no fraction (``4096.5`` is refused, never truncated).  Either must be below 2**53:
    beyond, a float is not exact and no count this collection reads is that large.
    ``error``, ``fix`` and ``text``: see :func:`number`.
    """
    with _raising(error, fix):
        if isinstance(value, int) and not isinstance(value, bool):
            result = value
        else:
            as_float = number(name, value, text=text, fix="set a whole number")
            if not as_float.is_integer():
                raise ValidationError(
                    name, f"{shown(value)} is not a whole number", "set a whole number"
                )
            result = int(as_float)
        if abs(result) >= MAX_EXACT:
            raise ValidationError(
                name, f"{shown(value)} is 2**53 or more, too large for a count", "set a smaller number"
            )
        _check_range(name, result, minimum, maximum, value)
    return result


def counter(
    name: str,
    text: str,
    *,
    max_digits: int = 19,
    error: type[Exception] = ValidationError,
    fix: str = "expected decimal digits, as the kernel or the tool prints them",
) -> int:
    """A count a kernel or a tool printed (``/proc``, sysfs, nvidia-smi): ASCII digits only.

    Surrounding whitespace is ignored; a sign, a ``_``, a fraction, non-ASCII digits and more
    than ``max_digits`` digits (19: 2**63 has 19) are refused: such text is garbage, not a
    counter.  ``error``: see :func:`number`.
    """
    with _raising(error, None):
        value = text.strip() if isinstance(text, str) else ""
        if not value.isascii() or not value.isdigit():
            raise ValidationError(name, f"{shown(value[:40] if value else text)} is not a number", fix)
        if len(value) > max_digits:
            raise ValidationError(
                name, f"{value[:40]}... has {len(value)} digits, more than {max_digits}", fix
            )
    return int(value)


def finite(
    value: Any, *, minimum: float | None = None, above: float | None = None
) -> float | None:
    """``value`` as a float when it is a real, finite number in range; None otherwise.

    For figures a program wrote (a saved result, a measurement, a JSON document): an int or a
    float, never a bool or text; NaN, infinity or out of range means "no figure", not an error.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        result = float(value)
    except OverflowError:
        return None
    if not math.isfinite(result):
        return None
    if (minimum is not None and result < minimum) or (above is not None and result <= above):
        return None
    return result


def _check_range(
    name: str, result: float, minimum: float | None, maximum: float | None, given: Any = None
) -> None:
    value = result if given is None else given
    if minimum is not None and result < minimum:
        raise ValidationError(name, f"{shown(value)} is below {minimum}", f"set at least {minimum}")
    if maximum is not None and result > maximum:
        raise ValidationError(name, f"{shown(value)} is above {maximum}", f"set at most {maximum}")


@contextmanager
def _raising(error: type[Exception], fix: str | None) -> Iterator[None]:
    """A ValidationError raised inside, as ``error`` (with ``fix`` when given)."""
    try:
        yield
    except ValidationError as exc:
        found_fix = fix or exc.fix
        if issubclass(error, ValidationError):
            if type(exc) is error and fix is None:
                raise
            raise error(exc.name, exc.problem, found_fix) from None
        raise error(f"{exc.name}: {exc.problem}; {found_fix}") from None


def size(name: str, value: Any) -> str:
    """A memory size as Podman reads it (``1g``, ``512m``, ``1073741824``); never zero."""
    value = systemd_value(name, value, max_length=32)
    match = _SIZE.fullmatch(value)
    if match is None or float(match.group("number")) == 0:
        raise ValidationError(
            name,
            f"{value!r} is not a size",
            "write a positive number with an optional unit: 1g, 512m",
        )
    return value


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages."""
    try:
        text_ = repr(value)
    except ValueError:  # an int of more than 4300 digits
        return "a number of more than 4300 digits"
    return text_ if len(text_) <= limit else text_[: limit - 3] + "..."


# --- a role's table of inputs ----------------------------------------------------------------

# The kinds a role's input table may name, and the bounds each accepts.  None looks at a
# file system: the table is checked on the controller, the paths are the node's.
_TABLE_KINDS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "integer": (integer, ("minimum", "maximum")),
    "number": (number, ("minimum", "maximum", "above")),
    "port": (port, ()),
    "path": (path, ("under",)),
    "text": (text, ("allow_empty",)),
    "host": (host, ("allow_empty",)),
    "unit_name": (unit_name, ()),
    "interface_name": (interface_name, ()),
}


def table_errors(rows: Any) -> list[ValidationError]:
    """Check a role's inputs, one row each: ``{name, value, kind, [optional], [bounds...]}``.

    ``kind`` is one of ``_TABLE_KINDS`` (each a validator of this file); ``optional: true``
    lets ``None`` (an unset variable) through and nothing else: an explicit ``0``, ``false``
    or ``""`` is checked like any value, never taken for unset.  Returns every refusal, so a
    role reports all of its bad inputs at once.
    """
    if not isinstance(rows, list):
        raise TypeError(f"an input table is a list of rows, got {type(rows).__name__}")
    found = []
    for row in rows:
        if not isinstance(row, dict) or row.get("kind") not in _TABLE_KINDS or "name" not in row:
            raise TypeError(f"an input table row needs name and a known kind, got {shown(row)}")
        check, bounds = _TABLE_KINDS[row["kind"]]
        unknown = set(row) - {"name", "value", "kind", "optional", *bounds}
        if unknown:
            raise TypeError(f"{row['name']}: unknown keys {sorted(unknown)} for kind {row['kind']}")
        if row.get("value") is None and row.get("optional"):
            continue
        try:
            check(str(row["name"]), row.get("value"), **{k: row[k] for k in bounds if k in row})
        except ValidationError as exc:
            found.append(exc)
    return found
