"""Stand-in for the get-pip script ansible-test downloads from a host that
the lab machines cannot reach: bootstrap pip with ensurepip, then let pip
install what ansible-test asked for from the configured package index.

`make sanity` copies this to ~/.ansible/test/cache/get_pip_<version>.py.
"""

from __future__ import annotations

import ensurepip
import subprocess
import sys

GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}

ensurepip.bootstrap(upgrade=True)
args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
