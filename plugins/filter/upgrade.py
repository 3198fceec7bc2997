# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter of the upgrade role: the new stack from what serves and what changes.

- ``upgrade_recipe(current, recipe, changes)``: ``recipe`` (the whole new recipe; empty takes
  ``current``, the inventory's ``vllm_recipe``) with ``changes`` (``upgrade_set``) on top, each
  key checked as the rollout will check it (``_recipe.check``: an image without a digest, a
  newline in a value, a word for a number). Refused, naming the variable: not a mapping, no new
  stack given, or a new stack equal to ``current`` (nothing to upgrade). ``allow_unpinned_image``
  is ``serve_allow_unpinned_image``: a tag alone is let through as the rollout lets it (resolved
  there, once, on the head).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import check
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)

NOTHING_CHANGED = "Nothing was changed."


def _kind(value: Any) -> str:
    """The builtin type's name (Ansible tags its strings with subclasses)."""
    return next(t.__name__ for t in type(value).__mro__ if t.__module__ == "builtins")


def upgrade_recipe(
    current: Any, recipe: Any, changes: Any, allow_unpinned_image: Any = False
) -> dict[str, Any]:
    try:
        allow_unpinned_image = boolean(allow_unpinned_image, strict=True)
    except TypeError:
        raise AnsibleFilterError(
            f"upgrade.yml: serve_allow_unpinned_image must be true or false, got"
            f" {allow_unpinned_image!r}. {NOTHING_CHANGED}"
        ) from None
    for name, value in (
        ("vllm_recipe", current),
        ("upgrade_recipe", recipe),
        ("upgrade_set", changes),
    ):
        if not isinstance(value, dict):
            raise AnsibleFilterError(
                f"upgrade.yml: {name} must be a mapping of recipe keys, got a {_kind(value)}. {NOTHING_CHANGED}"
            )
    if not recipe and not changes:
        raise AnsibleFilterError(
            "upgrade.yml needs the new stack: upgrade_set (the recipe keys that change, e.g. "
            '-e \'{"upgrade_set": {"image": "<registry>/<name>@sha256:<digest>"}}\') or upgrade_recipe '
            f"(the whole recipe, -e @new.yml). {NOTHING_CHANGED}"
        )
    new = {**(recipe or current), **changes}
    try:
        check(new, allow_unpinned_image=allow_unpinned_image)
    except ValidationError as exc:
        source = (
            "upgrade_set"
            if exc.name.split(".")[-1] in changes
            else "upgrade_recipe"
            if recipe
            else "vllm_recipe"
        )
        raise AnsibleFilterError(f"upgrade.yml ({source}): {exc} {NOTHING_CHANGED}") from None
    if new == current:
        given = ", ".join(sorted(changes)) or "upgrade_recipe"
        raise AnsibleFilterError(
            f"upgrade.yml: upgrade_set/upgrade_recipe ({given}) change nothing in vllm_recipe: nothing to upgrade. "
            f"Give the keys that change. {NOTHING_CHANGED}"
        )
    return new


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"upgrade_recipe": upgrade_recipe}
