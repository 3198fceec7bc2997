# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write docs/grafana/localinference.json from the monitoring's one source.

    .venv/bin/python tools/monitoring_dashboard.py          # write it
    .venv/bin/python tools/monitoring_dashboard.py --check  # exit 1 when it differs

The panels and their PromQL are ``PANELS`` in
``plugins/module_utils/monitoring/_rules.py`` (beside the alerts); the JSON is
the filter ``localinference.vllm.monitoring_dashboard`` with the role's defaults,
so the committed file is what a run of the role with ``monitoring_dashboard_file``
writes when the thresholds are left alone. A unit test keeps the two equal.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "grafana" / "localinference.json"


def generated() -> str:
    """The dashboard's JSON text, imported the way Ansible imports the collection."""
    collections = ROOT / ".lab" / "collections"
    link = collections / "ansible_collections" / "localinference" / "vllm"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT, target_is_directory=True)
    sys.path.insert(0, str(collections))
    monitoring = importlib.import_module(
        "ansible_collections.localinference.vllm.plugins.filter.monitoring"
    )
    return monitoring.monitoring_dashboard()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    text = generated()
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET.relative_to(ROOT)} differs: run python tools/monitoring_dashboard.py")
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
