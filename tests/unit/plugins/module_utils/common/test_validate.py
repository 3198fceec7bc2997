# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The shared validators: accepted values keep (or canonicalise) their form, refused ones
name the variable, the offending character or value, and the fix."""

from __future__ import annotations

import re

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _validate as v

DIGEST = "sha256:" + "ab" * 32

ACCEPTED = [
    (v.text, {}, "deepseek-v4-flash", "deepseek-v4-flash"),
    (v.text, {}, 'a b "c" $HOME 50%', 'a b "c" $HOME 50%'),
    (v.text, {}, 4096, "4096"),
    (v.text, {"allow_empty": True}, "", ""),
    (v.systemd_value, {}, "nvidia.com/gpu=0", "nvidia.com/gpu=0"),
    (v.image_reference, {}, "localhost/vllm-cpu@" + DIGEST, "localhost/vllm-cpu@" + DIGEST),
    (
        v.image_reference,
        {},
        "registry.example:5000/vllm/vllm-openai:v0.32.0@" + DIGEST,
        "registry.example:5000/vllm/vllm-openai:v0.32.0@" + DIGEST,
    ),
    (
        v.image_reference,
        {"require_digest": False},
        "vllm/vllm-openai:latest",
        "vllm/vllm-openai:latest",
    ),
    (v.path, {}, "/srv/models/hub", "/srv/models/hub"),
    (v.path, {}, "/srv/models/hub/", "/srv/models/hub"),
    (v.path, {}, "/", "/"),
    (
        v.path,
        {"under": ("/etc/containers/systemd",)},
        "/etc/containers/systemd/x.container",
        "/etc/containers/systemd/x.container",
    ),
    (v.path, {"allow_empty": True}, "", ""),
    (v.device, {}, "nvidia.com/gpu=0", "nvidia.com/gpu=0"),
    (v.device, {}, "nvidia.com/gpu=all", "nvidia.com/gpu=all"),
    (v.device, {}, "nvidia.com/gpu=0:1", "nvidia.com/gpu=0:1"),
    (v.device, {}, "/dev/infiniband/", "/dev/infiniband"),
    (v.device, {}, "-/dev/nvidia0", "-/dev/nvidia0"),
    (v.device, {}, "/dev/nvidia0:rw", "/dev/nvidia0:rw"),
    (v.device, {}, "/dev/nvidia0:/dev/nvidia1:rwm", "/dev/nvidia0:/dev/nvidia1:rwm"),
    (v.interface_name, {}, "enp1s0f0np0", "enp1s0f0np0"),
    (v.interface_name, {}, "a" * 15, "a" * 15),
    (v.interface_name, {}, "br-lab.100", "br-lab.100"),
    (v.unit_name, {}, "localinference-vllm.service", "localinference-vllm.service"),
    (v.unit_name, {}, "getty@tty1.service", "getty@tty1.service"),
    (v.host, {}, "10.77.0.11", "10.77.0.11"),
    (v.host, {}, "fe80::1", "fe80::1"),
    (v.host, {}, "[fe80::1]", "fe80::1"),
    (v.host, {}, "spark-head", "spark-head"),
    (v.host, {}, "gpu_node_1.lab.example.", "gpu_node_1.lab.example."),
    (v.host, {"allow_empty": True}, "", ""),
    (v.env_name, {}, "RAY_memory_monitor_refresh_ms", "RAY_memory_monitor_refresh_ms"),
    (v.env_value, {}, "", ""),
    (v.env_value, {}, 2, "2"),
    (v.port, {}, "8000", 8000),
    (v.port, {}, 65535, 65535),
    (v.integer, {"minimum": 1}, "4_096", 4096),
    (v.integer, {"maximum": 10}, 10, 10),
    (v.number, {"above": 0, "maximum": 1}, 0.85, 0.85),
    (v.number, {}, "8", 8.0),
    (v.size, {}, "1g", "1g"),
    (v.size, {}, "1073741824", "1073741824"),
    (v.size, {}, "512MiB", "512MiB"),
]


def ids(cases: list[tuple]) -> list[str]:
    return [f"{case[0].__name__}-{index}" for index, case in enumerate(cases)]


@pytest.mark.parametrize(("function", "kwargs", "value", "expected"), ACCEPTED, ids=ids(ACCEPTED))
def test_accepted(function, kwargs, value, expected):
    assert function("x", value, **kwargs) == expected


NL = "deepseek\n[Service]\nExecStartPre=/bin/touch /tmp/pwned"
REFUSED = [
    # (function, kwargs, value, pattern the message must match after "var: ")
    (v.text, {}, NL, r"contains '\\n' \(a line break\) at position 8; remove it"),
    (v.text, {}, "a\rb", r"'\\r' \(a line break\) at position 1"),
    (v.text, {}, "a\x00b", r"'\\x00' \(a NUL byte\) at position 1"),
    (v.text, {}, "a\x1bb", r"'\\x1b' \(a control character\) at position 1"),
    (v.text, {}, "a\u2028b", r"'\\u2028' \(a line break\)"),
    (v.text, {}, "evil\u202etxt", r"'\\u202e' \(an invisible formatting character\) at position 4"),
    (v.text, {}, "\ud800", r"lone surrogate"),
    (v.text, {}, "", r"is empty; set a value"),
    (v.text, {}, ["a"], r"expected text, got list \['a'\]"),
    (v.text, {}, None, r"expected text, got NoneType"),
    (v.text, {}, float("nan"), r"nan is not a finite number"),
    (v.text, {}, 10**5000, r"absurdly large number"),
    (v.text, {}, "x" * 20000, r"is 20000 characters long \(at most 16384\)"),
    (v.text, {"strip_ok": False}, "name ", r"' ' \(leading or trailing whitespace"),
    (v.systemd_value, {}, "1g ", r"' ' \(whitespace\) at position 2"),
    (v.systemd_value, {}, "1g\\", r"'\\\\' \(systemd and Quadlet read backslashes"),
    (
        v.systemd_value,
        {},
        "%h/x",
        r"'%' \(a systemd specifier such as %h would be expanded\) at position 0",
    ),
    (v.systemd_value, {}, "$HOME", r"'\$' \(systemd would expand it"),
    (v.systemd_value, {}, 'a"b', r"'\"' \(Quadlet and systemd read quotes"),
    (v.image_reference, {}, "localhost/x\n@" + DIGEST, r"'\\n' \(a line break\) at position 11"),
    (
        v.image_reference,
        {},
        "localhost/x@" + DIGEST + "\n",
        r"'\\n' \(a line break\) at position 83",
    ),
    (
        v.image_reference,
        {},
        "vllm/vllm-openai:latest",
        r"vllm/vllm-openai:latest: not pinned by digest",
    ),
    (v.image_reference, {}, "x@sha256:" + "ab" * 31, r"not pinned by digest"),
    (v.image_reference, {}, "x@sha256:" + "AB" * 32, r"is not an image reference"),
    (v.image_reference, {}, "Vllm/Openai@" + DIGEST, r"is not an image reference"),
    (v.image_reference, {}, "x y@" + DIGEST, r"' ' \(whitespace\) at position 1"),
    (v.image_reference, {}, None, r"missing: not pinned by digest"),
    (v.image_reference, {}, "--privileged@" + DIGEST, r"is not an image reference"),
    (v.path, {}, "srv/models", r"'srv/models' is not an absolute path; start it with /"),
    (v.path, {}, "/srv/../etc", r"is not normalised \(contains '\.\.'\)"),
    (v.path, {}, "/srv/./x", r"is not normalised \(contains '\.'\)"),
    (v.path, {}, "/srv//x", r"is not normalised \(contains '//'\)"),
    (v.path, {}, "/srv/x\n", r"'\\n' \(a line break\) at position 6"),
    (v.path, {}, "/srv/a:/etc", r"':' \(it separates the fields of Volume=\) at position 6"),
    (v.path, {}, "/srv/my models", r"' ' \(whitespace\) at position 7"),
    (v.path, {}, "/srv/%h", r"'%' \(a systemd specifier"),
    (
        v.path,
        {"under": ("/etc/containers/systemd",)},
        "/etc/passwd",
        r"'/etc/passwd' is outside /etc/containers/systemd",
    ),
    (
        v.path,
        {"under": ("/etc/containers/systemd",)},
        "/etc/containers/systemdx",
        r"is outside /etc/containers/systemd",
    ),
    (v.device, {}, "/dev/../etc/shadow", r"'/dev/\.\./etc/shadow' is not normalised"),
    (v.device, {}, "/etc/shadow", r"'/etc/shadow' is outside /dev; use a path under /dev"),
    (v.device, {}, "/dev", r"'/dev' hands over all of /dev"),
    (v.device, {}, "/dev/nvidia0:/dev/../x", r"'/dev/\.\./x' is not normalised"),
    (v.device, {}, "/dev/a:/dev/b:/dev/c", r"more fields than HOST\[:CONTAINER\]\[:PERMISSIONS\]"),
    (v.device, {}, "/dev/nvidia0:rr", r"'rr' is not an absolute path"),
    (v.device, {}, "nvidia.com/gpu=../x", r"is neither a CDI device name nor a device path"),
    (v.device, {}, "gpu", r"'gpu' is neither a CDI device name"),
    (v.device, {}, "/dev/nvidia0\nAddDevice=/dev/mem", r"'\\n' \(a line break\)"),
    (v.interface_name, {}, "a" * 16, r"longer than 15 bytes"),
    (
        v.interface_name,
        {},
        "../../etc",
        r"'/' \(the kernel refuses it in an interface name\) at position 2",
    ),
    (v.interface_name, {}, "eth0:1", r"':' \(the kernel refuses it"),
    (v.interface_name, {}, "eth 0", r"' ' \(the kernel refuses it"),
    (v.interface_name, {}, "..", r"'\.\.' is not an interface name"),
    (v.interface_name, {}, "", r"is empty"),
    (v.unit_name, {}, "-H.service", r"is not a systemd unit name"),
    (v.unit_name, {}, "a b.service", r"is not a systemd unit name"),
    (v.unit_name, {}, "localinference-vllm", r"has no unit type suffix"),
    (v.unit_name, {}, "x.service\n", r"'\\n' \(a line break\)"),
    (v.host, {}, "10.77.0.11\n", r"'\\n' \(a line break\) at position 10"),
    (v.host, {}, "-oProxyCommand=x", r"is neither an IP address nor a host name"),
    (v.host, {}, "10.077.0.1", r"is neither an IP address nor a host name"),
    (v.host, {}, "host name", r"' ' at position 4"),
    (v.host, {}, "a" * 64 + ".example", r"is neither an IP address nor a host name"),
    (v.env_name, {}, "1ABC", r"'1' \(not allowed in an environment variable name\) at position 0"),
    (v.env_name, {}, "A-B", r"'-' \(not allowed in an environment variable name\) at position 1"),
    (v.env_name, {}, "A=B", r"'=' \(not allowed"),
    (v.env_value, {}, "1\nExecStartPre=/bin/sh", r"'\\n' \(a line break\) at position 1"),
    (v.env_value, {}, {"a": 1}, r"expected text, got dict"),
    (v.port, {}, 0, r"0 is below 1; set at least 1"),
    (v.port, {}, 65536, r"65536 is above 65535; set at most 65535"),
    (v.port, {}, True, r"expected an integer, got True"),
    (v.port, {}, "80a", r"expected an integer, got '80a'"),
    (v.port, {}, 8000.5, r"expected an integer, got 8000\.5"),
    (v.integer, {}, "9" * 5000, r"expected an integer, got '9999"),
    (v.integer, {"maximum": 10}, 10**5000, r"more than 4300 digits is above 10"),
    (v.number, {}, 10**5000, r"a number of more than 4300 digits is not a finite number"),
    (v.number, {}, float("inf"), r"inf is not a finite number"),
    (v.number, {}, "nan", r"'nan' is not a finite number"),
    (v.number, {}, 10**400, r"is not a finite number"),
    (v.number, {}, "1e999", r"'1e999' is not a finite number"),
    (v.number, {"above": 0}, 0, r"0 is not above 0"),
    (v.number, {"maximum": 1}, 1.5, r"1\.5 is above 1"),
    (v.number, {}, False, r"expected a number, got False"),
    (v.size, {}, "0", r"'0' is not a size"),
    (v.size, {}, "lots", r"'lots' is not a size"),
    (v.size, {}, "1g\nPodmanArgs=--privileged", r"'\\n' \(a line break\) at position 2"),
]


@pytest.mark.parametrize(("function", "kwargs", "value", "pattern"), REFUSED, ids=ids(REFUSED))
def test_refused_names_the_variable_the_character_and_the_fix(function, kwargs, value, pattern):
    with pytest.raises(v.ValidationError) as caught:
        function("vllm_recipe.x", value, **kwargs)
    message = str(caught.value)
    assert message.startswith("vllm_recipe.x: "), message
    assert re.search(pattern, message), message
    assert caught.value.name == "vllm_recipe.x"
    assert caught.value.fix and caught.value.fix in message


def test_is_under():
    assert v.is_under("/etc/containers/systemd/a", ["/etc/containers/systemd/"])
    assert not v.is_under("/etc/containers/systemd2/a", ["/etc/containers/systemd"])
    assert v.is_under("/x", ["/"])


def test_existing_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    assert v.existing_directory("shm_path", str(tmp_path)) == str(tmp_path)
    with pytest.raises(v.ValidationError, match=r"^shm_path: .*/f is not a directory; give an"):
        v.existing_directory("shm_path", str(tmp_path / "f"))
    with pytest.raises(v.ValidationError, match=r"^shm_path: .*/gone does not exist"):
        v.existing_directory("shm_path", str(tmp_path / "gone"))
    assert v.existing_directory("sys_root", str(tmp_path / "gone"), must_exist=False)
    with pytest.raises(v.ValidationError, match=r"is not a directory"):
        v.existing_directory("sys_root", str(tmp_path / "f"), must_exist=False)


# A role's input table: every refusal at once; null is unset only where optional; 0, false
# and "" are values, never taken for unset.
TABLE = [
    ({"name": "a", "value": None, "kind": "integer", "optional": True}, None),
    ({"name": "a", "value": None, "kind": "integer"}, r"^a: expected an integer, got None"),
    (
        {"name": "a", "value": 0, "kind": "integer", "optional": True, "minimum": 1},
        r"^a: 0 is below 1",
    ),
    ({"name": "a", "value": "lots", "kind": "integer"}, r"^a: expected an integer, got 'lots'"),
    ({"name": "a", "value": "9" * 5000, "kind": "number"}, r"^a: expected a number"),
    (
        {"name": "a", "value": False, "kind": "number", "optional": True},
        r"^a: expected a number, got False",
    ),
    ({"name": "a", "value": 0, "kind": "number", "above": 0}, r"^a: 0 is not above 0"),
    ({"name": "a", "value": "", "kind": "path", "optional": True}, r"^a: is empty"),
    ({"name": "a", "value": "/x/../y", "kind": "path"}, r"not normalised"),
    ({"name": "a", "value": 70000, "kind": "port"}, r"^a: 70000 is above 65535"),
    ({"name": "a", "value": "2", "kind": "integer", "minimum": 1}, None),
]


@pytest.mark.parametrize(("row", "pattern"), TABLE, ids=[str(i) for i in range(len(TABLE))])
def test_table_errors(row, pattern):
    found = v.table_errors([row, {"name": "ok", "value": 1, "kind": "integer"}])
    if pattern is None:
        assert found == []
    else:
        assert len(found) == 1 and re.search(pattern, str(found[0])), found


def test_a_table_row_of_an_unknown_kind_or_bound_is_a_programming_error():
    with pytest.raises(TypeError, match="known kind"):
        v.table_errors([{"name": "a", "value": 1, "kind": "float"}])
    with pytest.raises(TypeError, match=r"unknown keys \['min'\]"):
        v.table_errors([{"name": "a", "value": 1, "kind": "integer", "min": 0}])
