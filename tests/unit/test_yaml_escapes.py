# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""No ``\\n`` inside a Jinja expression written in a YAML block scalar (``>-``, ``|``).

In a double-quoted YAML string ``"{{ x.rstrip('\\n') }}"`` YAML makes the ``\\n`` a
newline before Jinja sees it. In a block scalar YAML leaves the backslash there, and
Ansible's templating (2.19) does not unescape it either: ``rstrip('\\n')`` then strips
trailing backslashes and ``n``s, never the newline. That is how the ingress key's
newline survived into a ``no_log`` option, which Ansible masks only where it is logged
verbatim, and the key reached the head's journal (caught by
tests/lab/state/test_ingress.py). Every playbook, task and variable file is scanned.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLACES = ("playbooks", "roles", "molecule", "inventories", "recipes")
JINJA = re.compile(r"{{.*?}}|{%.*?%}", re.S)
ESCAPE = re.compile(r"\\[ntr]")


def block_scalars(node: yaml.Node):
    if isinstance(node, yaml.ScalarNode):
        if node.style in ("|", ">"):
            yield node
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from block_scalars(item)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from block_scalars(key)
            yield from block_scalars(value)


def escapes_in_jinja(text: str) -> list[str]:
    return [m.group(0) for m in JINJA.finditer(text) if ESCAPE.search(m.group(0))]


def yaml_files() -> list[Path]:
    return sorted(
        path
        for place in PLACES
        for path in (ROOT / place).rglob("*.y*ml")
        if path.suffix in (".yml", ".yaml")
    )


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("key: >-\n  {{ x.rstrip('\\n') }}\n", True),
        ("key: |\n  {{ x | join('\\n') }}\n", True),
        ("key: \"{{ x.rstrip('\\n') }}\"\n", False),  # double-quoted: YAML unescapes it
        ("key: >-\n  {{ x | trim }}\n  a literal \\n outside Jinja\n", False),
    ],
)
def test_the_scan_finds_an_escape_only_in_a_block_scalars_jinja(text, found):
    hits = [hit for node in block_scalars(yaml.compose(text)) for hit in escapes_in_jinja(node.value)]
    assert bool(hits) is found


def test_no_jinja_escape_in_a_block_scalar():
    files = yaml_files()
    assert len(files) > 50, "the scan found too few files to mean anything"
    offenders = []
    for path in files:
        for document in yaml.compose_all(path.read_text(), Loader=yaml.SafeLoader):
            if document is None:
                continue
            for node in block_scalars(document):
                for hit in escapes_in_jinja(node.value):
                    line = node.start_mark.line + 1
                    offenders.append(f"{path.relative_to(ROOT)}:{line}: {hit[:120]}")
    assert not offenders, (
        "a \\n in a block scalar's Jinja stays a backslash and a letter; write the value"
        " double-quoted, or use trim / splitlines:\n" + "\n".join(offenders)
    )
