#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: model_manifest
short_description: Create or verify a sha256 manifest of a model snapshot
version_added: 0.2.0
description:
  - With O(mode=create), records every regular file of a model snapshot (relative path, size,
    modification time, sha256) in a JSON manifest beside the snapshot, and checks the header of every
    C(.safetensors) file (header length, JSON, dtypes, shapes, and that the tensors cover the data
    section exactly, so a truncated file is caught).
  - With O(mode=verify), checks a node's copy against a manifest and reports each missing, truncated or
    corrupted file in RV(mismatched). It does not fail on a mismatch; the caller decides (the
    P(localinference.vllm.model_weights#role) role re-syncs and verifies again).
  - Fast path. A file whose size and modification time equal the manifest's is trusted and not read,
    so a re-run over an unchanged snapshot hashes nothing (RV(hashed) is V(0)). O(full=true) hashes
    every file; only that catches a byte changed in place with size and mtime kept.
  - Files are hashed in parallel threads (sha256 releases the interpreter lock while it digests).
  - When a snapshot file is a link into a Hugging Face cache blob named by its sha256, O(mode=create)
    also checks the content against that name.
  - Fails closed on an incomplete snapshot. A dangling link (a shard never downloaded, a blob deleted)
    or a link loop is reported once in RV(mismatched) with its path, and RV(ok) is V(false), in both
    modes; a directory link that leads back above itself is never entered.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes.CHANGES
options:
  path:
    description:
      - The snapshot directory, for example V(/srv/models/hub/models--org--name/snapshots/<revision>).
    type: path
    required: true
  mode:
    description:
      - V(create) writes (or refreshes) the manifest from the files in O(path).
      - V(verify) checks the files in O(path) against the manifest and changes nothing, except restoring
        the recorded modification time of a file whose content was hashed and matched.
    type: str
    choices: [create, verify]
    required: true
  manifest:
    description:
      - Path of the manifest file.
      - Defaults to C(<repo>/localinference-manifests/<revision>.json), where C(<repo>) is the
        directory that holds C(snapshots/).
    type: path
  manifest_content:
    description:
      - The manifest itself (as returned in RV(manifest_content) by O(mode=create) on another node), for
        O(mode=verify) on a node that has no copy of the file yet. Takes precedence over O(manifest).
    type: dict
  full:
    description:
      - Hash every file instead of trusting size and modification time.
    type: bool
    default: false
  paths:
    description:
      - With O(mode=verify), check only these relative paths (for example the files just repaired).
    type: list
    elements: str
  workers:
    description:
      - Files hashed at once, at most 256. V(0) uses one thread per CPU (at most 16).
    type: int
    default: 0
  drop_cache:
    description:
      - Release each file's pages from the page cache after hashing it, so a verification of a large
        checkpoint does not crowd out memory (on unified-memory nodes the page cache competes with GPU
        allocations).
    type: bool
    default: true
  model:
    description:
      - Model id recorded in a created manifest.
    type: str
  revision:
    description:
      - Revision recorded in a created manifest.
    type: str
notes:
  - Hidden files (names starting with a dot, such as rsync's temporary files) are not part of a snapshot.
  - A manifest read from a file or from O(manifest_content) is schema-checked (paths relative and
    normalised, sizes and times non-negative integers, sha256 as 64 hex digits, no path twice).
seealso:
  - name: safetensors format
    description: The header layout checked by this module.
    link: https://huggingface.co/docs/safetensors/index
"""

EXAMPLES = r"""
- name: Record the head's snapshot
  localinference.vllm.model_manifest:
    path: /srv/models/hub/models--org--name/snapshots/5eed0c0ffee0000000000000000000000000000a
    mode: create
    model: org/name
    revision: 5eed0c0ffee0000000000000000000000000000a
  register: head_manifest

- name: Check a worker's copy against the head's manifest (fast path)
  localinference.vllm.model_manifest:
    path: /srv/models/hub/models--org--name/snapshots/5eed0c0ffee0000000000000000000000000000a
    mode: verify
    manifest_content: "{{ hostvars[groups['vllm_head'][0]].head_manifest.manifest_content }}"
  register: worker_copy

- name: Hash everything
  localinference.vllm.model_manifest:
    path: /srv/models/hub/models--org--name/snapshots/5eed0c0ffee0000000000000000000000000000a
    mode: verify
    full: true
"""

RETURN = r"""
ok:
  description: True when no file is missing, truncated, corrupted, malformed, a dangling link or a link loop.
  returned: always
  type: bool
msg:
  description: One line naming the mismatched files and why (the first ten), when RV(ok) is false.
  returned: when RV(ok) is false
  type: str
  sample: "1 file(s) do not match: model-00002.safetensors (dangling symlink to ../../blobs/ab12...)"
mismatched:
  description: Files that do not match, sorted by path.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Path relative to O(path).
      type: str
    reason:
      description: Why, for example C(missing), C(size 10 differs from 20), C(sha256 ... differs from ...).
      type: str
    size:
      description: Size the manifest records (bytes to copy to repair it); absent in O(mode=create).
      type: int
  sample: [{"path": "model.safetensors", "reason": "missing", "size": 1048576}]
hashed:
  description: How many files were read and hashed in this run; V(0) when the fast path trusted all.
  returned: always
  type: int
hashed_bytes:
  description: Bytes read and hashed in this run.
  returned: always
  type: int
files:
  description: Files in the manifest.
  returned: always
  type: int
total_bytes:
  description: Bytes of all files in the manifest.
  returned: always
  type: int
missing_bytes:
  description: Bytes of the mismatched files, that is what a repair has to copy.
  returned: always
  type: int
disk_free_bytes:
  description: Free bytes on the filesystem that holds (or would hold) O(path).
  returned: always
  type: int
extra:
  description: With O(mode=verify), files present in O(path) that the manifest does not list.
  returned: always
  type: list
  elements: str
manifest:
  description: Path of the manifest file.
  returned: always
  type: str
manifest_content:
  description: The manifest document (format, model, revision, file_count, total_bytes, files).
  returned: when O(mode=create) and RV(ok), or O(mode=verify)
  type: dict
elapsed_seconds:
  description: Wall time spent listing and hashing.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.weights._manifest_apply import run


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "mode": {"type": "str", "choices": ["create", "verify"], "required": True},
            "manifest": {"type": "path"},
            "manifest_content": {"type": "dict"},
            "full": {"type": "bool", "default": False},
            "paths": {"type": "list", "elements": "str"},
            "workers": {"type": "int", "default": 0},
            "drop_cache": {"type": "bool", "default": True},
            "model": {"type": "str"},
            "revision": {"type": "str"},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
