# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``qualify_check``: one qualification check run against the served endpoint, ``repeat`` times.

The target is the endpoint, its served model (asked when not given) and its ``/metrics``;
the check itself is ``_run.run_check``'s. Repeated, a check passes only when every
run passes: the first failing run is the verdict, with the count of passes.

No AnsibleModule here: ``module`` is the caller's (``params``, ``fail_json``).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.qualify._checks import (
    QualifyInputError,
    Target,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._http import (
    Client,
    HttpError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._judge import (
    FAIL,
    PASS,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._run import (
    run_check,
)


def default_metrics_url(base_url: str) -> str:
    """The engine's /metrics beside its OpenAI base URL (``.../v1`` -> ``.../metrics``)."""
    parts = urllib.parse.urlsplit(base_url.rstrip("/"))
    path = parts.path[: -len("/v1")] if parts.path.endswith("/v1") else parts.path
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path + "/metrics", "", ""))


def served_model(client: Client) -> str:
    """The first model the endpoint serves (``GET models``), or an HttpError saying what to give."""
    response = client.request("GET", "models")
    data = (response.json() or {}).get("data") if response.status == 200 else None
    if not data or not isinstance(data[0], dict) or not data[0].get("id"):
        raise HttpError(
            f"GET {response.url} answered HTTP {response.status} without a model"
            f" ({response.error_message()[:200]}): give model, or check base_url and api_key"
        )
    return data[0]["id"]


def run(module: Any) -> dict[str, Any]:
    """One check, ``repeat`` times, against the endpoint; bad options or an unreachable endpoint end the module."""
    p = module.params
    if p["repeat"] < 1:
        module.fail_json(msg=f"repeat must be at least 1, got {p['repeat']}")
    if p["max_model_len"] is not None and p["max_model_len"] < 1:
        module.fail_json(msg=f"max_model_len must be positive, got {p['max_model_len']}")
    try:
        client = Client(p["base_url"], p["api_key"], p["timeout"], ca_file=p["ca_path"])
        model = p["model"] or served_model(client)
    except HttpError as err:
        module.fail_json(msg=f"qualify_check {p['check']}: {err}")
    metrics_url = p["metrics_url"]
    if metrics_url is None:
        metrics_url = default_metrics_url(p["base_url"])
    target = Target(
        client=client,
        model=model,
        max_model_len=p["max_model_len"],
        metrics_url=metrics_url or None,
        limitation=p["model_limitation"] or None,
        params=p["params"],
    )
    runs = []
    try:
        for _ in range(p["repeat"]):
            runs.append(run_check(p["check"], target))
    except QualifyInputError as err:
        module.fail_json(msg=f"qualify_check {p['check']}: {err}")
    out = dict(runs[-1])
    if len(runs) > 1:
        passes = sum(run["status"] == PASS for run in runs)
        failed = [run for run in runs if run["status"] == FAIL]
        if failed:
            out = dict(failed[0])
            out["why"] = f"passed {passes} of {len(runs)} runs; a failing run: {failed[0]['why']}"
        out["runs"] = [{"status": run["status"], "why": run["why"]} for run in runs]
        out["evidence"] = {**out["evidence"], "passes": passes, "repeat": len(runs)}
    return {"changed": False, "model": model, **out}
