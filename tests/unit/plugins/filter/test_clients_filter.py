# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``agent_client_files`` and ``agent_client_programs``: the files the client stage's shortcut
watches for the other clients."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.clients import FilterModule

files = FilterModule().filters()["agent_client_files"]
programs = FilterModule().filters()["agent_client_programs"]


@pytest.mark.parametrize(
    ("clients", "directory", "want"),
    [
        (["opencode"], "", []),
        (["opencode"], "relative", []),
        (
            ["opencode", "codex", "claude_code"],
            "/home/op/.config/localinference/clients/",
            [
                "/home/op/.config/localinference/clients/codex/config.toml",
                "/home/op/.config/localinference/clients/codex/env",
                "/home/op/.config/localinference/clients/claude_code/settings.json",
                "/home/op/.config/localinference/clients/claude_code/env",
            ],
        ),
        (
            ["opencode", "qwen_code", "crush"],
            "/c",
            ["/c/qwen_code/settings.json", "/c/qwen_code/env", "/c/crush/crush.json", "/c/crush/env"],
        ),
    ],
)
def test_agent_client_files(clients, directory, want):
    """The files themselves, not their folders: a config edited in place changes its file's identity."""
    assert files(clients, directory) == want


def test_agent_client_files_needs_an_absolute_directory():
    with pytest.raises(AnsibleFilterError, match="agent_client_dir must be an absolute path"):
        files(["opencode", "codex"], "clients")


@pytest.mark.parametrize(
    ("clients", "given", "want"),
    [
        (["opencode"], {}, []),
        (["opencode", "codex", "claude_code", "qwen_code", "crush"], None, ["codex", "claude", "qwen", "crush"]),
        (["opencode", "codex"], {"codex": "/opt/codex/bin/codex", "crush": "/opt/crush"}, ["/opt/codex/bin/codex"]),
        (["opencode", "codex"], {"codex": "codex"}, "agent_client_programs.codex must be an absolute path"),
        (["opencode", "codex"], {"codex": "/opt/co\ndex"}, "agent_client_programs.codex must be an absolute path"),
        (["opencode", "codex"], {"aider": "/usr/bin/aider"}, "agent_client_programs: unknown client ['aider']"),
        (["opencode", "codex"], ["/usr/bin/codex"], "agent_client_programs must be a dict"),
        (["codex"], {}, "must include opencode"),
    ],
)
def test_agent_client_programs(clients, given, want):
    """What the shortcut watches: an upgraded client program is measured again."""
    if isinstance(want, list):
        assert programs(clients, given) == want
    else:
        with pytest.raises(AnsibleFilterError, match=want.replace("[", "\\[").replace("]", "\\]")):
            programs(clients, given)
