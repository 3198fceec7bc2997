# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad input for quadlet_verify: its options, the unit directory and the generator's output.

The generator is a small shell script standing in for Podman's ``quadlet -dryrun`` (the
real one is exercised by tests/unit/plugins/modules/test_quadlet_verify.py where it
exists), so every failure mode of its output can be produced here.  Each case must end
in a failure naming the offending input; never a traceback, never a success on nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.modules import quadlet_verify
from ansible_collections.localinference.vllm.tests.unit.bad_input.test_bad_input_serving import (
    DIGEST,
    assert_refused,
    run,
)


def fake_quadlet(tmp_path, stdout="", stderr="", rc=0, sleep=0):
    tool = tmp_path / "tool"
    tool.mkdir(exist_ok=True)
    (tool / "out.txt").write_text(stdout)
    (tool / "err.txt").write_text(stderr)
    script = tool / "quadlet"
    script.write_text(
        f'#!/bin/sh\ncat "$(dirname "$0")/out.txt"\ncat "$(dirname "$0")/err.txt" >&2\nsleep {sleep}\nexit {rc}\n'
    )
    script.chmod(0o755)
    return str(script)


def unit_dir(tmp_path, names=("localinference-vllm.container",)):
    units = tmp_path / "units"
    units.mkdir(exist_ok=True)
    for name in names:
        (units / name).write_text("[Container]\nImage=x@" + DIGEST + "\n")
    return str(units)


def service(argv):
    return f"---localinference-vllm.service---\n[Service]\nExecStart={argv}\n"


PODMAN = "/usr/bin/podman run --name localinference-vllm"
QUADLET_CASES = [
    ("generator-missing", lambda t: {"unit_dir": unit_dir(t), "quadlet": str(t / "nope")},
     r"quadlet: .*/nope is not an executable file; Quadlet needs Podman 4\.4"),
    ("generator-directory", lambda t: {"unit_dir": unit_dir(t), "quadlet": str(t)},
     r"quadlet: .* is not an executable file"),
    ("generator-not-executable", lambda t: {"unit_dir": unit_dir(t), "quadlet": _plain_file(t)},
     r"quadlet: .*/plain is not an executable file"),
    ("generator-exec-format", lambda t: {"unit_dir": unit_dir(t), "quadlet": _bad_binary(t)},
     r"quadlet: .*/bad cannot be run \(Exec format error\)"),
    ("unit-dir-missing", lambda t: {"unit_dir": str(t / "none"), "quadlet": fake_quadlet(t)},
     r"unit_dir: .*/none does not exist"),
    ("unit-dir-file", lambda t: {"unit_dir": _plain_file(t), "quadlet": fake_quadlet(t)},
     r"unit_dir: .*/plain is not a directory"),
    ("unit-dir-empty", lambda t: {"unit_dir": unit_dir(t, ()), "quadlet": fake_quadlet(t)},
     r"unit_dir: .*/units holds no \.container file"),
    ("unit-is-directory", lambda t: {"unit_dir": _dir_unit(t), "quadlet": fake_quadlet(t)},
     r"unit_dir: .*/x\.container is not a regular file"),
    ("generator-fails-silently", lambda t: {"unit_dir": unit_dir(t), "quadlet": fake_quadlet(t, rc=1)},
     r"rejected the units in .*: no diagnostics, exit code 1"),
    ("generator-rejects", lambda t: {"unit_dir": unit_dir(t), "quadlet": fake_quadlet(t, stderr="converting \"x.container\": unsupported key 'Ipc'\n", rc=1)},
     r"rejected the units .*unsupported key 'Ipc'"),
    ("generator-unbalanced-quote", lambda t: {"unit_dir": unit_dir(t), "quadlet": fake_quadlet(t, service(f'{PODMAN} "x@{DIGEST}'))},
     r"ExecStart= for localinference-vllm\.service is unreadable: cannot split .*No closing quotation"),
    ("generator-no-service", lambda t: {"unit_dir": unit_dir(t), "quadlet": fake_quadlet(t, "nothing\n")},
     r"produced no service for localinference-vllm\.container"),
    ("generator-no-execstart", lambda t: {"unit_dir": unit_dir(t), "quadlet": fake_quadlet(t, "---localinference-vllm.service---\n[Service]\n")},
     r"produced no ExecStart= for localinference-vllm\.service"),
    ("generator-hangs", lambda t: {"unit_dir": unit_dir(t), "quadlet": fake_quadlet(t, sleep=30), "timeout": 0.5},
     r"quadlet: quadlet did not answer within 0\.5 s .*raise timeout only if"),
    ("timeout-zero", lambda t: {"unit_dir": unit_dir(t), "quadlet": fake_quadlet(t), "timeout": 0},
     r"timeout must be a positive, finite number of seconds, got 0"),
    ("timeout-inf", lambda t: {"unit_dir": unit_dir(t), "quadlet": fake_quadlet(t), "timeout": "inf"},
     r"timeout must be a positive, finite number of seconds, got inf"),
    ("generator-f14", lambda t: {"unit_dir": unit_dir(t), "quadlet": fake_quadlet(t, service(f"{PODMAN} --ipc=host --shm-size 1g x@{DIGEST} serve"))},
     r"localinference-vllm\.service: F14: .*--ipc=host and --shm-size"),
    ("generator-f17", lambda t: {"unit_dir": unit_dir(t), "quadlet": fake_quadlet(t, service(f"{PODMAN} --privileged x@{DIGEST} serve"))},
     r"localinference-vllm\.service: F17: .*--privileged"),
]  # fmt: skip


def _plain_file(tmp_path):
    (tmp_path / "plain").write_text("x")
    return str(tmp_path / "plain")


def _bad_binary(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x00\x01\x02 not an executable format")
    bad.chmod(0o755)
    return str(bad)


def _dir_unit(tmp_path):
    units = Path(unit_dir(tmp_path))
    (units / "x.container").mkdir()
    return str(units)


@pytest.mark.parametrize(
    "make_args", [c[1] for c in QUADLET_CASES], ids=[c[0] for c in QUADLET_CASES]
)
def test_quadlet_verify_refuses(tmp_path, make_args):
    pattern = next(c[2] for c in QUADLET_CASES if c[1] is make_args)
    out = run(quadlet_verify, make_args(tmp_path))
    assert_refused(out, pattern)
    assert isinstance(out.result["findings"], list)


def test_quadlet_verify_reads_a_good_generator_output(tmp_path):
    """The fake generator is faithful enough: a clean command line passes."""
    out = run(
        quadlet_verify,
        {
            "unit_dir": unit_dir(tmp_path),
            "quadlet": fake_quadlet(tmp_path, service(f"{PODMAN} x@{DIGEST} serve --privileged")),
        },
    )
    assert not out.failed, out.result
    assert out.result["services"]["localinference-vllm.service"]["exec_start"][-1] == "--privileged"
