# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The weights manifest's reader: where a manifest lies, and what a readable one is."""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _manifest_file as mf

REV = "5eed0c0ffee0000000000000000000000000000a"


def test_default_manifest_path_is_beside_snapshots():
    path = mf.default_manifest_path(f"/srv/models/hub/models--org--name/snapshots/{REV}/")
    assert path == f"/srv/models/hub/models--org--name/localinference-manifests/{REV}.json"


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ([], "is not a"),
        ({"format": "other"}, "is not a"),
        ({"format": mf.MANIFEST_FORMAT}, "no 'files' list"),
        ({"format": mf.MANIFEST_FORMAT, "files": [{"path": "a"}]}, "malformed"),
        (
            {
                "format": mf.MANIFEST_FORMAT,
                "files": [{"path": "../etc/passwd", "size": 1, "mtime_ns": 1, "sha256": "0" * 64}],
            },
            "unsafe path",
        ),
    ],
)
def test_validate_manifest_rejects(document, reason):
    with pytest.raises(mf.ManifestError, match=reason):
        mf.validate_manifest(document)


def test_load_manifest_errors(tmp_path):
    with pytest.raises(mf.ManifestError, match="does not exist"):
        mf.load_manifest(str(tmp_path / "none.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(mf.ManifestError, match="cannot be read"):
        mf.load_manifest(str(bad))
