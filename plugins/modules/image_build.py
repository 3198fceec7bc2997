#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: image_build
short_description: The recipe's derived image (vllm_recipe.build), built once on the head with Podman
version_added: 0.3.0
description:
  - The serve role's build step (roles/serve/tasks/build.yml). From the recipe's pinned base image
    and O(build) (files, patches, commands, prepended environment) it renders a Containerfile, builds
    it with C(podman build --pull=never --network=none) and labels and tags the image with the sha256
    of every input. From then on the recipe serves the built digest (RV(reference)).
  - An image carrying the same inputs hash is the build; an unchanged recipe builds nothing
    (C(changed=false)).
  - Every patch is applied to the base's own files (copied out of the base) strictly, before anything
    is built; a hunk that does not apply fails naming the recipe key, the file and the hunk. Nothing
    is built and nothing running is touched (fail closed).
  - O(state=pruned) removes built images beyond the O(keep) newest, never one in O(protect).
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
attributes:
  check_mode:
    support: full
    details: the patches are applied in memory and the Containerfile is rendered; nothing is built.
  diff_mode:
    support: full
    details: the Containerfile a build would use.
options:
  base:
    description: The base image, C(NAME[:TAG]@sha256:<64 hex>), already on this node.
    type: str
  build:
    description: The recipe's C(build) key (see recipes/README.md); checked here again.
    type: dict
  sources:
    description:
      - Where each O(build) source that is not C(model:) lies on this node (the role copies them
        here first), as C({src, on_host}) with C(src) exactly as in O(build); other keys are ignored.
    type: list
    elements: dict
    default: []
  model_dir:
    description: The pinned checkpoint's snapshot directory on this node (for C(model:) sources).
    type: str
    default: ""
  context_dir:
    description: Where the build contexts are written (one directory per inputs hash).
    type: str
    default: /var/lib/localinference/build
  state:
    description: C(present) builds when needed; C(pruned) removes old built images.
    type: str
    choices: [present, pruned]
    default: present
  keep:
    description: With O(state=pruned), how many of the newest built images stay.
    type: int
    default: 3
  protect:
    description: With O(state=pruned), references never removed (the serving and the last good image).
    type: list
    elements: str
    default: []
  podman:
    description: The podman program.
    type: str
    default: podman
  timeout:
    description: Seconds each podman command may take (the build included).
    type: int
    default: 3600
"""

EXAMPLES = r"""
- name: Build the derived image once on the head
  localinference.vllm.image_build:
    base: ghcr.io/anemll/dspark-vllm-gx10:0.1.1@sha256:a83948492cf13df455170fb42885f5ef4db54fefe0feff0f841ecbff464ac9d8
    build:
      files:
        - src: model:encoding/encoding_dsv4.py
          dest: /usr/local/lib/python3.12/dist-packages/vllm/tokenizers/deepseek_v4_encoding.py
    model_dir: /var/lib/localinference/models/models--deepseek-ai--DeepSeek-V4-Flash-0731/snapshots/9e165c30e2704aec5d9d593cce3eebd58bbef1cb
  register: built
"""

RETURN = r"""
reference:
  description:
    - The built image, C(localhost/localinference-vllm-built:<inputs>@sha256:<digest>).
    - In check mode before a build there is no digest yet; the inputs hash stands in for it (RV(digest) is empty).
  returned: state=present
  type: str
digest:
  description: The built image's manifest digest (empty in check mode before a build).
  returned: state=present
  type: str
inputs_hash:
  description: The sha256 of the base digest and every input (the image's label and tag).
  returned: state=present
  type: str
built:
  description: Whether this run built the image (check mode - whether it would).
  returned: state=present
  type: bool
build:
  description: The canonical build, with C(base) and the measured sha256 of every C(model:) file.
  returned: state=present
  type: dict
containerfile:
  description: The Containerfile this run built the image from (check mode - would build it from).
  returned: state=present and RV(built)
  type: str
removed:
  description: The built images O(state=pruned) removed (or would remove).
  returned: state=pruned
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _image_build_node


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            base=dict(type="str"),
            build=dict(type="dict"),
            sources=dict(type="list", elements="dict", default=[]),
            model_dir=dict(type="str", default=""),
            context_dir=dict(type="str", default="/var/lib/localinference/build"),
            state=dict(type="str", default="present", choices=["present", "pruned"]),
            keep=dict(type="int", default=3),
            protect=dict(type="list", elements="str", default=[]),
            podman=dict(type="str", default="podman"),
            timeout=dict(type="int", default=3600),
        ),
        required_if=[("state", "present", ("base", "build"))],
        supports_check_mode=True,
    )
    try:
        result = _image_build_node.run(module.params, module.check_mode)
    except (ValidationError, _image_build_node.BuildError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
