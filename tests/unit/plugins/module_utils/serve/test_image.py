# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image's pure judgements (_image.py), from the case table image_cases.yml."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _image

A, B = "a1" * 32, "b2" * 32
REFERENCE = f"localhost/vllm:0.32.0@sha256:{A}"


def _fill(value):
    text = json.dumps(value).replace("{A}", A).replace("{B}", B)
    return json.loads(text)


CASES = _fill(yaml.safe_load((Path(__file__).parent / "image_cases.yml").read_text()))


def write_archive(path: Path, members: dict) -> None:
    """An archive with ``members`` (a mapping is written as JSON)."""
    with tarfile.open(path, "w") as tar:
        for name, content in members.items():
            data = (content if isinstance(content, str) else json.dumps(content)).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("case", CASES["archives"], ids=lambda c: c["id"])
def test_archive(case, tmp_path):
    path = tmp_path / "image.tar"
    if "raw" in case:
        path.write_text(case["raw"])
    else:
        write_archive(path, case["members"])
    pinned = case.get("pinned", f"sha256:{A}")
    if "refused" not in case:
        assert _image.archive_digest("serve_image_archive", str(path)) == case["digest"]
        _image.check_archive("serve_image_archive", str(path), pinned, "vllm_recipe.image")
        return
    with pytest.raises(ValidationError) as caught:
        _image.check_archive("serve_image_archive", str(path), pinned, "vllm_recipe.image")
    for words in case["refused"]:
        assert words in str(caught.value)
    assert caught.value.fix


def test_missing_archive_names_the_variable(tmp_path):
    with pytest.raises(ValidationError, match=r"serve_image_archive: .* is not a file on the head"):
        _image.archive_digest("serve_image_archive", str(tmp_path / "none.tar"))


@pytest.mark.parametrize("case", CASES["judge"], ids=lambda c: c["id"])
def test_judge(case):
    copies = {
        host: {kind: _image.node_copy(seen) for kind, seen in kinds.items()}
        for host, kinds in case["copies"].items()
    }
    found = _image.judge(copies, REFERENCE, "vllm_recipe.image")
    assert [(f["host"], f["message"]) for f in found] == [
        (host, f"{host} {words}") for host, words in case["refused"]
    ]
    assert all(f["fix"] and f["severity"] == "error" for f in found)


def test_argv_and_paths():
    assert _image.split_reference(REFERENCE) == ("localhost/vllm:0.32.0", f"sha256:{A}")
    assert _image.archive_file("/var/lib/x", f"sha256:{A}") == f"/var/lib/x/sha256-{A}.oci.tar"
    assert _image.save_argv("podman", REFERENCE, "/t") == [
        "podman",
        "save",
        "--quiet",
        "--uncompressed",
        "--format",
        "oci-archive",
        "--output",
        "/t",
        REFERENCE,
    ]
    assert _image.skopeo_argv("skopeo", REFERENCE, "/t")[1:3] == ["copy", "--preserve-digests"]
