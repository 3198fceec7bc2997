"""The release: the built tarball installs and works from the installed copy.

``ansible-galaxy collection build`` builds the collection from the checkout,
the tarball is installed into an empty collections path with
``--offline`` (Galaxy is not reachable from the lab machines), its
dependencies taken from the collections the pinned ``ansible`` package
installs in the venv's site-packages; then every module, lookup and role
documents itself with ``ansible-doc``, every filter loads, every
``localinference.vllm.*`` name the roles and playbooks use resolves, and every
playbook passes ``ansible-playbook --syntax-check`` - all from the installed
copy, with nothing of the checkout on the collections path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The collections of the pinned `ansible` package (requirements.txt).
BUNDLED = Path(sysconfig.get_paths()["purelib"]) / "ansible_collections"
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
FQCN = f"{GALAXY['namespace']}.{GALAXY['name']}"
# Measured 1.1 MB (0.2.0); development and lab files would make it several times that.
MAX_TARBALL_BYTES = 3_000_000
# Nothing of the development tree or the lab belongs in the tarball (galaxy.yml build_ignore).
NOT_SHIPPED = re.compile(
    r"^(\.venv|\.lab|\.ansible|\.git|\.ci|\.pytest_cache|\.ruff_cache|lab|molecule|benchmarks"
    r"|tests/output|tests/lab|inventories/lab[^/]*)(/|$)|(^|/)__pycache__(/|$)|\.pyc$"
    r"|^ansible\.cfg$"
)


def run(args, env, cwd, timeout=300):
    result = subprocess.run(
        [str(a) for a in args], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=timeout, check=False,
    )
    assert result.returncode == 0, (
        f"{' '.join(map(str, args))} -> rc {result.returncode}\n"
        f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    )
    return result


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """Build the tarball and install it; the environment that sees only the installed copy."""
    work = tmp_path_factory.mktemp("release")
    (work / "ansible.cfg").write_text("[defaults]\n")
    installed = work / "collections"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        ANSIBLE_CONFIG=str(work / "ansible.cfg"),
        ANSIBLE_HOME=str(work / "home"),
        ANSIBLE_COLLECTIONS_PATH=f"{installed}{os.pathsep}{BUNDLED.parent}",
        ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
        ANSIBLE_NOCOLOR="1",
    )
    run([BIN / "ansible-galaxy", "collection", "build", "--output-path", work / "dist", ROOT],
        env, work)
    tarball = work / "dist" / f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz"
    assert tarball.is_file(), sorted(p.name for p in (work / "dist").iterdir())
    run([BIN / "ansible-galaxy", "collection", "install", "--offline", "-p", installed, tarball],
        env, work)
    root = installed / "ansible_collections" / GALAXY["namespace"] / GALAXY["name"]
    return {"tarball": tarball, "root": root, "env": env, "cwd": work}


def names(root: Path, folder: str, pattern: str = "*.py") -> list[str]:
    return sorted(p.stem for p in (root / folder).glob(pattern) if p.stem != "__init__")


def ansible_doc(release, plugin_type: str, plugins: list[str]) -> dict:
    out = run([BIN / "ansible-doc", "-t", plugin_type, "--json",
               *(f"{FQCN}.{n}" for n in plugins)], release["env"], release["cwd"])
    assert "[WARNING]" not in out.stderr, out.stderr
    return json.loads(out.stdout)


def test_tarball_holds_the_collection_and_nothing_of_the_lab(release):
    with tarfile.open(release["tarball"]) as tar:
        members = tar.getnames()
    shipped = [m for m in members if NOT_SHIPPED.search(m)]
    assert not shipped, shipped[:20]
    for needed in ("MANIFEST.json", "meta/runtime.yml", "CHANGELOG.rst", "playbooks/site.yml",
                   "plugins/modules/serving_state.py", "roles/serve/meta/argument_specs.yml"):
        assert needed in members, needed
    size = release["tarball"].stat().st_size
    assert size < MAX_TARBALL_BYTES, f"{release['tarball'].name}: {size} bytes"


def test_installed_copy_declares_its_dependencies(release):
    manifest = json.loads((release["root"] / "MANIFEST.json").read_text())["collection_info"]
    assert manifest["version"] == GALAXY["version"]
    assert set(manifest["dependencies"]) == {"community.general", "ansible.posix"}
    assert "repository" not in GALAXY or "example.invalid" not in str(GALAXY["repository"])
    for dependency in manifest["dependencies"]:
        assert (BUNDLED / dependency.replace(".", "/") / "MANIFEST.json").is_file(), dependency


def test_every_module_documents_itself_from_the_installed_copy(release):
    modules = names(release["root"], "plugins/modules")
    assert len(modules) > 10, modules
    docs = ansible_doc(release, "module", modules)
    assert sorted(docs) == [f"{FQCN}.{m}" for m in modules]
    for name, doc in docs.items():
        assert doc["doc"]["short_description"], name
        assert Path(doc["doc"]["filename"]).is_relative_to(release["root"]), doc["doc"]["filename"]
        assert doc["examples"], name


def test_every_lookup_documents_itself(release):
    lookups = names(release["root"], "plugins/lookup")
    docs = ansible_doc(release, "lookup", lookups)
    assert sorted(docs) == [f"{FQCN}.{n}" for n in lookups]


def test_every_role_documents_itself(release):
    roles = sorted(p.name for p in (release["root"] / "roles").iterdir() if p.is_dir())
    assert len(roles) > 5, roles
    docs = ansible_doc(release, "role", roles)
    assert sorted(docs) == [f"{FQCN}.{r}" for r in roles]
    for name, doc in docs.items():
        assert doc["entry_points"], name
        for entry_point, spec in doc["entry_points"].items():
            assert spec.get("short_description"), f"{name} entry point {entry_point}"


def test_every_documented_filter_and_test_documents_itself(release):
    """The filters load (none has docs of its own yet); each one that gets docs must render."""
    for plugin_type in ("filter", "test"):
        out = run([BIN / "ansible-doc", "-t", plugin_type, "-l", FQCN, "--json"],
                  release["env"], release["cwd"])
        listed = json.loads(out.stdout)
        documented = [n.rsplit(".", 1)[1] for n, d in listed.items() if d != "UNDOCUMENTED"]
        if documented:
            assert sorted(ansible_doc(release, plugin_type, documented)) == sorted(
                f"{FQCN}.{n}" for n in documented)


def test_every_name_the_roles_and_playbooks_use_resolves(release):
    """A filter, module, lookup or role named by FQCN in the installed copy is there."""
    root = release["root"]
    listed = {}
    for plugin_type in ("filter", "test", "module", "lookup", "role"):
        out = run([BIN / "ansible-doc", "-t", plugin_type, "-l", FQCN, "--json"],
                  release["env"], release["cwd"])
        listed[plugin_type] = set(json.loads(out.stdout))
    playbooks = {f"{FQCN}.{p}" for p in names(root, "playbooks", "*.yml")}
    known = set().union(*listed.values(), playbooks)
    assert listed["filter"], "no filter plugin loads"
    used = set()
    for path in [*root.glob("roles/**/*.yml"), *root.glob("roles/**/*.j2"),
                 *root.glob("playbooks/**/*.yml")]:
        # A name, not a module path (FQCN.plugins.module_utils...) or a glob (FQCN.fabric_*).
        used |= set(re.findall(rf"\b{re.escape(FQCN)}\.[a-z_][a-z0-9_]*\b(?![.*])",
                               path.read_text()))
    assert used, "no FQCN found in the installed roles and playbooks"
    assert sorted(used - known) == []


def test_every_playbook_passes_syntax_check_from_the_installed_copy(release):
    playbooks = names(release["root"], "playbooks", "*.yml")
    assert "site" in playbooks, playbooks
    inventory = release["root"] / "inventories" / "example"
    args = ["-i", inventory] if inventory.is_dir() else []
    run([BIN / "ansible-playbook", "--syntax-check", *args,
         *(f"{FQCN}.{p}" for p in playbooks)], release["env"], release["cwd"])
