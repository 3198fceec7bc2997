# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The hosts of every stage play, in one place.

- ``work_hosts``: a play's host pattern, or none once ``site.yml`` found nothing to do
  (``playbooks/site_converged.yml`` sets ``localinference_nothing_to_do`` on localhost;
  the upgrade sets it after a promotion). Every stage play names its hosts through it:
  ``hosts: "{{ 'vllm_cluster' | localinference.vllm.work_hosts(hostvars | default({})) }}"``.
  ``hostvars`` is undefined while the first play of a run is templated (nothing has set the
  switch yet): ``default({})`` says so, and the pattern stands.
- ``trial_hosts``: the upgrade's own plays (begin, decide, report): none while the tune's slot
  has no trial (``playbooks/tune.yml`` sets ``localinference_tune_idle`` on localhost), so a
  promoted upgrade still reports. Stage plays are idle then too: ``work_hosts`` honours both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

SWITCH = "localinference_nothing_to_do"
TUNE_SWITCH = "localinference_tune_idle"


def _switched(hostvars: Mapping[str, Any], name: str) -> bool:
    switch = (hostvars.get("localhost") or {}).get(name, False)
    try:
        return boolean(switch, strict=True)
    except TypeError:
        raise AnsibleFilterError(
            f"{name} must be true or false, got {str(switch)[:40]!r}: it is set by playbooks/site.yml "
            "(nothing to do) or playbooks/tune.yml (no trial), never by hand"
        ) from None


def _check(pattern: Any, hostvars: Any, name: str) -> None:
    if not isinstance(pattern, str) or not pattern.strip():
        raise AnsibleFilterError(f"{name}: the host pattern must be a non-empty string, got {pattern!r}")
    if not isinstance(hostvars, Mapping):
        raise AnsibleFilterError(
            f"{name}: pass hostvars | default({{}}) as its argument, got {type(hostvars).__name__}"
        )


def work_hosts(pattern: Any, hostvars: Any) -> str | list[str]:
    """``pattern`` while there is work to do, else no host at all (``[]``)."""
    _check(pattern, hostvars, "work_hosts")
    return [] if _switched(hostvars, SWITCH) or _switched(hostvars, TUNE_SWITCH) else pattern


def trial_hosts(pattern: Any, hostvars: Any) -> str | list[str]:
    """``pattern`` unless the tune's slot has no trial (``[]``)."""
    _check(pattern, hostvars, "trial_hosts")
    return [] if _switched(hostvars, TUNE_SWITCH) else pattern


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"work_hosts": work_hosts, "trial_hosts": trial_hosts}
