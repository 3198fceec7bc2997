#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: container_image
short_description: The serving image on a node, by digest - looked at, loaded, pulled or exported as an OCI archive
version_added: 0.2.0
description:
  - The serve role's image step (roles/serve/tasks/image.yml). The image is pinned by digest; the
    head gets it once (from O(archive), an OCI archive for air-gapped sites, or pulled), writes an OCI
    archive that keeps the digest, and every other node loads that archive, copied over the cluster
    link. Each node's copy is then verified by digest.
  - O(state=facts) only looks (RV(pinned), RV(named)). O(state=present) loads O(archive) or pulls
    when the node has no image with the digest, then checks the digest. O(state=exported) makes sure
    an OCI archive with the pinned digest exists on the node (RV(path)).
  - Every refusal names the variable (O(image_name), O(archive_name)) and the fix; an archive is
    checked (an OCI archive of the pinned digest) before anything is loaded.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
options:
  image:
    description:
      - The image, C(NAME[:TAG]@sha256:<64 hex>).
      - A tag alone only with O(allow_unpinned=true).
    type: str
    required: true
  allow_unpinned:
    description:
      - Accept O(image) without a digest (the serve role's C(serve_allow_unpinned_image)) and resolve it
        here to the digest it names - the digest of O(archive) when given; else, for O(state=present),
        the tag is pulled (every run, as it may have moved) and the node's copy read; for O(state=facts) the
        node's copy is read. From there on the module works with RV(resolved), as with a pinned image.
      - The result says so in RV(findings), a warning C(image_unpinned) with the digest to pin. In check
        mode nothing is pulled, so a tag the node does not have yet is refused (its digest is unknown).
      - V(false) refuses a tag alone, naming O(image_name) and C(serve_allow_unpinned_image).
    type: bool
    default: false
  image_name:
    description: The variable the image came from, for messages.
    type: str
    default: vllm_recipe.image
  state:
    description: C(facts), C(present) or C(exported).
    type: str
    default: facts
    choices: [facts, present, exported]
  archive:
    description:
      - An OCI archive of the image on this node. O(state=present) loads it when the image is
        missing; O(state=exported) returns it as RV(path). Checked first either way.
    type: path
  archive_name:
    description: The variable the archive came from, for messages.
    type: str
    default: serve_image_archive
  remove_archive:
    description: Delete O(archive) once it is loaded (a copy made for this node).
    type: bool
    default: false
  cache_dir:
    description: Where O(state=exported) writes the archive (one file per digest).
    type: path
    default: /var/lib/localinference/images
  podman:
    description: The podman binary.
    type: str
    default: podman
  skopeo:
    description: >-
      The skopeo binary: O(state=exported) fetches a pulled image's original layers with it when
      C(podman save) cannot keep the digest (absent: that case is refused with the fix).
    type: str
    default: skopeo
  timeout:
    description: Seconds each pull, load, save or copy may take.
    type: int
    default: 3600
  require:
    description: >-
      Fail, naming O(host), when the node has no image with the pinned digest (after O(state)'s
      work; in check mode a load or pull that would happen counts as done).
    type: bool
    default: false
  host:
    description: The node's name in messages.
    type: str
    default: this node
"""

EXAMPLES = r"""
- name: Resolve a tag once on the head and serve the digest it names now
  localinference.vllm.container_image:
    image: docker.io/vllm/vllm-openai:v0.32.0
    allow_unpinned: true
    state: present
  register: head_image
  # head_image.resolved: docker.io/vllm/vllm-openai:v0.32.0@sha256:...

- name: Load the image the head copied here, then check its digest
  localinference.vllm.container_image:
    image: registry.example/vllm/vllm-openai@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    state: present
    archive: /var/lib/localinference/images/sha256-0123....oci.tar
    remove_archive: true
"""

RETURN = r"""
pinned:
  description: The node's image under the pinned reference (present, id, digest, digests, tags).
  type: dict
  returned: always
named:
  description: The node's image under the reference's name alone (another digest shows here).
  type: dict
  returned: always
action:
  description: What was done or would be done (none, loaded, pulled, saved, fetched).
  type: str
  returned: always
path:
  description: The OCI archive with the pinned digest (O(state=exported)).
  type: str
  returned: when state is exported
resolved:
  description: >-
    The reference by digest the module worked with, C(NAME[:TAG]@sha256:<64 hex>): O(image) itself, or
    with O(allow_unpinned) the digest its tag resolved to (empty when the node has no copy to read).
  type: str
  returned: always
findings:
  description: With O(allow_unpinned) and a tag alone, the warning C(image_unpinned) (id, severity, message, fix).
  type: list
  elements: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.serve._image_apply import run


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            image=dict(type="str", required=True),
            image_name=dict(type="str", default="vllm_recipe.image"),
            allow_unpinned=dict(type="bool", default=False),
            state=dict(type="str", default="facts", choices=["facts", "present", "exported"]),
            archive=dict(type="path"),
            archive_name=dict(type="str", default="serve_image_archive"),
            remove_archive=dict(type="bool", default=False),
            cache_dir=dict(type="path", default="/var/lib/localinference/images"),
            podman=dict(type="str", default="podman"),
            skopeo=dict(type="str", default="skopeo"),
            timeout=dict(type="int", default=3600),
            require=dict(type="bool", default=False),
            host=dict(type="str", default="this node"),
        ),
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
