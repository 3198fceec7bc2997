# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image rule (``_recipe.image``) and serve_allow_unpinned_image, one rule everywhere.

``test_recipe_image.yaml`` is the case table of the rule; the tests below check that
the plan's lint (``check``, ``kv_budget``) and the rollout (``normalise``, which renders
the units) apply it as one: the lint accepts a tag only with the option and warns, the
units only ever get a digest (the head resolved the tag before they are rendered).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    RecipeError,
    ValidationError,
    check,
    image,
    normalise,
    unpinned_image,
)
from ansible_collections.localinference.vllm.plugins.modules import kv_budget
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

HERE = Path(__file__).resolve().parent
TABLE = yaml.safe_load((HERE / "test_recipe_image.yaml").read_text())
TAG = "docker.io/vllm/vllm-openai:v0.32.0"
DIGEST = "sha256:" + "ab" * 32
RECIPE = {"model": "o/m", "revision": "5eed0c0ffee0000000000000000000000000000a", "image": TAG}


@pytest.mark.parametrize("case", TABLE["cases"], ids=[c["name"] for c in TABLE["cases"]])
def test_image_rule(case):
    def run():
        return image(
            case["image"],
            deploy_mode=case.get("deploy_mode", "quadlet"),
            allow_unpinned=case.get("allow_unpinned", False),
        )

    if "accepted" in case:
        assert run() == case["accepted"]
        return
    with pytest.raises(ValidationError) as info:
        run()
    for phrase in case["refused"]:
        assert phrase in str(info.value), (phrase, str(info.value))


def test_lint_and_rollout_refuse_a_tag_alike_without_the_option():
    with pytest.raises(RecipeError) as linted:
        check({"image": TAG})
    with pytest.raises(RecipeError) as rolled:
        normalise(RECIPE)
    assert str(linted.value) == str(rolled.value)
    assert "serve_allow_unpinned_image" in str(linted.value)


def test_the_option_lets_the_lint_through_but_units_get_a_digest():
    assert check({"image": TAG}, allow_unpinned_image=True)["image"] == TAG
    # The head resolved the tag before the units are rendered: they get the digest.
    assert normalise({**RECIPE, "image": f"{TAG}@{DIGEST}"})["image"] == f"{TAG}@{DIGEST}"


def test_unpinned_warning_names_the_digest_to_pin():
    found = unpinned_image(TAG, f"{TAG}@{DIGEST}", "spark-head")
    assert found["id"] == "image_unpinned" and found["severity"] == "warning"
    assert f"spark-head resolved it to {TAG}@{DIGEST}" in found["message"]
    assert (
        found["fix"]
        == f"pin it: vllm_recipe.image: {TAG}@{DIGEST} (then serve_allow_unpinned_image: false)"
    )
    before = unpinned_image(TAG)
    assert "serve_allow_unpinned_image" in before["message"] and before["fix"].startswith(
        "pin it as "
    )


@pytest.mark.parametrize(
    ("allow", "failed", "warned"),
    [(False, True, False), (True, False, True)],
    ids=["refused-naming-the-option", "accepted-with-a-warning"],
)
def test_plan_lint_follows_the_option(allow, failed, warned):
    result = run_module(kv_budget, {"recipe": {"image": TAG}, "allow_unpinned_image": allow})
    assert result.failed is failed
    if failed:
        assert "vllm_recipe.image" in result.result["msg"]
        assert "serve_allow_unpinned_image: true" in result.result["msg"]
        return
    found = [v for v in result.result["violations"] if v["id"] == "image_unpinned"]
    assert [(v["severity"], bool(v["fix"])) for v in found] == [("warning", True)] * warned


def test_plan_lint_says_nothing_of_a_pinned_image():
    result = run_module(
        kv_budget, {"recipe": {"image": f"{TAG}@{DIGEST}"}, "allow_unpinned_image": True}
    )
    assert not result.failed
    assert "image_unpinned" not in [v["id"] for v in result.result["violations"]]
