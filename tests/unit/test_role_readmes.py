# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every role's README has one shape, and its variables table is the role's argument specs.

The six sections, in this order and with exactly these headings: what the role does, its
variables, its results, the files it writes, an example, what it refuses. The `## Variables`
section holds a table `| variable | default | meaning |` with one row per option of every entry
point of `meta/argument_specs.yml` (the first cell is the option as `` `name` ``), and no row for
anything else, so a variable cannot be added to the specs without its row, nor documented here
without being validated there. `defaults/main.yml` declares nothing the specs lack (a default
outside them would be an input no entry point checks), and where it gives a plain value (a
number, a boolean, a string without a template, an empty list or mapping, null) the first code span
of the row's default cell is that value, so the table cannot drift from the defaults either. Only
top-level options are rows; sub-options are described in their option's meaning.
Longer explanations live in docs/ and are linked from the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())
SECTIONS = ["What it does", "Variables", "Results", "Files it writes", "Example", "Refuses"]
TABLE_HEADER = ["variable", "default", "meaning"]
NAME_CELL = re.compile(r"`([a-z][a-z0-9_]*)`")
CODE_SPAN = re.compile(r"`([^`]*)`")


def _readme(role: str) -> list[str]:
    return (ROOT / "roles" / role / "README.md").read_text(encoding="utf-8").splitlines()


def _outside_code(lines: list[str]) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a shell example is no heading)."""
    kept, fenced = [], False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return kept


def _sections(role: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in _outside_code(_readme(role)):
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return sections


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _variables_table(role: str) -> list[list[str]]:
    """The rows of the `| variable | default | meaning |` table in `## Variables`."""
    lines = _sections(role).get("Variables", [])
    for i, line in enumerate(lines):
        if line.startswith("|") and _cells(line) == TABLE_HEADER:
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(_cells(row))
            return rows
    raise AssertionError(f"roles/{role}/README.md: no `| variable | default | meaning |` table under ## Variables")


def _spec_options(role: str) -> dict[str, list[str]]:
    """Every option of every entry point, with the entry points that take it."""
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options: dict[str, list[str]] = {}
    for entry_point, spec in specs["argument_specs"].items():
        for name in spec.get("options") or {}:
            options.setdefault(name, []).append(entry_point)
    return options


def _defaults(role: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}


def _plain(value: object) -> str | None:
    """A default as the table writes it, or None when it is not a plain value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return None if "{{" in value else (value or '""')
    if value in ([], {}):
        return "[]" if isinstance(value, list) else "{}"
    return None


def test_every_role_is_checked() -> None:
    assert len(ROLES) == 12, ROLES


@pytest.mark.parametrize("role", ROLES)
def test_the_readme_has_the_six_sections_in_order(role: str) -> None:
    headings = [line[3:].strip() for line in _outside_code(_readme(role)) if line.startswith("## ")]
    assert headings == SECTIONS, f"roles/{role}/README.md: ## headings {headings}, expected {SECTIONS}"
    titles = [line for line in _outside_code(_readme(role)) if line.startswith("# ")]
    assert titles == [f"# Role `localinference.vllm.{role}`"], titles


@pytest.mark.parametrize("role", ROLES)
def test_the_variables_table_is_the_argument_specs(role: str) -> None:
    rows = _variables_table(role)
    named = []
    for row in rows:
        assert len(row) == 3, f"roles/{role}/README.md: a row of three cells, got {row}"
        match = NAME_CELL.fullmatch(row[0])
        assert match, f"roles/{role}/README.md: the first cell names one variable as `name`, got {row[0]!r}"
        assert row[2], f"roles/{role}/README.md: `{match.group(1)}` has no meaning"
        named.append(match.group(1))
    duplicates = sorted({name for name in named if named.count(name) > 1})
    assert not duplicates, f"roles/{role}/README.md: rows named twice: {duplicates}"
    options = _spec_options(role)
    missing = sorted(set(options) - set(named))
    assert not missing, f"roles/{role}/README.md: options of meta/argument_specs.yml without a row: {missing}"
    unknown = sorted(set(named) - set(options))
    assert not unknown, f"roles/{role}/README.md: rows for variables meta/argument_specs.yml lacks: {unknown}"


@pytest.mark.parametrize("role", ROLES)
def test_the_defaults_are_specified_and_tabled(role: str) -> None:
    options = _spec_options(role)
    defaults = _defaults(role)
    unspecified = sorted(set(defaults) - set(options))
    assert not unspecified, f"roles/{role}/defaults/main.yml: not in meta/argument_specs.yml: {unspecified}"
    cells = {NAME_CELL.fullmatch(row[0]).group(1): row[1] for row in _variables_table(role)}
    for name, value in defaults.items():
        plain = _plain(value)
        if plain is None:
            continue
        assert name in cells, f"roles/{role}/README.md: no row for `{name}` (defaults/main.yml)"
        first = CODE_SPAN.search(cells[name])
        assert first and first.group(1) == plain, (
            f"roles/{role}/README.md: `{name}`'s default cell {cells[name]!r} does not start with `{plain}`"
            " (defaults/main.yml)"
        )
