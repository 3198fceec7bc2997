# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NaN and infinity are refused everywhere a number is read (issue 39, item 2).

``float()`` reads ``'nan'``, ``'inf'`` and ``'1e999'``, YAML reads ``.nan`` and ``.inf``, and
Python's ``json`` reads ``NaN`` and ``Infinity``. A NaN compares false with every limit, so a
check written ``value > limit`` lets it through in silence; an infinity turns into an
``OverflowError`` at the first ``int()``. One row per entry point that reads a number from an
option, a role variable or a node's file: each value must end in a refusal that names the
variable (or the file), never in a traceback or a pass. The qualify gate's ``expected``
figures are rows of ``qualify/test_expected.yaml``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.kv import FilterModule as KvFilters
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._log_text import (
    NotAVllmNumber,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._log_text import (
    number as log_number,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._evidence import (
    Unit,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import _judge
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._busbw import (
    BusbwParseError,
    parse_all_reduce,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._ethtool_facts import (
    sysfs_int,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._client_budget import (
    ClientInputError,
    check_client_limits,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_input import (
    KvInputError,
    normalise_observations,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_model import plan_kv
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    RecipeInputError,
    lint_offload,
    recipe_max_model_len,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._gpu_facts import (
    NvidiaSmiParseError,
    parse_query_csv,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._host_stack import (
    HostStackInputError,
    chrony_offset,
    judge_node,
    limit_bytes,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._judge import (
    PreflightInputError,
    check_thresholds,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    ProcParseError,
    parse_loadavg,
    parse_psi,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify import (
    _load,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._checks import (
    QualifyInputError,
    Target,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._http import (
    Client,
    HttpError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _admission
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    parse_policy,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._stage_checks import (
    StageCheckError,
    judge_load,
)
from ansible_collections.localinference.vllm.plugins.module_utils.tune import _objective, _rules
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog import _hold, _incidents
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._config import (
    ConfigError,
    check_options,
)
from ansible_collections.localinference.vllm.plugins.modules import qualify_report, serving_state
from ansible_collections.localinference.vllm.tests.unit.bad_input.test_bad_input_serving import (
    args_for,
    written,
)
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

NAN, INF = float("nan"), float("inf")
# Each value as it arrives: a float (YAML .nan/.inf, JSON NaN/Infinity) and as text (-e x=nan).
VALUES = [NAN, INF, -INF, "nan", "inf", "1e999"]
# How a validate refusal of those values reads (a float, or text that is no number).
NOT_FINITE = r"(?:(?:-?(?:nan|inf)|'-?(?:nan|inf)'|'1e999') is not a finite number|expected a number, got '(?:nan|inf|1e999)')"
THRESHOLDS = {
    "preflight_min_free_memory_gib": 4,
    "preflight_max_swap_used_percent": 50,
    "preflight_max_psi_some_avg10": 10,
    "preflight_min_shm_free_gib": 1,
    "preflight_max_load_per_cpu": 4,
}
HOST_STACK_OPTIONS = {
    "preflight_rdma": "auto",
    "preflight_max_clock_offset_seconds": 1.0,
    "preflight_weights_reserve_gib": 10,
    "preflight_weights_bytes": 0,
    "preflight_recipe": {},
}
OBSERVATIONS = [{"max_model_len": 262144, "kv_tokens": 285336, "kv_memory_gib": 8.59}]
BUSBW_HEADER = (
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
    "     time   algbw   busbw  #wrong\n"
)


def _busbw(busbw: str, error: str = "0") -> str:
    row = f"  1073741824     268435456     float     sum      -1   100.0   10.74   {busbw}   {error}"
    return BUSBW_HEADER + row + "   100.0   10.74   20.13   0\n"


def _text(value: Any) -> str:
    """The value as a node's file or a command line has it."""
    return str(value)


def _float(value: Any) -> float:
    """The value as a module option of type float has it (Ansible converts 'nan' and 'inf')."""
    return float(value)


def _admission_main(value: Any, flag: str) -> None:
    given = [f"{flag}={_text(value)}"]  # '=': '-inf' alone would read as an option
    need = given if flag == "--need-gib" else ["--need-gib=1", *given]
    _admission.main([*need, "--host", "n", "--proc-root", "/nonexistent"])


def _refused(module, args: dict[str, Any]) -> None:
    """Run the module; its refusal as a RefusedError, its success as a silent pass."""
    out = run_module(module, args)
    if not out.failed:
        pytest.fail(f"silent success: {out.result}")
    raise RefusedError(out.result["msg"])


class RefusedError(Exception):
    """A module's fail_json message."""


def _serving_state(tmp_path, value: Any) -> None:
    try:
        _refused(serving_state, args_for(tmp_path, "staged", checks={"max_load_per_cpu": _float(value)}))
    finally:
        assert written(tmp_path) == [], "refused before anything is written"


def _qualify_report(tmp_path, value: Any) -> None:
    report = {"dest": str(tmp_path / "report"), "model": "m", "endpoint": "http://h:8080/v1"}
    _refused(qualify_report, {"checks": [], **report, "reserve_gib": _float(value)})


# (entry point, call(value, tmp_path), the refusal's type, pattern naming the variable or file)
CASES: list[tuple[str, Callable[[Any, Any], Any], type[BaseException], str]] = [
    ("preflight thresholds (filter preflight_rank)",
     lambda v, t: check_thresholds(THRESHOLDS | {"preflight_max_load_per_cpu": v}),
     PreflightInputError, r"^preflight_max_load_per_cpu: .*(not a finite number|expected a number)"),
    ("host-stack options (filter preflight_rank)",
     lambda v, t: judge_node({}, {}, HOST_STACK_OPTIONS | {"preflight_max_clock_offset_seconds": v}),
     HostStackInputError, r"^preflight_max_clock_offset_seconds: .*not a finite number"),
    ("host-stack weights reserve",
     lambda v, t: judge_node({}, {}, HOST_STACK_OPTIONS | {"preflight_weights_reserve_gib": v}),
     HostStackInputError, r"^preflight_weights_reserve_gib: .*not a finite number"),
    ("qualify_check params (load checks)",
     lambda v, t: _load._number(Target(None, "m", params={"max_stall_s": v}), "max_stall_s", 2.0),
     QualifyInputError, r"^params\.max_stall_s: .*(not a finite number|is below 0)"),
    ("qualify_check params (Target.param)",
     lambda v, t: Target(None, "m", params={"x": v}).param("x", 1.0),
     QualifyInputError, r"^params\.x must be (a finite number|float), got"),
    ("qualify_check timeout",
     lambda v, t: Client("http://127.0.0.1:1/v1", None, _float(v)),
     HttpError, r"^timeout must be a positive, finite number of seconds"),
    ("serving_state checks.max_load_per_cpu (serve_max_load_per_cpu)",
     lambda v, t: _serving_state(t, v),
     RefusedError, r"^checks\.max_load_per_cpu: .*not a finite number; .*serve_max_load_per_cpu"),
    ("/proc/loadavg in staging's load check",
     lambda v, t: judge_load(f"{_text(v)} 0.1 0.1 1/2 3\n", 2, 4.0, "spark-head"),
     StageCheckError, r"^spark-head: /proc/loadavg is unreadable"),
    ("admission --need-gib",
     lambda v, t: _admission_main(v, "--need-gib"), SystemExit, r"^2$"),
    ("admission --reserve-gib",
     lambda v, t: _admission_main(v, "--reserve-gib"), SystemExit, r"^2$"),
    ("recipe lint max_model_len (kv_budget, doctor)",
     lambda v, t: recipe_max_model_len({"max_model_len": v}),
     RecipeInputError, r"^recipe\.max_model_len: .*(not a finite number|expected a number)"),
    ("recipe lint kv_offloading_size",
     lambda v, t: lint_offload({"kv_offloading_size": v}, None),
     RecipeInputError, r"^recipe\.kv_offloading_size must be GiB as a finite number"),
    ("nccl-tests busbw column",
     lambda v, t: parse_all_reduce(_busbw(_text(v))),
     BusbwParseError, r"the row of 1073741824 bytes has busbw=.*not a measured bandwidth"),
    ("nccl-tests #wrong/error column",
     lambda v, t: parse_all_reduce(_busbw("20.13", _text(v))),
     BusbwParseError, r"^wrong results at sizes \[1073741824\]"),
    ("qualify_report reserve_gib",
     lambda v, t: _qualify_report(t, v),
     RefusedError, r"^reserve_gib: .*not a finite number"),
    ("filter kv_tokens_for memory_gib",
     lambda v, t: KvFilters().filters()["kv_tokens_for"](OBSERVATIONS, 262144, memory_gib=v),
     AnsibleFilterError, r"^memory_gib: .*(not a finite number|is below 0)"),
    # the entry points whose private number helper went to common/_validate (issue 39, item 2)
    ("kv observations kv_memory_gib (saved boots, kv_budget)",
     lambda v, t: normalise_observations([OBSERVATIONS[0] | {"kv_memory_gib": v}]),
     KvInputError, rf"^observations\[0\]\.kv_memory_gib: {NOT_FINITE}"),
    ("kv observations kv_tokens (a count)",
     lambda v, t: normalise_observations([OBSERVATIONS[0] | {"kv_tokens": v}]),
     KvInputError, rf"^observations\[0\]\.kv_tokens: {NOT_FINITE}"),
    ("kv plan min_concurrency",
     lambda v, t: plan_kv(OBSERVATIONS, min_concurrency=v),
     KvInputError, rf"^min_concurrency: {NOT_FINITE}"),
    ("opencode config limit.context (client_limits)",
     lambda v, t: check_client_limits({"context": v, "output": 1}, 4096, None),
     ClientInputError, rf"^client_limits\.context: {NOT_FINITE}; set a whole number of tokens"),
    ("cluster_network_mtu",
     lambda v, t: _judge.config({"interfaces": [{"ifname": "eth0", "address": "10.0.0.1/24"}], "mtu": v}),
     _judge.FabricInputError, r"^cluster_network_mtu: expected an integer, got "),
    ("/proc/loadavg (memory_facts)",
     lambda v, t: parse_loadavg(f"{_text(v)} 0.1 0.1 1/2 3"),
     ProcParseError, rf"^loadavg 1m: {NOT_FINITE}; not the file the kernel writes"),
    ("/proc/pressure/memory (memory_facts)",
     lambda v, t: parse_psi(f"some avg10={_text(v)} avg60=0 avg300=0 total=0\n"),
     ProcParseError, rf"^PSI some avg10: {NOT_FINITE}"),
    ("nvidia-smi GPU index",
     lambda v, t: parse_query_csv(f"{_text(v)}, a, b, 1, 1, 1, x, y"),
     NvidiaSmiParseError, r"^GPU index: '.*' is not a number; not the nvidia-smi output asked for"),
    ("admission cgroup memory.max",
     lambda v, t: _admission.cgroup_headroom("v2", ["/cg"], read=lambda p: _text(v) if p.endswith(".max") else "0"),
     _admission.AdmissionError, r"^/cg/memory\.max: '.*' is not a number"),
    ("guards.max_gpu_memory_utilization (serve_max_gpu_memory_utilization)",
     lambda v, t: parse_policy({"max_gpu_memory_utilization": v}),
     validate.ValidationError, rf"^guards\.max_gpu_memory_utilization .*: {NOT_FINITE}; set a fraction such as 0\.85"),
    ("watchdog options interval_s (filter watchdog_options)",
     lambda v, t: check_options({"interval_s": v}),
     ConfigError, rf"^watchdog_interval_s: {NOT_FINITE}; set a number between 1 and 3600"),
    ("vLLM log numbers (vllm_log_facts)",
     lambda v, t: log_number(_text(v)), NotAVllmNumber, rf"^vLLM number: {NOT_FINITE}"),
    ("incident seconds (watchdog)",
     lambda v, t: _incidents.incident("down", "e", "none", "detected", now=0.0, detect_seconds=v),
     validate.ValidationError, rf"^seconds: {NOT_FINITE}"),
    ("tune batch budget",
     lambda v, t: _rules._budget({"max_num_batched_tokens": v}),
     validate.ValidationError, rf"^max_num_batched_tokens: {NOT_FINITE}"),
]  # fmt: skip

# Readers for which NaN or infinity is "no value" (a figure a program wrote, a kernel's or a
# tool's text): the reader answers it, never passes it on as a number.
NO_VALUE: list[tuple[str, Callable[[Any], Any], Any]] = [
    ("watchdog hold file deadline", lambda v: _hold.parse(f"{_text(v)} qualify"), None),
    ("sysfs number (ethtool_facts mtu)", lambda v: sysfs_int(_text(v)), None),
    ("doctor evidence number", lambda v: Unit("u", {"k": _text(v)}).number("k"), None),
    ("memlock limit (host_stack)", lambda v: limit_bytes(_text(v)), -1),
    ("chronyc System time", lambda v: chrony_offset({"System time": f"{_text(v)} seconds fast of NTP time"}), None),
    ("a figure a program wrote (validate.finite)", lambda v: validate.finite(v), None),
    ("tune objective figure", lambda v: _objective.score({"decode_tps_single": v}, {"decode_tps_single": 2.0}, {"decode_tps_single": 1.0})[0], 0.0),
]  # fmt: skip


@pytest.mark.parametrize("value", VALUES, ids=["nan", "inf", "-inf", "'nan'", "'inf'", "'1e999'"])
@pytest.mark.parametrize(("call", "error", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_nan_and_infinity_are_refused(call, error, pattern, value, tmp_path, capsys):
    try:
        call(value, tmp_path)
    except error as exc:
        message = str(exc) if not isinstance(exc, SystemExit) else str(exc.code)
        assert re.search(pattern, message), message
        if isinstance(exc, SystemExit):  # argparse names the flag on stderr
            assert re.search(r"argument --(need|reserve)-gib: .*not a finite number of GiB", capsys.readouterr().err)
        return
    except Exception as exc:  # the point is to catch every traceback
        pytest.fail(f"traceback instead of a refusal: {type(exc).__name__}: {exc}")
    pytest.fail(f"{value!r} was accepted")


@pytest.mark.parametrize("value", VALUES, ids=["nan", "inf", "-inf", "'nan'", "'inf'", "'1e999'"])
@pytest.mark.parametrize(("read", "none"), [c[1:] for c in NO_VALUE], ids=[c[0] for c in NO_VALUE])
def test_nan_and_infinity_read_as_no_value(read, none, value):
    assert read(value) == none


def test_finite_values_still_pass():
    """The same entry points take an ordinary number."""
    assert check_thresholds(THRESHOLDS)["preflight_max_load_per_cpu"] == 4.0
    assert judge_load("0.5 0.1 0.1 1/2 3\n", 2, 4.0, "n")["load1"] == 0.5
    assert _load._number(Target(None, "m", params={"max_stall_s": 1}), "max_stall_s", 2.0) == 1.0
    assert recipe_max_model_len({"max_model_len": 4096.0}) == 4096
    assert [f["id"] for f in lint_offload({"kv_offloading_size": 1}, None)] == ["F16"]
    assert parse_all_reduce(_busbw("20.13"))["busbw_gbps"] == 20.13
    assert not math.isnan(KvFilters().filters()["kv_tokens_for"](OBSERVATIONS, 262144, memory_gib=8.59))
