# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: stage_fingerprint
short_description: The sha256 of everything a stage's run depends on, computed on the controller
version_added: 0.2.0
description:
  - Hashes the values of every input of a role (each option of its C(meta/argument_specs.yml) entry
    point, as this run sees it), the collection's code (every file under C(plugins/) and C(roles/)),
    and O(extra).
  - A stage saves it as its result's inputs (M(localinference.vllm.stage_result)); a later run whose
    fingerprint is the same, on a node that still holds the watched files and units, has nothing to do
    (O(localinference.vllm.stage_result#module:state=converged)). Changing any role variable, upgrading
    the collection or changing what the stage reads makes the stage run again.
  - Options marked C(no_log) (an API key) are left out, so no digest of a secret is saved; the stage
    compares those on the node instead
    (O(localinference.vllm.stage_result#module:watch_secrets)).
options:
  _terms:
    description: The role's name (C(ingress), C(agent_client), ...).
    required: true
  extra:
    description: Other values the run depends on that are not role options (the model and revision taken from the recipe).
    type: raw
    default: null
  files:
    description:
      - Files on the controller the run depends on or wrote (a config, a key file, a program - a bare
        command name is looked up in C(PATH)). Each is identified by its real path, size, modification
        time and inode, never by its content, so a key file leaves no digest of the key and a
        large program costs no hashing; a missing file counts as such.
    type: list
    elements: str
    default: []
  entry_point:
    description: The argument specs' entry point whose options are the role's inputs.
    type: str
    default: main
  exclude:
    description:
      - Options that ask for an action rather than describe the result (C(ingress_rotate_key)) are left out,
        so the run after the action finds nothing to do.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Nothing to do when the saved result still holds
  localinference.vllm.stage_result:
    stage: weights
    state: converged
    fingerprint: "{{ lookup('localinference.vllm.stage_fingerprint', 'model_weights', extra=[model_id, revision]) }}"
"""

RETURN = r"""
_raw:
  description: One sha256 hex digest.
  type: list
  elements: str
"""

import functools
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    StageResultError,
    inputs_hash,
)

COLLECTION = Path(__file__).resolve().parents[2]
# libyaml's safe loader when PyYAML has it (8x faster on the serve role's specs): a lookup
# runs in each task's worker process, so nothing it parses is kept from one task to the next.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CODE_DIRS = ("plugins", "roles")


@functools.lru_cache(maxsize=1)
def code_digest(root: Path = COLLECTION) -> str:
    """sha256 over the collection's plugins and roles (path and content of each file)."""
    digest = hashlib.sha256()
    for top in CODE_DIRS:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def role_inputs(role: str, entry_point: str = "main", root: Path = COLLECTION) -> tuple[str, ...]:
    """The option names of a role's argument specs entry point, less its no_log ones."""
    spec = root / "roles" / role / "meta" / "argument_specs.yml"
    try:
        doc = yaml.load(spec.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
        options = doc["argument_specs"][entry_point].get("options") or {}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise AnsibleLookupError(
            f"stage_fingerprint: no argument specs {entry_point!r} for role {role!r}: {exc}"
        ) from None
    return tuple(sorted(name for name, spec in options.items() if not (spec or {}).get("no_log")))


def file_identity(name: str) -> dict[str, Any] | None:
    """Real path, size, mtime (ns) and inode of a controller file (a bare name is looked up in PATH)."""
    path = os.path.expanduser(name)
    if os.sep not in path:
        path = shutil.which(path) or path
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return {"path": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[str]:
        unknown = sorted(set(kwargs) - {"extra", "entry_point", "files", "exclude"})
        if unknown:
            raise AnsibleLookupError(
                f"stage_fingerprint: unknown option {', '.join(unknown)} (extra, files, entry_point, exclude)"
            )
        exclude = kwargs.get("exclude") or []
        if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
            raise AnsibleLookupError(f"stage_fingerprint: exclude must be a list of option names, got {exclude!r}")
        files = kwargs.get("files") or []
        if not isinstance(files, list) or not all(isinstance(f, str) and f and "\n" not in f for f in files):
            raise AnsibleLookupError(f"stage_fingerprint: files must be a list of paths, got {files!r}")
        if len(terms) != 1 or not isinstance(terms[0], str) or not terms[0].replace("_", "").isalnum():
            raise AnsibleLookupError(f"stage_fingerprint takes one role name, got {terms!r}")
        role = terms[0]
        variables = variables or {}
        names = [
            name
            for name in role_inputs(role, kwargs.get("entry_point", "main"))
            if name in variables and name not in exclude
        ]
        values = self._templar.template({name: variables[name] for name in names})
        try:
            return [
                inputs_hash(
                    {
                        "role": role,
                        "inputs": values,
                        "code": code_digest(),
                        "extra": kwargs.get("extra"),
                        "files": {name: file_identity(name) for name in files},
                    }
                )
            ]
        except StageResultError as exc:
            raise AnsibleLookupError(f"stage_fingerprint({role}): {exc}") from None
