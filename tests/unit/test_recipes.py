# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The recipe library (recipes/*.yml): each recipe loads, normalises, renders the exact
vLLM command line, uses only flags of vLLM 0.32.0 (or says which it does not), lints
clean against the failure catalog, and states its expected figures with sources.

Table-driven over every file in recipes/: a new recipe without a row here fails.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.common._build_recipe import (
    build as normalise_build,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    RecipeError,
    normalise,
    problems,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._expected import (
    KNOWN,
    ExpectedError,
    parse,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _derived_image
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import (
    Node,
    parse_help_flags,
    serve_argv,
    unknown_flags,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._units import model_location
from ansible_collections.localinference.vllm.plugins.modules import kv_budget
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
HELP = (ROOT / "tests" / "unit" / "fixtures" / "vllm-0.32.0" / "serve-help-all.txt").read_text()
FLAGS = parse_help_flags(HELP)
# The seeds quoted by seed-sourced figures: the project's shared/ beside the
# checkout (the development tree and CI have it; a user's checkout may not).
SEEDS = ROOT.parent / "shared" / "seeds"
# Stands in for a REQUIRED placeholder so the rest of the recipe can be rendered.
STAND_IN = {"image": "registry.invalid/localinference/stand-in@sha256:" + "0" * 64}
# Every figure a recipe must state, as keys of the gate's vocabulary (value null only when the
# source says it is not published): one stream, several streams, a first token, the context.
REQUIRED_FIGURES = ("decode_tps_single_stream", "decode_tps_at_<N>_streams", "ttft_s_at_<N>_tokens",
                    "max_context")  # fmt: skip
FILES = sorted(RECIPES.glob("*.yml"))


def _pairs(*items: Any) -> list[str]:
    return [str(i) for i in items]


# The head's (rank 0) exact `vllm serve` argv per recipe; workers differ only by
# --node-rank N and --headless (checked below).
HEAD_ARGV: dict[str, list[str]] = {
    "dgx_spark_pair": _pairs(
        "serve", "/models/snapshots/9e165c30e2704aec5d9d593cce3eebd58bbef1cb",
        "--async-scheduling",
        "--block-size", 256,
        "--default-chat-template-kwargs", '{"thinking":false}',
        "--enable-auto-tool-choice",
        "--enable-chunked-prefill",
        "--enable-flashinfer-autotune",
        "--enable-prefix-caching",
        "--generation-config", "vllm",
        "--gpu-memory-utilization", 0.8,
        "--host", "0.0.0.0",
        "--kv-cache-dtype", "nvfp4_ds_mla",
        "--master-port", 25000,
        "--max-cudagraph-capture-size", 36,
        "--max-model-len", 1048576,
        "--max-num-batched-tokens", 8192,
        "--max-num-seqs", 6,
        "--moe-backend", "flashinfer_b12x",
        "--pipeline-parallel-size", 1,
        "--port", 8000,
        "--reasoning-config",
        '{"reasoning_end_str":"</think>","reasoning_parser":"deepseek_v4","reasoning_start_str":"<think>"}',
        "--reasoning-parser", "deepseek_v4",
        "--served-model-name", "deepseek-v4-flash-0731",
        "--speculative-config",
        '{"draft_sample_method":"probabilistic","method":"dspark","num_speculative_tokens":5}',
        "--tensor-parallel-size", 2,
        "--tokenizer-mode", "deepseek_v4",
        "--tool-call-parser", "deepseek_v4",
        "--trust-remote-code",
        "--distributed-executor-backend", "mp",
        "--nnodes", 2,
        "--node-rank", 0,
        "--master-addr", "10.77.0.11",
    ),
    "dgx_spark_quad": _pairs(
        "serve", "/models/snapshots/dba1be0a40aa45a94ad051997016db3960a90277",
        "--block-size", 128,
        "--compilation-config",
        '{"cudagraph_capture_sizes":[5,6,10,12,15,18,20,24,25,30,35,36,40,42,48],'
        '"cudagraph_mode":"FULL_AND_PIECEWISE"}',
        "--default-chat-template-kwargs", '{"thinking":false}',
        "--enable-auto-tool-choice",
        "--engram-config", '{"cpu_offload":false}',
        "--gpu-memory-utilization", 0.83,
        "--host", "0.0.0.0",
        "--limit-mm-per-prompt", '{"image":4}',
        "--load-format", "safetensors",
        "--master-port", 29541,
        "--max-model-len", 430080,
        "--max-num-batched-tokens", 8192,
        "--max-num-seqs", 8,
        "--mm-processor-cache-gb", 1,
        "--port", 8000,
        "--reasoning-parser", "deepseek_v41",
        "--served-model-name", "deepseek-v4.1-flash",
        "--speculative-config",
        '{"draft_sample_method":"greedy","enable_adaptive_verification":false,"method":"dspark",'
        '"num_speculative_tokens":5,"rejection_sample_method":"block"}',
        "--tensor-parallel-size", 4,
        "--tool-call-parser", "deepseek_v41",
        "--distributed-executor-backend", "mp",
        "--nnodes", 4,
        "--node-rank", 0,
        "--master-addr", "10.77.0.11",
    ),
    "rtx_pro_6000_pair": _pairs(
        "serve", "/models/snapshots/7872f01b1d1fe23eabc4c98b48bffcef5a386062",
        "--decode-context-parallel-size", 1,
        "--enable-auto-tool-choice",
        "--gpu-memory-utilization", 0.975,
        "--host", "0.0.0.0",
        "--kv-cache-dtype", "fp8_ds_mla",
        "--kv-offloading-size", 8,
        "--load-format", "instanttensor",
        "--max-model-len", 262144,
        "--max-num-batched-tokens", 8192,
        "--max-num-seqs", 2,
        "--port", 8000,
        "--reasoning-parser", "deepseek_v4",
        "--served-model-name", "deepseek-v4-flash-0731",
        "--speculative-config", '{"method":"dspark","num_speculative_tokens":5}',
        "--tensor-parallel-size", 2,
        "--tool-call-parser", "deepseek_v4",
        "--distributed-executor-backend", "mp",
    ),
}  # fmt: skip

# Findings of the plan's lint (kv_budget without observations) per recipe: ids by severity.
LINT: dict[str, dict[str, list[str]]] = {
    "dgx_spark_pair": {"error": [], "warning": []},
    "dgx_spark_quad": {"error": [], "warning": []},
    # The 8 GiB offload pool cannot be checked without the host's limits (preflight gives them).
    "rtx_pro_6000_pair": {"error": [], "warning": ["F16"]},
}


def _load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), f"{path.name}: not a YAML mapping"
    return document


def _filled(document: dict[str, Any]) -> dict[str, Any]:
    """The recipe with its REQUIRED placeholders replaced by stand-ins."""
    recipe = dict(document["vllm_recipe"])
    for key in document["required_placeholders"]:
        recipe[key] = STAND_IN[key]
    return recipe


def _nodes(document: dict[str, Any], revision: str) -> list[Node]:
    """The node descriptions the serve role passes: fabric env, addresses, weights path."""
    count = document["nodes"]
    weights = f"/srv/models/hub/models--org--name/snapshots/{revision}"
    if count == 1:
        return [Node(host="host-a", rank=0, nnodes=1, head_address="127.0.0.1",
                     weights_path=weights)]  # fmt: skip
    return [
        Node(
            host=f"spark-{rank}",
            rank=rank,
            nnodes=count,
            head_address="10.77.0.11",
            address=f"10.77.0.{11 + rank}",
            env={"VLLM_HOST_IP": f"10.77.0.{11 + rank}", "NCCL_SOCKET_IFNAME": "enp1s0f0np0"},
            weights_path=weights,
        )
        for rank in range(count)
    ]


def _argvs(document: dict[str, Any]) -> list[list[str]]:
    recipe = normalise(_filled(document))
    argvs = []
    for node in _nodes(document, recipe["revision"]):
        _, model_path = model_location(node.weights_path, recipe["revision"])
        argv = serve_argv(recipe, node, model_path)
        assert argv is not None
        argvs.append(argv)
    return argvs


def _choices() -> dict[str, set[str]]:
    """Flags whose help lists their values: ``--flag {a,b}`` or ``--flag ['a', 'b']``."""
    found = {}
    for line in HELP.splitlines():
        match = re.match(r"  (--[a-z0-9-]+) (?:\{([^}]*)\}|\[([^\]]*)\])", line)
        if match:
            values = match.group(2) or match.group(3)
            found[match.group(1)] = {v.strip(" '") for v in values.split(",")}
    return found


CHOICES = _choices()


def test_every_recipe_file_has_a_row():
    assert {path.stem for path in FILES} == set(HEAD_ARGV) == set(LINT)
    assert {"dgx_spark_pair", "dgx_spark_quad", "rtx_pro_6000_pair"} <= set(HEAD_ARGV)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_document_shape(path):
    document = _load(path)
    for key in ("profile", "hardware", "nodes", "status", "required_placeholders", "sources",
                "requires", "expected", "vllm_recipe"):  # fmt: skip
        assert key in document, f"{path.name}: missing top-level key {key!r}"
    assert document["profile"] == path.stem
    assert isinstance(document["nodes"], int) and document["nodes"] >= 1
    requires = document["requires"]
    assert isinstance(requires["flags_outside_vllm_0_32_0"], list)
    assert isinstance(requires["values_outside_vllm_0_32_0"], list)
    assert requires["runtime"], f"{path.name}: requires.runtime must name the image's vLLM build"
    recipe = document["vllm_recipe"]
    assert re.fullmatch(r"[0-9a-f]{40}", recipe["revision"]), "the model revision is pinned"
    assert recipe["reasoning_parser"] and recipe["tool_call_parser"], "parsers (F6)"
    assert recipe["max_model_len"] == "plan" or isinstance(recipe["max_model_len"], int)
    assert recipe["max_num_seqs"] > 1, "F3: an agent endpoint needs more than one sequence"


def _figures(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The gated figures (expected) and those the qualification does not measure (published)."""
    return {**document["expected"], **(document.get("published") or {})}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_expected_figures_state_value_and_source(path):
    document = _load(path)
    sources = document["sources"]
    for name, source in sources.items():
        if "url" in source:
            assert source["url"].startswith("https://"), f"{path.name}: sources.{name}.url"
        else:
            assert source.get("seed") and source.get("section"), (
                f"{path.name}: sources.{name} needs a url, or a seed file and its section"
            )
    assert not set(document["expected"]) & set(document.get("published") or {}), path.name
    for name, figure in _figures(document).items():
        where = f"{path.name}: {name}"
        assert figure["source"] in sources, f"{where}: source {figure['source']!r} is not listed"
        assert figure["unit"] and figure["at"] and figure["quote"], where
        if figure["value"] is None:
            assert str(figure["at"]).startswith("not published"), (
                f"{where}: a null value must say it is not published"
            )
            continue
        # The figure (each end of a range) is verbatim from the quoted source text.
        for value in figure["value"] if isinstance(figure["value"], list) else [figure["value"]]:
            assert str(value) in figure["quote"].replace(",", ""), (
                f"{where}: {value!r} does not appear in its quote"
            )


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_expected_keys_are_the_gates_vocabulary(path):
    """Every expected: key is one the qualification gate measures (qualify._expected.VOCABULARY),
    in its unit, at a condition the recipe can serve; the required figures are all stated."""
    document = _load(path)
    recipe = document["vllm_recipe"]
    declared = parse(document["expected"])  # an unknown key or unit raises, naming expected.<key>
    assert set(REQUIRED_FIGURES) <= {e.figure.key for e in declared}, (
        f"{path.name}: expected lacks one of {REQUIRED_FIGURES}"
    )
    for e in declared:
        if e.figure.condition == "streams":
            assert e.condition <= recipe["max_num_seqs"], f"{path.name}: {e.key} above max_num_seqs"
        if e.figure.condition == "prompt_tokens":
            assert e.condition < recipe["max_model_len"], f"{path.name}: {e.key} beyond the context"


def test_an_old_or_unknown_expected_key_is_refused_by_name():
    document = _load(RECIPES / "dgx_spark_pair.yml")
    renamed = {"decode_single_stream": document["expected"]["decode_tps_single_stream"]}
    with pytest.raises(ExpectedError) as refused:
        parse({**document["expected"], **renamed})
    message = str(refused.value)
    assert message.startswith("expected.decode_single_stream is not a figure the gate knows")
    assert message.endswith(KNOWN)


def _seed_quotes() -> list[tuple[str, str, str, str]]:
    rows = []
    for path in FILES:
        document = _load(path)
        for name, figure in _figures(document).items():
            source = document["sources"][figure["source"]]
            if "seed" in source:
                rows.append((f"{path.stem}.{name}", source["seed"], source["section"],
                             figure["quote"]))  # fmt: skip
    return rows


@pytest.mark.parametrize(
    ("figure", "seed", "section", "quote"), _seed_quotes(), ids=lambda v: str(v)[:40]
)
def test_seed_quotes_are_verbatim(figure, seed, section, quote):
    if not SEEDS.is_dir():
        pytest.skip(f"{SEEDS} is not beside this checkout: the seed quotes need the project's shared/")
    text = (SEEDS / seed).read_text()
    assert section in text, f"{figure}: section {section!r} not in seed {seed}"
    assert quote in text, f"{figure}: quote not verbatim in seed {seed}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_normalises_or_refuses_only_its_required_placeholders(path):
    document = _load(path)
    placeholders = document["required_placeholders"]
    for key in placeholders:
        assert str(document["vllm_recipe"][key]).startswith("REQUIRED"), (
            f"{path.name}: vllm_recipe.{key} is listed as a placeholder but not marked REQUIRED"
        )
    if placeholders:
        with pytest.raises(RecipeError, match=rf"^vllm_recipe\.{placeholders[0]}: "):
            normalise(document["vllm_recipe"])
    recipe = normalise(_filled(document))
    assert problems(recipe) == [], "F14/F17: the Quadlet deployment is sound"
    assert recipe["deploy_mode"] == "quadlet"
    assert re.search(r"@sha256:[0-9a-f]{64}$", recipe["image"]), "the image is pinned by digest"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_renders_the_exact_vllm_command_line(path):
    document = _load(path)
    head, *workers = _argvs(document)
    assert head == HEAD_ARGV[path.stem]
    for rank, argv in enumerate(workers, start=1):
        expected = list(HEAD_ARGV[path.stem])
        expected[expected.index("--node-rank") + 1] = str(rank)
        assert argv == [*expected, "--headless"], f"rank {rank}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_flags_exist_in_vllm_0_32_0_or_are_declared(path):
    document = _load(path)
    unknown: list[str] = []
    for argv in _argvs(document):
        unknown += [f for f in unknown_flags(argv, FLAGS) if f not in unknown]
    declared = document["requires"]["flags_outside_vllm_0_32_0"]
    assert unknown == declared, (
        f"{path.name}: flags outside vLLM 0.32.0's serve --help=all: {unknown}; the recipe"
        f" declares {declared} (requires.flags_outside_vllm_0_32_0)"
    )


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_choice_values_exist_in_vllm_0_32_0_or_are_declared(path):
    document = _load(path)
    argv = _argvs(document)[0]
    outside = [
        f"{flag} {argv[i + 1]}"
        for i, flag in enumerate(argv[:-1])
        if flag in CHOICES and argv[i + 1] not in CHOICES[flag]
    ]
    assert {"--kv-cache-dtype", "--tool-call-parser", "--moe-backend"} <= CHOICES.keys()
    assert outside == document["requires"]["values_outside_vllm_0_32_0"], (
        f"{path.name}: values outside vLLM 0.32.0's choices: {outside}"
    )


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_plan_lint_is_clean(path):
    """The plan's lint-only path (no boot observed yet) on the recipe as the inventory gives it
    (its REQUIRED placeholders pinned, as the recipe's header says); the plan refuses a
    placeholder itself as the rollout does, naming the key."""
    document = _load(path)
    placeholders = document["required_placeholders"]
    if placeholders:
        refused = run_module(kv_budget, {"recipe": document["vllm_recipe"]})
        assert refused.failed and refused.result["msg"].startswith(f"vllm_recipe.{placeholders[0]}: ")
    result = run_module(kv_budget, {"recipe": _filled(document)})
    assert not result.failed, result.result.get("msg")
    found = {"error": [], "warning": []}
    for violation in result.result["violations"]:
        found[violation["severity"]].append(violation["id"])
    assert found == LINT[path.stem], result.result["violations"]
    assert result.result["served_max_model_len"] == document["vllm_recipe"]["max_model_len"]


def test_seed_002_scheduled_tokens_match_the_recipe_figure():
    """DSpark drafts in parallel: 8192 - (5 - 1) x 2 = 8184, as seed 002's boot log says (F15)."""
    document = _load(RECIPES / "rtx_pro_6000_pair.yml")
    result = run_module(
        kv_budget, {"recipe": document["vllm_recipe"], "parallel_drafting": True}
    ).result
    assert result["scheduled_tokens"] == document["published"]["scheduled_tokens"]["value"] == 8184
    assert "F15" in [v["id"] for v in result["violations"] if v["severity"] == "warning"]


# The example inventories and the recipe each serves.
EXAMPLES = {"example": "dgx_spark_pair", "example-rtx-pro-6000": "rtx_pro_6000_pair"}


def _hosts(group: dict[str, Any] | None) -> list[str]:
    """Every host of an inventory group (YAML inventory layout), children included."""
    group = group or {}
    names = list((group.get("hosts") or {}).keys())
    for child in (group.get("children") or {}).values():
        names += _hosts(child)
    return names


@pytest.mark.parametrize(("inventory", "profile"), EXAMPLES.items(), ids=list(EXAMPLES))
def test_example_inventory_serves_its_recipe(inventory, profile):
    folder = ROOT / "inventories" / inventory
    group_vars = yaml.safe_load((folder / "group_vars/all.yml").read_text())
    assert group_vars["localinference_profile"] == profile
    assert f"recipes/{profile}.yml" in group_vars["vllm_recipe"]
    assert ").vllm_recipe" in group_vars["vllm_recipe"]
    # The gate holds the endpoint to the same file's expected: figures.
    assert f"recipes/{profile}.yml" in group_vars["qualify_expected"]
    assert group_vars["qualify_expected"].endswith(").expected }}")
    # The inventory has as many nodes as the recipe is made for, one head.
    cluster = yaml.safe_load((folder / "hosts.yml").read_text())["vllm_cluster"]
    head = _hosts(cluster["children"]["vllm_head"])
    workers = _hosts(cluster["children"].get("vllm_workers"))
    assert len(head) == 1
    assert len(head) + len(workers) == _load(RECIPES / f"{profile}.yml")["nodes"]
    # Every node of a cluster of several has its cluster link; a single host has none to set.
    for host in head + workers:
        host_vars = folder / "host_vars" / f"{host}.yml"
        if workers:
            assert yaml.safe_load(host_vars.read_text())["cluster_network_interfaces"]
        else:
            assert not host_vars.exists()
    assert ("cluster_network_expected_speed_mbps" in group_vars) == bool(workers)


def test_the_rtx_pro_6000_example_renders_tensor_parallel_inside_one_host():
    """The one-host example's recipe as its only node renders it: TP 2, no multi-node flag."""
    document = _load(RECIPES / "rtx_pro_6000_pair.yml")
    (argv,) = _argvs(document)
    assert argv == HEAD_ARGV["rtx_pro_6000_pair"]
    assert not {"--nnodes", "--node-rank", "--master-addr", "--headless"} & set(argv)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"


# ---------------------------------------------------------------- the publishers' launcher steps
# vllm_recipe.build and vllm_recipe.mounts say what the launchers do before `vllm serve`; each
# step is checked against the publisher's own text (tests/unit/fixtures/recipes, with sources).
PUBLISHED = ROOT / "tests" / "unit" / "fixtures" / "recipes"
COMPOSE = (PUBLISHED / "miaai-docker-compose.dspark-bf9ba2e.yml").read_text()
SITE = "/usr/local/lib/python3.12/dist-packages"


def _recipe_file(name: str) -> dict[str, Any]:
    return yaml.safe_load((RECIPES / f"{name}.yml").read_text())


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_launcher_step_is_expressed(path):
    """requires.not_expressible is empty: what the launcher does is in the recipe."""
    assert _recipe_file(path.stem)["requires"].get("not_expressible", []) == []


def _compose_replacement() -> tuple[str, str]:
    """The old and new text of the compose command's python3 -c replacement, as Python reads them."""
    script = re.search(r"python3 -c '(from pathlib import Path; .*?)'; fi;", COMPOSE).group(1)
    found = dict(re.findall(r'\b(old|new)=("(?:[^"\\]|\\.)*")', script))
    return eval(found["old"]), eval(found["new"])  # two string literals of the publisher's script


def test_the_pair_patch_makes_the_publishers_replacement():
    old, new = _compose_replacement()
    # The replacement starts at `elif` mid-line: the file indents it as its next lines' `else`.
    original = f"def map_effort(reasoning_effort):\n    if True:\n            if x:\n                pass\n            {old}\n    return reasoning_effort\n"
    build = normalise_build(_recipe_file("dgx_spark_pair")["vllm_recipe"]["build"])
    (patch_entry,) = build["patches"]
    text = (ROOT / "files" / patch_entry["src"].partition(":")[2]).read_text()
    assert hashlib.sha256(text.encode()).hexdigest() == patch_entry["sha256"]
    (file_patch,) = _derived_image.parse_patch("patches[0]", text, patch_entry["strip"])
    assert f"{patch_entry['root']}/{file_patch.path}" == f"{SITE}/vllm/tokenizers/deepseek_v4.py"
    assert f'p=Path("{SITE}/vllm/tokenizers/deepseek_v4.py")' in COMPOSE
    assert _derived_image.apply_patch("patches[0]", file_patch, original) == original.replace(old, new)


def test_the_pair_build_copies_the_checkpoints_encoder_where_the_launcher_does():
    build = normalise_build(_recipe_file("dgx_spark_pair")["vllm_recipe"]["build"])
    (copy,) = build["files"]
    assert copy["src"] == "model:encoding/encoding_dsv4.py"
    assert "DeepSeek-V4-Flash-0731/snapshots/*/encoding/encoding_dsv4.py" in COMPOSE
    assert f'cp "$${{ENCODING_SOURCE}}" {copy["dest"]};' in COMPOSE
    assert 'export PATH="/usr/local/cuda/bin:/usr/local/bin:$${PATH:-}";' in COMPOSE
    assert build["env_prepend"]["PATH"] == ["/usr/local/cuda/bin", "/usr/local/bin"]
    assert 'export LD_LIBRARY_PATH="/usr/local/cuda/lib64:$${LD_LIBRARY_PATH:-}";' in COMPOSE
    assert build["env_prepend"]["LD_LIBRARY_PATH"] == ["/usr/local/cuda/lib64"]


# The exact Containerfile of each recipe with a build (the inputs hash as measured by the test).
CONTAINERFILES = {
    "dgx_spark_pair": (
        "# Rendered by localinference.vllm from vllm_recipe.build; do not edit.\n"
        "FROM ghcr.io/anemll/dspark-vllm-gx10:0.1.1@sha256:a83948492cf13df455170fb42885f5ef4db54fefe0feff0f841ecbff464ac9d8\n"
        f'COPY --chmod=0644 ["files/0", "{SITE}/vllm/tokenizers/deepseek_v4_encoding.py"]\n'
        f'COPY ["patched/0", "{SITE}/vllm/tokenizers/deepseek_v4.py"]\n'
        'ENV LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"\n'
        'ENV PATH="/usr/local/cuda/bin:/usr/local/bin${PATH:+:${PATH}}"\n'
        'LABEL "io.localinference.build.inputs"="INPUTS" "io.localinference.build.base"='
        '"ghcr.io/anemll/dspark-vllm-gx10:0.1.1@sha256:a83948492cf13df455170fb42885f5ef4db54fefe0feff0f841ecbff464ac9d8"\n'
    ),
}


@pytest.mark.parametrize("profile", sorted(CONTAINERFILES))
def test_renders_the_exact_containerfile(profile):
    recipe = _recipe_file(profile)["vllm_recipe"]
    build = normalise_build(recipe["build"])
    patched = [f"{p['root']}/vllm/tokenizers/deepseek_v4.py" for p in build.get("patches", [])]
    inputs = _derived_image.inputs_hash(recipe["image"], build, {"model:encoding/encoding_dsv4.py": "0" * 64})
    text = _derived_image.containerfile(recipe["image"], build, inputs, patched)
    assert text == CONTAINERFILES[profile].replace("INPUTS", inputs)


def test_the_quad_mounts_are_the_publishers_md5_pinned_patches():
    md5sums = dict(
        reversed(line.split()) for line in (PUBLISHED / "sparkring-MD5SUMS-2bbbe4a").read_text().splitlines()
    )
    recipe = _recipe_file("dgx_spark_quad")["vllm_recipe"]
    mounts = recipe["mounts"]
    patches = {Path(m["src"]).name: m for m in mounts if "/patches/" in m["src"]}
    assert sorted(patches) == sorted(set(md5sums) - {"mounts.txt"})
    for name, mount in patches.items():
        assert mount["md5"] == md5sums[name], name
        assert mount["dest"].startswith(f"{SITE}/vllm/"), name
    # The README's table names these five destinations whole.
    named = {
        "engram.py": "models/deepseek_v4_1/common/engram.py",
        "weight_utils.py": "model_executor/model_loader/weight_utils.py",
        "model_state.py": "models/deepseek_v4_1/nvidia/model_state.py",
        "sparse_swa.py": "v1/attention/backends/mla/sparse_swa.py",
        "sparse_attn_indexer.py": "model_executor/layers/sparse_attn_indexer.py",
    }
    for name, rel in named.items():
        assert patches[name]["dest"] == f"{SITE}/vllm/{rel}"
    library = next(m for m in mounts if m["src"].endswith("libnccl.so.2"))
    assert recipe["env"]["LD_PRELOAD"] == library["dest"]
    assert recipe["env"]["DSV41_ENGRAM_PACKED_DIR"] == next(m["dest"] for m in mounts if "engram-packed" in m["src"])
