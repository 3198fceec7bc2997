# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The site's one call per node: once a node's record of the last whole run holds, its weights
are re-verified and, on the head, every recorded route streams one first token through the
ingress with the key (``stage_result`` state=converged with ``reverify_weights`` and ``stream``,
playbooks/site_converged.yml). One module run per node instead of three is most of what a run
with nothing to do costs (docs/benchmarks.md).

The checks that need a stage's code, the weights' manifest and the engine's token probe, are
handed in by the module (``reverify``, ``first_token``), so common/ imports no stage. What the
record says is schema-checked here before it becomes a URL or a path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    StageResultError,
)

# A route's path prefix as the ingress renders it (/<served-name>): no space, quote or control byte.
_PREFIX = re.compile(r"^/[A-Za-z0-9._~/-]{0,255}\Z")
STREAM_FIX = "the stages run and the ingress stage records its routes again"

Reverify = Callable[[Any, bool], "tuple[str | None, list[str]]"]
FirstToken = Callable[..., "dict[str, Any]"]


def recorded_routes(result: dict[str, Any]) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The routes and TLS the record names (``result.routes``, ``result.tls``), schema-checked."""
    routes, tls = result.get("routes"), result.get("tls", {})
    if not isinstance(routes, list) or not routes:
        raise validate.ValidationError("result.routes", "names no route", STREAM_FIX)
    for index, route in enumerate(routes):
        if not (isinstance(route, dict) and isinstance(route.get("prefix"), str) and _PREFIX.match(route["prefix"])
                and isinstance(route.get("model"), str) and 0 < len(route["model"]) <= 255):
            raise validate.ValidationError(f"result.routes[{index}]", "is not a route (prefix, model)", STREAM_FIX)
    if not isinstance(tls, dict) or not isinstance(tls.get("mode", "off"), str):
        raise validate.ValidationError("result.tls", "is not a mapping with a mode", STREAM_FIX)
    if tls.get("mode", "off") != "off":
        validate.path("result.tls.ca_file", tls.get("ca_file"))
    return routes, tls


def unstreamed(
    result: dict[str, Any], stream: dict[str, Any], first_token: FirstToken
) -> tuple[str | None, list[dict[str, Any]]]:
    """Why the endpoint does not stream through the ingress (one sentence), or None; and the first tokens."""
    try:
        routes, tls = recorded_routes(result)
    except validate.ValidationError as exc:
        return f"its record cannot be streamed from: {exc}", []
    tls_on = tls.get("mode", "off") != "off"
    scheme = "https" if tls_on else "http"
    streamed = []
    for route in routes:
        base = f"{scheme}://127.0.0.1:{stream['port']}{route['prefix']}/v1"
        got = first_token(base, route["model"], stream.get("api_key") or None, stream["timeout"],
                          ca_file=tls["ca_file"] if tls_on else None)
        if not got["ok"]:
            return f"the endpoint did not stream a token through the ingress: {route['model']}: {got['error']}", streamed
        streamed.append({"model": route["model"], "ttft_s": got["ttft_s"]})
    return None, streamed


def check_options(params: dict[str, Any]) -> None:
    """Refuse ``reverify_weights`` and ``stream`` outside state=converged, and a bad ``stream``,
    before anything is read or restored."""
    if params["state"] != "converged" and (params.get("reverify_weights") or params.get("stream")):
        raise StageResultError("reverify_weights and stream are for state=converged (the site's one call per node)")
    if params.get("stream"):
        try:
            validate.port("stream.port", params["stream"]["port"])
            validate.number("stream.timeout", params["stream"]["timeout"], above=0, maximum=3600)
        except validate.ValidationError as exc:
            raise StageResultError(str(exc)) from None


def node_reason(
    result: dict[str, Any],
    params: dict[str, Any],
    check_mode: bool,
    reverify: Reverify | None = None,
    first_token: FirstToken | None = None,
) -> tuple[str | None, dict[str, Any]]:
    """After the record held: the weights (``reverify_weights``), then the stream (``stream``).

    Returns the reason the stages must run (None: nothing to do) and what to add to the result.
    The options were checked by :func:`check_options`.
    """
    out: dict[str, Any] = {}
    if params.get("reverify_weights"):
        if reverify is None:
            raise StageResultError("reverify_weights needs the weights' re-verify (the stage_result module hands it in)")
        reason, restored = reverify(result.get("reverify"), check_mode)
        out["weights_restored"] = restored
        if reason:
            return reason, out
    if params.get("stream"):
        if first_token is None:
            raise StageResultError("stream needs the engine's token probe (the stage_result module hands it in)")
        reason, out["streamed"] = unstreamed(result, params["stream"], first_token)
        if reason:
            return reason, out
    return None, out
