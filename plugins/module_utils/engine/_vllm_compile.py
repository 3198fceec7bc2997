# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether the engine's own log shows a kernel compile in progress.

A kernel compile in the middle of serving (the first time a shape is seen) stalls every rank
until it ends; vLLM gives it ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` (300 s by default,
``vllm/envs.py``) before it declares the engine dead. A watchdog that restarts a compiling
engine throws the compile away and meets it again. Pure: the latest lines of the engine's
journal in, ``{compiling, what, line}`` out. The lines and their sources:
``tests/unit/plugins/module_utils/engine/test_vllm_compile.yaml``.

The latest line that says something about a compile decides:

- started: vLLM's JIT monitor (``CuTeDSL``/``TileLang JIT compilation during inference: K``,
  logged before the compile; ``Triton kernel JIT compilation during inference: K``, logged
  after one kernel of a burst), FlashInfer's cold-cache JIT, torch.compile's start (its cache
  directory, Dynamo's bytecode transform), CUDA graph capture;
- ended: torch.compile's totals, a compiled graph loaded from the cache, the graph capture's
  end, the engine's warm-up total and its JIT monitor's start (warm-up done), tokens generated (a stats line with a generation throughput
  above zero) or the engine's death (``RPC call to … timed out``, ``EngineDeadError``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_stats import (
    parse_stats,
)

EXECUTE_MODEL_TIMEOUT_ENV = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
EXECUTE_MODEL_TIMEOUT_S = 300.0  # vLLM's default (vllm/envs.py)

_STARTED = (
    re.compile(r"\b(CuTeDSL|TileLang) JIT compilation during inference: ([\w.]+?)\.?(?:\s|$)"),
    re.compile(r"\b(Triton) kernel JIT compilation during inference: ([\w.]+?)\.?(?:\s|$)"),
    re.compile(r"\b(FlashInfer) .{0,160}?cold cache JIT-compile may take several minutes()"),
    re.compile(r"Using cache directory: \S+ for vLLM's (torch\.compile)()"),
    re.compile(r"(Dynamo) bytecode transform time()"),
    re.compile(r"(Capturing CUDA graphs)()"),
)
_ENDED = re.compile(
    r"torch\.compile takes [\d.]+ s in total|Compiling a graph for .{0,80}? takes [\d.]+ s"
    r"|Directly load the compiled graph|Graph capturing finished in"
    r"|init engine \(profile, create kv cache, warmup model\) took|Kernel JIT monitor activated"
    r"|RPC call to \w+ timed out|EngineDeadError"
)


def _progress(line: str) -> bool:
    stats = parse_stats(line)
    return bool(stats and (stats.get("generation_throughput") or 0) > 0)


def compile_state(lines: Iterable[str]) -> dict[str, Any]:
    """The engine's latest lines -> ``{compiling, what, line}``: whether the latest line about a
    compile says one started and nothing after it says it ended."""
    state: dict[str, Any] = {"compiling": False, "what": None, "line": None}
    for line in lines:
        for pattern in _STARTED:
            match = pattern.search(line)
            if match:
                what = " ".join(part for part in match.groups() if part).strip()
                state = {"compiling": True, "what": what[:120], "line": line.strip()[:300]}
                break
        else:
            if _ENDED.search(line) or _progress(line):
                state = {"compiling": False, "what": None, "line": line.strip()[:300]}
    return state


def execute_model_budget(env: Mapping[str, Any] | None) -> float:
    """Seconds vLLM gives one model step before it declares the engine dead: the recipe's
    ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` or vLLM's default."""
    value = (env or {}).get(EXECUTE_MODEL_TIMEOUT_ENV)
    if value is None:
        return EXECUTE_MODEL_TIMEOUT_S
    return validate.number(f"vllm_recipe.env.{EXECUTE_MODEL_TIMEOUT_ENV}", value, above=0)
