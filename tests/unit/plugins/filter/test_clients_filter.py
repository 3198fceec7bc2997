# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``agent_client_files``: the files the client stage's shortcut watches for the other clients."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.clients import FilterModule

files = FilterModule().filters()["agent_client_files"]


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
