# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The upgrade role's filter: the new stack from what serves and what changes."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.upgrade import FilterModule

upgrade_recipe = FilterModule().filters()["upgrade_recipe"]

DIGEST = "localhost/localinference-vllm-cpu@sha256:" + "ab" * 32
CURRENT = {
    "model": "localinference/tiny-deepseek",
    "revision": "5eed0c0ffee0000000000000000000000000000a",
    "image": DIGEST,
    "max_num_seqs": 4,
}


@pytest.mark.parametrize(
    ("recipe", "changes", "expected"),
    [
        ({}, {"max_num_seqs": 2}, {**CURRENT, "max_num_seqs": 2}),
        (
            {},
            {"image": DIGEST.replace("ab", "cd")},
            {**CURRENT, "image": DIGEST.replace("ab", "cd")},
        ),
        ({**CURRENT, "max_num_seqs": 8}, {}, {**CURRENT, "max_num_seqs": 8}),
        ({**CURRENT, "max_num_seqs": 8}, {"seed": 7}, {**CURRENT, "max_num_seqs": 8, "seed": 7}),
    ],
    ids=["a key", "the image by digest", "a whole recipe", "a whole recipe and a key"],
)
def test_the_new_stack(recipe, changes, expected):
    assert upgrade_recipe(CURRENT, recipe, changes) == expected


@pytest.mark.parametrize(
    ("recipe", "changes", "words"),
    [
        ({}, {}, ["needs the new stack", "upgrade_set", "upgrade_recipe", "Nothing was changed"]),
        ({}, {"max_num_seqs": 4}, ["max_num_seqs", "nothing to upgrade"]),
        ({}, "image=x", ["upgrade_set", "mapping", "str"]),
        ([], {}, ["upgrade_recipe", "mapping", "list"]),
        (
            {},
            {"image": "docker.io/vllm/vllm-openai:latest"},
            ["upgrade_set", "vllm_recipe.image", "digest"],
        ),
        ({}, {"max_num_seqs": "four"}, ["upgrade_set", "max_num_seqs", "four"]),
        ({}, {"served_model_name": "x\n[Service]"}, ["upgrade_set", "served_model_name"]),
    ],
    ids=[
        "nothing given",
        "nothing changes",
        "a string",
        "a list",
        "a tag, no digest",
        "a word for a number",
        "a newline",
    ],
)
def test_a_bad_new_stack_is_refused_naming_the_variable(recipe, changes, words):
    with pytest.raises(AnsibleFilterError) as err:
        upgrade_recipe(CURRENT, recipe, changes)
    for word in words:
        assert word in str(err.value), str(err.value)


TAG = "docker.io/vllm/vllm-openai:v0.32.0"


@pytest.mark.parametrize(
    ("allow", "words"),
    [
        (
            False,
            [
                "upgrade_set",
                "vllm_recipe.image",
                "not pinned by digest",
                "serve_allow_unpinned_image: true",
            ],
        ),
        ("sometimes", ["serve_allow_unpinned_image must be true or false", "sometimes"]),
    ],
    ids=["a tag without serve_allow_unpinned_image", "the option not a boolean"],
)
def test_a_tag_follows_serve_allow_unpinned_image(allow, words):
    with pytest.raises(AnsibleFilterError) as err:
        upgrade_recipe(CURRENT, {}, {"image": TAG}, allow)
    for word in words:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize("allow", [True, "yes"])
def test_a_tag_with_serve_allow_unpinned_image_is_the_new_stack(allow):
    assert upgrade_recipe(CURRENT, {}, {"image": TAG}, allow) == {**CURRENT, "image": TAG}
