# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""container_image end to end against a stand-in podman with a store in a JSON file.

The stand-in answers only the argv the module must issue (``image inspect
--format json``, ``load --quiet --input``, ``save --quiet --uncompressed --format
oci-archive --output``, ``pull --quiet``) and exits 99 on any other, so a
changed command line fails here. Its ``load`` reads the archive's index.json as
Podman does; its ``save`` writes the digest the store has (or another one, as
Podman does for a pulled image whose layers it compresses anew); its ``pull`` finds
only what the store's ``registry`` lists (a reference and the digest it names now) and
moves a pulled tag to that image.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.modules import container_image
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module
from ansible_collections.localinference.vllm.tests.unit.plugins.module_utils.serve.test_image import (
    write_archive,
)

A, B = "a1" * 32, "b2" * 32
IMAGE = f"localhost/vllm:0.32.0@sha256:{A}"

PODMAN = r"""
import io, json, os, sys, tarfile
store_path = os.environ["FAKE_STORE"]
store = json.load(open(store_path)) if os.path.exists(store_path) else {"images": [], "save_digest": None}
args = sys.argv[1:]
with open(store_path + ".argv", "a") as log:
    log.write(json.dumps(args) + "\n")
def find(ref):
    name, _, digest = ref.partition("@")
    for image in store["images"]:
        if digest and image["Digest"] == digest:
            return image
        if not digest and name in image["RepoTags"]:
            return image
if args[:3] == ["image", "inspect", "--format"] and args[3] == "json" and len(args) == 5:
    image = find(args[4])
    print(json.dumps([image] if image else []))
    sys.exit(0 if image else 125)
if args[:3] == ["load", "--quiet", "--input"] and len(args) == 4:
    with tarfile.open(args[3]) as tar:
        digest = json.load(tar.extractfile("index.json"))["manifests"][0]["digest"]
    store["images"].append({"Id": "i-" + digest[7:15], "Digest": digest, "RepoTags": ["localhost/vllm:0.32.0"]})
elif args[:5] == ["save", "--quiet", "--uncompressed", "--format", "oci-archive"] and args[5] == "--output":
    digest = store.get("save_digest") or find(args[7])["Digest"]
    with tarfile.open(args[6], "w") as tar:
        for name, data in {"oci-layout": "{}", "index.json": json.dumps({"manifests": [{"digest": digest}]})}.items():
            info = tarfile.TarInfo(name); info.size = len(data); tar.addfile(info, io.BytesIO(data.encode()))
elif args[:2] == ["pull", "--quiet"] and len(args) == 3 and args[2] in store.get("registry", {}):
    digest = store["registry"][args[2]]
    for image in store["images"]:
        if args[2] in image["RepoTags"]:
            image["RepoTags"].remove(args[2])
    found = find("x@" + digest)
    if found:
        found["RepoTags"].append(args[2])
    else:
        store["images"].append({"Id": "i-" + digest[7:15], "Digest": digest, "RepoTags": [args[2]]})
    print("i-" + digest[7:15])
elif args[:2] == ["pull", "--quiet"]:
    print("Error: initializing source docker://x: no registry reachable", file=sys.stderr)
    sys.exit(125)
else:
    print("unexpected argv", args, file=sys.stderr)
    sys.exit(99)
json.dump(store, open(store_path, "w"))
"""


