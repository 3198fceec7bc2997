"""vllm_recipe.build and vllm_recipe.mounts: the schema, the strict patch, the Containerfile."""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _build_recipe,
    _recipe,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _argv
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _derived_image as d

SHA = "a" * 64
BASE = "localhost/vllm-cpu@sha256:" + "b" * 64
ORIGINAL = "".join(f"line {n}\n" for n in range(1, 21))


def _diff(old_start: int, body: str, path: str = "pkg/mod.py") -> str:
    lines = body.splitlines()
    old = sum(1 for line in lines if line[:1] in " -")
    new = sum(1 for line in lines if line[:1] in " +")
    return f"--- a/{path}\n+++ b/{path}\n@@ -{old_start},{old} +{old_start},{new} @@\n{body}"


# (case, diff, expected text or the words the refusal must hold)
PATCH_CASES = [
    ("at its line", _diff(3, " line 3\n-line 4\n+line four\n line 5\n"), ORIGINAL.replace("line 4\n", "line four\n")),
    ("offset: found 10 lines later", _diff(3, " line 13\n-line 14\n+line 14b\n"), ORIGINAL.replace("line 14\n", "line 14b\n")),
    ("insertion", _diff(1, " line 1\n+line 1.5\n line 2\n"), ORIGINAL.replace("line 1\n", "line 1\nline 1.5\n")),
    ("no match: refused", _diff(3, " line 3\n-line 40\n+x\n"), ["hunk #1", "@@ -3,2 +3,2 @@", "pkg/mod.py", "line 3"]),
    ("no fuzz: one context line differs", _diff(3, " line 3 \n-line 4\n+x\n"), ["hunk #1", "does not apply"]),
    ("second hunk fails, named", _diff(1, " line 1\n-line 2\n+two\n") + "@@ -9,1 +9,1 @@\n-line 99\n+nine\n", ["hunk #2", "@@ -9,1 +9,1 @@"]),
]


@pytest.mark.parametrize(("case", "diff", "expected"), PATCH_CASES, ids=[c[0] for c in PATCH_CASES])
def test_a_patch_applies_exactly_or_names_the_file_and_the_hunk(case, diff, expected):
    patches = d.parse_patch("vllm_recipe.build.patches[0]", diff, 1)
    assert [p.path for p in patches] == ["pkg/mod.py"]
    if isinstance(expected, str):
        assert d.apply_patch("vllm_recipe.build.patches[0]", patches[0], ORIGINAL) == expected
        return
    with pytest.raises(d.PatchError) as raised:
        d.apply_patch("vllm_recipe.build.patches[0]", patches[0], ORIGINAL)
    message = str(raised.value)
    assert message.startswith("vllm_recipe.build.patches[0]")
    for words in expected:
        assert words in message


def test_a_patch_against_a_file_the_base_lacks_is_refused_and_a_new_file_is_created():
    (patch,) = d.parse_patch("p", _diff(1, "-line 1\n+one\n"), 1)
    with pytest.raises(d.PatchError, match=r"pkg/mod\.py: the base image has no such file"):
        d.apply_patch("p", patch, None)
    created = "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+a\n+b\n"
    (patch,) = d.parse_patch("p", created, 1)
    assert d.apply_patch("p", patch, None) == "a\nb\n"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("just words\n", "holds no unified diff hunks"),
        ("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n line\n", "the hunk ends early"),
        ("--- a/../etc/x\n+++ b/../etc/x\n@@ -1 +1 @@\n-a\n+b\n", "has no file left after strip 1"),
    ],
)
def test_a_malformed_patch_is_refused(text, words):
    with pytest.raises(d.PatchError, match=words.replace("(", r"\(")):
        d.parse_patch("vllm_recipe.build.patches[0]", text, 1)


