# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The recipe's image on one node (module_utils/serve/_image_apply.py), with a stand-in podman.

What Podman says about an image is read once per reference (garbage or a failure is "not
there"); a podman step that fails ends with the tail of its output; a tag alone is refused
unless allowed. The argv and the judgement are test_image.py's; the whole module with a
stand-in podman is tests/unit/plugins/modules/test_container_image*.py's.
"""

from __future__ import annotations

import json

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import Runner
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _image_apply
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit

DIGEST = "sha256:" + "ab" * 32


def podman(tmp_path, body: str) -> str:
    script = tmp_path / "podman"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    ("body", "present", "digest"),
    [
        (f"cat <<'EOF'\n{json.dumps([{'Id': 'i', 'Digest': DIGEST}])}\nEOF\n", True, DIGEST),
        ("echo 'not json'\n", False, ""),
        ("echo 'Error: image not known' >&2\nexit 125\n", False, ""),
    ],
    ids=["inspected", "garbage", "not on the node"],
)
def test_what_podman_says_of_an_image(tmp_path, body, present, digest):
    copy = _image_apply._copy(Runner(10), podman(tmp_path, body), "localhost/x:1")
    assert (copy["present"], copy["digest"]) == (present, digest)


def test_a_failed_step_ends_with_the_tail_of_its_output(tmp_path):
    argv = [podman(tmp_path, "echo 'Error: writing blob: no space left on device' >&2\nexit 125\n"), "load"]
    with pytest.raises(_image_apply.ImageError) as caught:
        _image_apply._must(Runner(10), argv, "podman load of /srv/x.tar")
    assert str(caught.value) == "podman load of /srv/x.tar failed (rc 125): Error: writing blob: no space left on device"


def params(tmp_path, **given) -> dict:
    base = {"image": f"localhost/localinference-vllm-cpu@{DIGEST}", "image_name": "vllm_recipe.image",
            "allow_unpinned": False, "state": "facts", "archive": None, "archive_name": "serve_image_archive",
            "remove_archive": False, "cache_dir": str(tmp_path / "images"), "podman": podman(tmp_path, "exit 125\n"),
            "skopeo": "skopeo", "timeout": 30, "require": False, "host": "spark-head"}
    return {**base, **given}


def test_a_pinned_reference_is_split_and_a_tag_alone_needs_allow_unpinned(tmp_path):
    name, digest, unpinned = _image_apply._checked(params(tmp_path))
    assert (name, digest, unpinned) == ("localhost/localinference-vllm-cpu", DIGEST, False)
    with pytest.raises(ModuleExit) as caught:
        _image_apply.run(FakeModule(params(tmp_path, image="localhost/localinference-vllm-cpu:latest")))
    assert caught.value.result["msg"].startswith("vllm_recipe.image")


def test_facts_of_an_image_not_on_the_node_change_nothing(tmp_path):
    out = _image_apply.run(FakeModule(params(tmp_path)))
    assert out["changed"] is False and out["action"] == "none"
    assert out["pinned"]["present"] is False and out["resolved"] == f"localhost/localinference-vllm-cpu@{DIGEST}"