@pytest.fixture
def node(tmp_path, monkeypatch):
    podman = tmp_path / "podman"
    podman.write_text(f"#!{sys.executable}\n{PODMAN}")
    podman.chmod(podman.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_STORE", str(tmp_path / "store.json"))

    class Node:
        def __init__(self) -> None:
            self.root = tmp_path
            self.args = {
                "image": IMAGE,
                "podman": str(podman),
                "cache_dir": str(tmp_path / "images"),
                "timeout": 30,
            }

        def store(self, images=(), save_digest=None, registry=None):
            Path(os.environ["FAKE_STORE"]).write_text(
                json.dumps(
                    {"images": list(images), "save_digest": save_digest, "registry": registry or {}}
                )
            )

        def ran(self):
            path = Path(os.environ["FAKE_STORE"] + ".argv")
            return (
                [json.loads(line)[0] for line in path.read_text().splitlines()]
                if path.exists()
                else []
            )

    return Node()


def _archive(node, digest=A):
    path = node.root / "vllm.oci.tar"
    write_archive(
        path, {"oci-layout": "{}", "index.json": {"manifests": [{"digest": f"sha256:{digest}"}]}}
    )
    return str(path)


def test_loads_the_archive_once_then_does_nothing(node):
    node.store()
    args = {
        **node.args,
        "state": "present",
        "archive": _archive(node),
        "require": True,
        "host": "spark-head",
    }
    first = run_module(container_image, args)
    assert not first.failed and first.result["changed"] and first.result["action"] == "loaded"
    assert first.result["pinned"]["digest"] == f"sha256:{A}"
    second = run_module(container_image, args)
    assert not second.result["changed"] and second.result["action"] == "none"
    assert node.ran().count("load") == 1


def test_check_mode_loads_nothing(node):
    node.store()
    args = {**node.args, "state": "present", "archive": _archive(node), "require": True}
    result = run_module(container_image, args, check_mode=True)
    assert not result.failed and result.result["action"] == "loaded"
    assert "load" not in node.ran()


def test_archive_of_another_image_is_refused_before_any_load(node):
    node.store()
    args = {**node.args, "state": "present", "archive": _archive(node, digest=B)}
    result = run_module(container_image, args)
    assert result.failed
    assert result.result["msg"].startswith("serve_image_archive: ")
    assert f"holds the image sha256:{B}" in result.result["msg"]
    assert node.ran() == []


def test_worker_with_another_digest_is_refused_by_name(node):
    node.store([{"Id": "i-other", "Digest": f"sha256:{B}", "RepoTags": ["localhost/vllm:0.32.0"]}])
    result = run_module(container_image, {**node.args, "require": True, "host": "spark-worker"})
    assert result.failed
    assert result.result["msg"].startswith(
        "vllm_recipe.image: spark-worker has localhost/vllm:0.32.0 with digest "
    )
    assert f"sha256:{B}, not sha256:{A}" in result.result["msg"]
    assert result.result["findings"][0]["host"] == "spark-worker"


def test_no_registry_names_the_archive_variable(node):
    node.store()
    result = run_module(container_image, {**node.args, "state": "present"})
    assert result.failed
    assert "podman pull" in result.result["msg"] and "serve_image_archive" in result.result["msg"]


def test_export_keeps_the_digest_and_is_reused(node):
    node.store([{"Id": "i1", "Digest": f"sha256:{A}", "RepoTags": ["localhost/vllm:0.32.0"]}])
    first = run_module(container_image, {**node.args, "state": "exported"})
    assert first.result["action"] == "saved" and first.result["changed"]
    assert first.result["path"] == f"{node.args['cache_dir']}/sha256-{A}.oci.tar"
    second = run_module(container_image, {**node.args, "state": "exported"})
    assert second.result["action"] == "none" and not second.result["changed"]
    assert node.ran().count("save") == 1


def test_export_that_would_change_the_digest_is_refused_without_skopeo(node):
    node.store(
        [{"Id": "i1", "Digest": f"sha256:{A}", "RepoTags": ["x"]}], save_digest=f"sha256:{B}"
    )
    args = {**node.args, "state": "exported", "skopeo": str(node.root / "no-skopeo")}
    result = run_module(container_image, args)
    assert result.failed
    assert "cannot be written with its digest" in result.result["msg"]
    assert "serve_image_archive" in result.result["msg"]
    assert not list(Path(node.args["cache_dir"]).glob("*"))