def test_the_containerfile_is_rendered_exactly():
    build = _build_recipe.build(
        {
            "files": [{"src": "model:enc/e.py", "dest": "/opt/venv/lib/e.py"}],
            "patches": [{"src": "collection:p.patch", "sha256": SHA, "root": "/opt/venv/lib"}],
            "commands": ['python3 -c "import vllm"'],
            "env_prepend": {"PATH": ["/usr/local/cuda/bin"]},
        }
    )
    text = d.containerfile(BASE, build, "c" * 64, ["/opt/venv/lib/vllm/x.py"])
    assert text == (
        "# Rendered by localinference.vllm from vllm_recipe.build; do not edit.\n"
        f"FROM {BASE}\n"
        'COPY --chmod=0644 ["files/0", "/opt/venv/lib/e.py"]\n'
        'COPY ["patched/0", "/opt/venv/lib/vllm/x.py"]\n'
        'RUN ["/bin/sh", "-c", "python3 -c \\"import vllm\\""]\n'
        'ENV PATH="/usr/local/cuda/bin${PATH:+:${PATH}}"\n'
        f'LABEL "io.localinference.build.inputs"="{"c" * 64}" "io.localinference.build.base"="{BASE}"\n'
    )


def test_the_inputs_hash_moves_with_every_input_and_not_with_the_base_tag():
    build = _build_recipe.build({"files": [{"src": "model:e.py", "dest": "/opt/e.py"}]})
    one = d.inputs_hash(BASE, build, {"model:e.py": SHA})
    assert one == d.inputs_hash(BASE.replace("vllm-cpu", "vllm-cpu:tag"), build, {"model:e.py": SHA})
    assert one != d.inputs_hash(BASE, build, {"model:e.py": "f" * 64})
    assert one != d.inputs_hash(BASE.replace("b" * 64, "e" * 64), build, {"model:e.py": SHA})
    moved = _build_recipe.build({"files": [{"src": "model:e.py", "dest": "/opt/f.py"}]})
    assert one != d.inputs_hash(BASE, moved, {"model:e.py": SHA})
    assert d.reference(one, "sha256:" + "d" * 64) == f"{d.NAME}:{one[:16]}@sha256:{'d' * 64}"


# (case, build or mounts value, the key and words of the refusal)
BAD_INPUTS = [
    ("no sha256 for a collection file", {"files": [{"src": "collection:x", "dest": "/opt/x"}]}, "build.files[0].sha256"),
    ("a relative controller path", {"files": [{"src": "x.patch", "sha256": SHA, "dest": "/opt/x"}]}, "names no source"),
    ("a source escaping its root", {"patches": [{"src": "inventory:../x.patch", "sha256": SHA}]}, "not a plain relative path"),
    ("a newline in a command", {"commands": ["true\nFROM evil"]}, "build.commands[0]"),
    ("a newline in a dest", {"files": [{"src": "model:x", "dest": "/opt/x\nRUN evil"}]}, "build.files[0].dest"),
    ("a quote in a dest", {"files": [{"src": "model:x", "dest": '/opt/x"]'}]}, "build.files[0].dest"),
    ("a dest under the model mount", {"files": [{"src": "model:x", "dest": "/models/x"}]}, "which the collection mounts"),
    ("a placeholder source", {"files": [{"src": "REQUIRED:path", "sha256": SHA, "dest": "/opt/x"}]}, "placeholder"),
    ("a short sha256", {"files": [{"src": "collection:x", "sha256": "abc", "dest": "/opt/x"}]}, "64-hex sha256"),
    ("an unknown key", {"files": [], "steps": []}, "unknown key 'steps'"),
    ("a base without digest", {"commands": ["true"], "base": "vllm:latest"}, "build.base"),
    ("nothing to derive", {"files": []}, "derives nothing"),
    ("a bad env name", {"env_prepend": {"PA TH": ["/x"]}}, "env_prepend"),
    ("a patch from the checkpoint", {"patches": [{"src": "model:x.patch"}]}, "not the checkpoint's"),
]


