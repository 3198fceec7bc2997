"""Stand-in for the get-pip script ansible-test downloads from a host that
the lab machines cannot reach: bootstrap pip with ensurepip, then let pip
install what ansible-test asked for from the configured package index.

ansible-test runs this with a filtered environment, so the CA bundle this
machine's pip uses (PIP_CERT) is written into the new venv's own pip.conf,
where every later pip call in that venv finds it.

`make sanity` copies this to ~/.ansible/test/cache/get_pip_<version>.py.
"""

from __future__ import annotations

import ensurepip
import os
import subprocess
import sys

GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

if os.path.exists(CA_BUNDLE):
    with open(os.path.join(sys.prefix, "pip.conf"), "w", encoding="utf-8") as conf:
        conf.write(f"[global]\ncert = {CA_BUNDLE}\n")
ensurepip.bootstrap(upgrade=True)
args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
env = dict(os.environ, PIP_CERT=CA_BUNDLE) if os.path.exists(CA_BUNDLE) else None
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args], env=env))
