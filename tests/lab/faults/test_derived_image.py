# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_recipe.build on the real lab (issue 36): a derived image of the lab's vLLM CPU image,
built with Podman on the head, copied to the worker over the cluster link, served.

The patch changes what the API serves: vLLM's model card says ``owned_by: "vllm"``
(vllm/entrypoints/serve/engine/protocol.py of 0.32.0); patched, ``/v1/models`` through
the ingress names the build. In one sequence:

1. a rollout with the patch builds the image once, copies it to the worker (the shared
   image store is hidden from it, so it has only what the collection gives it) and serves
   it: the card says the patched owner; serving.json and the stack lockfile record the
   base, the patch's sha256 and the built digest;
2. the same rollout again builds nothing, copies nothing, restarts nothing;
3. a patch whose context the base does not have stops the rollout in staging, naming the
   patch, the file and the hunk; the engine was never stopped and still serves build 1;
4. a second patch is rolled out (build 2), then ``--tags revert`` serves build 1 again
   without a build (every node kept it);
5. the inventory's recipe serves again (the lab as it was).

Six rollouts, two builds, two copies of the 3.8 GB image: about 14 min on the lab
machine, so ``extended`` (make test-lab-extended).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from lab.harness import (
    HEAD,
    HOSTS,
    VLLM_UNIT,
    WORKER,
    exec_on,
    inventory_recipe,
    read_json,
    recap,
    rollout,
    served_models,
    streams_a_token,
)

pytestmark = [pytest.mark.lab, pytest.mark.extended, pytest.mark.usefixtures("lab_hosts")]

SITE = "/opt/vllm/lib/python3.11/site-packages"
SERVING = "/etc/localinference/serving.json"
LOCK = "/etc/localinference/stack.lock.json"
LABEL = "io.localinference.build.inputs"
BUILT = "localhost/localinference-vllm-built"


def _patch(owner: str, context: str = "    object: str = \"model\"") -> str:
    return (
        "--- a/vllm/entrypoints/serve/engine/protocol.py\n"
        "+++ b/vllm/entrypoints/serve/engine/protocol.py\n"
        "@@ -107,3 +107,3 @@\n"
        f"{' ' + context}\n"
        "     created: int = Field(default_factory=lambda: int(time.time()))\n"
        '-    owned_by: str = "vllm"\n'
        f'+    owned_by: str = "{owner}"\n'
    )


def _recipe(directory: Path, name: str, text: str) -> dict:
    path = directory / name
    path.write_text(text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    build = {"patches": [{"src": str(path), "sha256": digest, "root": SITE, "strip": 1}]}
    return {**inventory_recipe(), "build": build}


def _roll(recipe: dict | None, directory: Path, tags: str = "rollout"):
    return rollout(recipe, tags=tags, extra_vars={"serve_build_roots": [str(directory)]}, timeout=1800)


def _owner() -> str:
    return str(served_models()[0].get("owned_by"))


def _started(host: str) -> str:
    return exec_on(host, "systemctl", "show", "-p", "ActiveEnterTimestamp", "--value", VLLM_UNIT).stdout


def _remove_built_images() -> None:
    for host in HOSTS:
        exec_on(host, "sh", "-c", f"podman images -q --filter label={LABEL} | xargs -r podman rmi",
                check=False, timeout=300)


@pytest.fixture
def lab_recipe_after():
    """No built image before; after the test (and after shared_store_hidden's teardown, so the
    worker takes the lab image from the shared store again, not as a copy) the lab recipe
    serves and the built images go from both nodes."""
    _remove_built_images()
    yield
    back = rollout(tags="rollout")
    assert back.rc == 0, back.tail()
    _remove_built_images()
    assert streams_a_token(timeout=60) and _owner() == "vllm"


def test_a_patched_image_is_built_once_served_refused_when_stale_and_reverted(
    tmp_path, lab_recipe_after, shared_store_hidden
):
    base = str(inventory_recipe()["image"])
    first = _recipe(tmp_path, "owner-1.patch", _patch("localinference-derived-1"))
    built = _roll(first, tmp_path)
    assert built.rc == 0, built.tail()
    assert f"Built {BUILT}:" in built.flat, built.tail()
    assert "Image | Copy the OCI archive from the head over the cluster link" in built.flat
    assert _owner() == "localinference-derived-1"
    for host in HOSTS:
        recipe = read_json(host, SERVING)["recipe"]
        assert recipe["image"].startswith(BUILT + ":") and "@sha256:" in recipe["image"], recipe["image"]
        assert recipe["build"]["base"] == base
        assert recipe["build"]["patches"][0]["sha256"] == first["build"]["patches"][0]["sha256"]
    newest = json.loads(exec_on(HEAD, "cat", LOCK).stdout)["entries"][0]["nodes"][WORKER]
    assert newest["recipe"]["image"] == read_json(WORKER, SERVING)["recipe"]["image"]
    assert newest["recipe"]["build"]["base"] == base
    image_one = newest["recipe"]["image"]

    started = {host: _started(host) for host in HOSTS}
    again = _roll(first, tmp_path)
    assert again.rc == 0, again.tail()
    assert "Built " not in again.flat and "Would build" not in again.flat
    assert all(counts["changed"] == 0 for counts in recap(again.stdout).values()), again.tail()
    assert {host: _started(host) for host in HOSTS} == started

    stale = _recipe(tmp_path, "stale.patch", _patch("x", context='    object: str = "card"'))
    refused = _roll(stale, tmp_path)
    assert refused.rc != 0
    assert "stale.patch" in refused.flat and "hunk #1 (@@ -107,3 +107,3 @@) does not apply" in refused.flat, (
        refused.tail()
    )
    assert "vllm/entrypoints/serve/engine/protocol.py" in refused.flat
    assert {host: _started(host) for host in HOSTS} == started
    assert streams_a_token(timeout=60) and _owner() == "localinference-derived-1"

    second = _roll(_recipe(tmp_path, "owner-2.patch", _patch("localinference-derived-2")), tmp_path)
    assert second.rc == 0, second.tail()
    assert _owner() == "localinference-derived-2"
    # The revert takes the last good stack's recipe from the lockfile (no -e vllm_recipe).
    reverted = _roll(None, tmp_path, tags="rollout,revert")
    assert reverted.rc == 0, reverted.tail()
    assert "Built " not in reverted.flat, reverted.tail()
    assert _owner() == "localinference-derived-1"
    assert read_json(HEAD, SERVING)["recipe"]["image"] == image_one
