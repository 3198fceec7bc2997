# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``qualify_report``: the qualification's report, built from the checks and written on the controller.

The verdict and its reasons are ``_report.build``'s, the Markdown its ``markdown``,
the plots ``_plots.draw``'s; here the options are checked and ``dest`` is written
(report.json, report.md, the plots; the plots of an earlier run are removed first), never
in check mode.

No AnsibleModule here: ``module`` is the caller's (``params``, ``check_mode``, ``fail_json``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._plots import (
    PlotError,
    draw,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._report import (
    ReportInputError,
    build,
    markdown,
)


def run(module: Any) -> dict[str, Any]:
    """The report built, and written into ``dest`` outside check mode; bad input ends the module."""
    p = module.params
    try:  # a NaN reserve compares false with every figure: it would hold nothing
        validate.number("reserve_gib", p["reserve_gib"], minimum=0)
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    if not 0 <= p["tolerance"] < 1:  # also refuses NaN
        module.fail_json(msg=f"tolerance must be in [0, 1), got {p['tolerance']}")
    try:
        report = build(
            p["checks"],
            model=p["model"],
            endpoint=p["endpoint"],
            recipe_hash=p["recipe_hash"],
            expected=p["expected"],
            metrics_before=p["metrics_before"],
            metrics_after=p["metrics_after"],
            log_text=p["log_text"],
            nodes=p["nodes"],
            reserve_gib=p["reserve_gib"],
            promoted=p["promoted"],
            tolerance=p["tolerance"],
            plan=p["plan"],
        )
    except ReportInputError as err:
        module.fail_json(msg=f"qualify_report: {err}")
    files: list[str] = []
    if not module.check_mode:
        dest = p["dest"]
        try:
            os.makedirs(dest, exist_ok=True)
            for name in os.listdir(dest):  # plots of an earlier run that has no data now
                if name.endswith(".png"):
                    os.remove(os.path.join(dest, name))
            plots = draw(report, dest) if p["plots"] else []
        except PlotError as err:
            module.fail_json(msg=f"qualify_report: {err}")
        except OSError as err:
            module.fail_json(msg=f"qualify_report: cannot write into {dest}: {err}")
        report["plots"] = plots
        for name, text in (
            ("report.json", json.dumps(report, indent=2, sort_keys=True, default=str) + "\n"),
            ("report.md", markdown(report, plots)),
        ):
            path = os.path.join(dest, name)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
            files.append(path)
        files += [os.path.join(dest, name) for name in plots]
    return {
        "changed": not module.check_mode,
        "verdict": report["verdict"],
        "reasons": report["reasons"],
        "report": report,
        "files": files,
    }