@pytest.mark.parametrize(("case", "value", "words"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_build_input_is_refused_naming_the_key(case, value, words):
    with pytest.raises(ValidationError) as raised:
        _recipe.check({"build": value})
    assert str(raised.value).startswith("vllm_recipe.build")
    assert words in str(raised.value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([{"src": "REQUIRED:the patch dir", "dest": "/opt/x"}], "vllm_recipe.mounts[0].src: is the placeholder"),
        ([{"src": "/opt/a:/etc", "dest": "/opt/x"}], "vllm_recipe.mounts[0].src"),
        ([{"src": "/opt/a", "dest": "/var/cache/vllm/x"}], "vllm_recipe.mounts[0].dest"),
        ([{"src": "/opt/a", "dest": "/opt/x", "md5": "xyz"}], "vllm_recipe.mounts[0].md5"),
        ([{"src": "/opt/a", "dest": "/opt/x"}, {"src": "/opt/b", "dest": "/opt/x"}], "two entries have the dest"),
    ],
)
def test_bad_mounts_are_refused_naming_the_key(value, words):
    with pytest.raises(ValidationError, match=words.replace("[", r"\[").replace("]", r"\]")):
        _recipe.check({"mounts": value})


def test_build_and_mounts_need_quadlet():
    recipe = {"model": "o/m", "revision": "a" * 40, "deploy_mode": "systemd", "vllm_version": "0.32.0"}
    with pytest.raises(ValidationError, match=r"vllm_recipe\.mounts: needs deploy_mode quadlet"):
        _recipe.normalise({**recipe, "mounts": [{"src": "/opt/a", "dest": "/opt/a"}]}, 4096)


def test_controller_sources_stay_under_their_roots():
    build = {
        "files": [{"src": "/srv/fixes/e.py", "sha256": SHA, "dest": "/opt/e.py"}],
        "patches": [{"src": "inventory:fixes/p.patch", "sha256": SHA}],
    }
    found = _build_recipe.controller_sources(build, "/c/files", "/inv", ["/srv/fixes"])
    assert [(f["src"], f["path"]) for f in found] == [
        ("/srv/fixes/e.py", "/srv/fixes/e.py"),
        ("inventory:fixes/p.patch", "/inv/fixes/p.patch"),
    ]
    with pytest.raises(ValidationError, match=r"build.files\[0\].src: /srv/fixes/e.py is outside serve_build_roots"):
        _build_recipe.controller_sources(build, "/c/files", "/inv", ["/srv/other"])


def test_env_problems_names_a_prepend_the_image_lacks():
    build = {"env_prepend": {"PATH": ["/usr/local/cuda/bin"], "LD_LIBRARY_PATH": ["/usr/local/cuda/lib64"]}}
    env = ["PATH=/usr/local/cuda/bin:/usr/bin", "LD_LIBRARY_PATH=/usr/lib"]
    assert d.env_problems(build, env) == ["LD_LIBRARY_PATH is '/usr/lib', not '/usr/local/cuda/lib64' prepended"]
    assert d.env_problems(build, [*env[:1], "LD_LIBRARY_PATH=/usr/local/cuda/lib64"]) == []


def test_mounts_become_read_only_volumes_of_the_container_unit():
    from ansible_collections.localinference.vllm.plugins.module_utils.serve import _units

    recipe = _recipe.normalise(
        {
            "model": "org/model",
            "revision": "a" * 40,
            "image": BASE,
            "mounts": [{"src": "/opt/sparkring/nccl/libnccl.so.2", "dest": "/opt/sparkring/nccl/libnccl.so.2"}],
        },
        4096,
    )
    node = _argv.Node(host="h0", rank=0, nnodes=1, head_address="127.0.0.1", weights_path="/srv/models/m")
    units = _units.render_units(recipe, node, "")["units"]
    container = next(u["content"] for u in units if u["name"].endswith(".container"))
    assert "Volume=/opt/sparkring/nccl/libnccl.so.2:/opt/sparkring/nccl/libnccl.so.2:ro" in container.splitlines()
