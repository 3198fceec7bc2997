"""Make the checkout importable as ``ansible_collections.localinference.vllm``.

Unit tests import the collection the way Ansible does.  The link lives in
.lab/ (ignored by git); ``make bootstrap`` creates it too.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
COLLECTIONS = ROOT / ".lab" / "collections"
LINK = COLLECTIONS / "ansible_collections" / "localinference" / "vllm"

if not LINK.exists():
    LINK.parent.mkdir(parents=True, exist_ok=True)
    LINK.symlink_to(ROOT, target_is_directory=True)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
