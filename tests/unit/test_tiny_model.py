# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# ruff: noqa: RUF001, RUF002 - DeepSeek's special tokens are spelled with fullwidth bars on purpose
"""The lab's scripted tiny model (lab/tiny_model.py, issue 11 point 5).

The script's constants parse with vLLM's deepseek_v3 tool-call regex. With the
lab's vLLM venv (torch, transformers), the model is built into a temporary
directory and ``tiny_model.py --verify`` runs it with transformers: greedy and
temperature-1 generations on both paths (no tools / a tool result present:
reasoning, ``</think>``, the answer; tools offered: reasoning, ``</think>``, one
tool call), logit margins of at least 25, unchanged tokenization of the probe
prompts, and the geometry the KV calibration depends on. Skipped without the
venv (``make lab`` or lab/bin/vllm-venv builds it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from lab import tiny_model

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / ".lab" / "vllm-venv" / "bin" / "python"
SCRIPT = ROOT / "lab" / "tiny_model.py"
STREAM_CHECK = ROOT / "lab" / "tiny_model_stream.py"
# vllm/tool_parsers/deepseekv3_tool_parser.py (vLLM 0.32.0), verbatim
DEEPSEEK_V3_CALL = re.compile(
    r"<｜tool▁call▁begin｜>(?P<type>.*)<｜tool▁sep｜>(?P<function_name>.*)\n```json\n"
    r"(?P<function_arguments>.*)\n```<｜tool▁call▁end｜>"
)
# Existing ids must not move: the lab's prompts and measured floors use them.
EXISTING_IDS = {
    "<｜begin▁of▁sentence｜>": 0,
    "<｜end▁of▁sentence｜>": 1,
    "<｜▁pad▁｜>": 2,
    "<｜User｜>": 4096,
    "<｜Assistant｜>": 4097,
    "<think>": 4098,
    "</think>": 4099,
    "<｜tool▁calls▁begin｜>": 4100,
    "<｜tool▁calls▁end｜>": 4101,
    "<｜tool▁call▁begin｜>": 4102,
    "<｜tool▁call▁end｜>": 4103,
    "<｜tool▁sep｜>": 4104,
    "<｜tool▁outputs▁begin｜>": 4105,
    "<｜tool▁outputs▁end｜>": 4106,
    "<｜tool▁output▁begin｜>": 4107,
    "<｜tool▁output▁end｜>": 4108,
}
GEOMETRY = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 131072,
    "dtype": "bfloat16",
    "tie_word_embeddings": False,
}
CASES = {
    "no-tools": "answer",
    "title": "answer",
    "tools": "tool",
    "tools-long": "tool",
    "no-tools-long": "answer",
    "tool-result": "answer",
    "tool-result-no-tools": "answer",
    "tools-unknown": "answer",
    "tools-opencode-glob": "tool",
    "tools-claude_code": "tool-claude_code",
    "tool-result-claude_code": "answer",
    "tools-codex": "tool-codex",
    "tool-result-codex": "answer",
    "tools-qwen_code": "tool-qwen_code",
    "tool-result-qwen_code": "answer",
    "tool-result-spaced": "answer",
}
# Each client's tool (issue 29): what its first request offers (captured from the
# pinned clients, lab/agent-clients.txt) and the arguments the script calls it with.
CLIENT_TOOLS = {
    "tool": ("read", {"filePath": ".", "limit": 50}),
    "tool-claude_code": ("Bash", {"command": "pwd", "description": "Print the working directory"}),
    "tool-codex": ("exec_command", {"cmd": "pwd", "login": False}),
    "tool-qwen_code": ("glob", {"pattern": "*", "path": "."}),
}


@pytest.mark.parametrize("path", list(CLIENT_TOOLS))
def test_each_tool_call_parses_as_deepseek_v3(path):
    calls = DEEPSEEK_V3_CALL.findall(tiny_model.EXPECTED_TEXT[path])
    name, arguments = CLIENT_TOOLS[path]
    assert [(kind, found, json.loads(args)) for kind, found, args in calls] == [("function", name, arguments)]
    reasoning, _, rest = tiny_model.EXPECTED_TEXT[path].partition(tiny_model.THINK_END)
    assert reasoning == tiny_model.REASONING_TOOL
    assert rest.startswith("<｜tool▁calls▁begin｜>") and rest.endswith("<｜tool▁calls▁end｜>")


def test_the_answer_and_opencode_call_are_as_before_issue_29():
    assert (tiny_model.TOOL_NAME, tiny_model.TOOL_ARGUMENTS) == ("read", '{"filePath": ".", "limit": 50}')
    assert tiny_model.EXPECTED_TEXT["tool"].partition("</think>")[2] == tiny_model.TOOL_CALL_TEXT
    assert tiny_model.EXPECTED_TEXT["answer"] == (
        tiny_model.REASONING_ANSWER + "</think>" + "Hello from the scripted lab model."
    )


@pytest.mark.parametrize("path", list(CLIENT_TOOLS))
def test_script_tokens_cannot_match_text_a_client_sends(path):
    name, arguments = CLIENT_TOOLS[path]
    compact = json.dumps(arguments, separators=(",", ":"))
    history = f"{name}\n```json\n{compact}\n```<｜tool▁call▁end｜>"
    # the tools section renders each schema with tojson (", " and ": ")
    schema = json.dumps({"name": name, "parameters": {"type": "object", "properties": {
        key: {"type": "string"} for key in arguments}, "required": list(arguments)}})  # fmt: skip
    for token in (*tiny_model.SCRIPT_TOKENS, *tiny_model.CLIENT_TOKENS):
        assert token not in history
        assert token not in schema
    for token in tiny_model.CALLS[path]:
        assert token not in tiny_model.CHAT_TEMPLATE


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    if not VENV_PYTHON.exists():
        pytest.skip(f"needs the lab's vLLM venv ({VENV_PYTHON}; lab/bin/vllm-venv builds it)")
    out = tmp_path_factory.mktemp("tiny") / "tiny-deepseek"
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["OMP_NUM_THREADS"] = "1"
    subprocess.run(
        [VENV_PYTHON, SCRIPT, "--output", out], check=True, env=env, timeout=600,
        capture_output=True,
    )  # fmt: skip
    return out


def test_geometry_and_tokens_are_unchanged(built):
    config = json.loads((built / "config.json").read_text())
    assert {key: config[key] for key in GEOMETRY} == GEOMETRY
    assert config["rope_parameters"]["rope_theta"] == tiny_model.ROPE_THETA
    vocab = json.loads((built / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    assert {k: added[k] for k in EXISTING_IDS} == EXISTING_IDS
    appended = [added[t] for t in (*tiny_model.SCRIPT_TOKENS, *tiny_model.CLIENT_TOKENS)]
    assert appended == list(range(4109, 4109 + len(appended)))
    assert config["vocab_size"] == 4109 + len(appended)
    info = json.loads((built / "lab-model.json").read_text())
    assert info["script"]["tool_name"] == tiny_model.TOOL_NAME
    tools = info["script"]["tools"]
    assert {path: (tool["name"], json.loads(tool["arguments"])) for path, tool in tools.items()} == CLIENT_TOOLS
    assert info["script"]["expected_text"] == tiny_model.EXPECTED_TEXT


def test_greedy_and_sampled_generations_follow_the_script(built):
    done = subprocess.run(
        [VENV_PYTHON, SCRIPT, "--verify", built],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert report["failures"] == [], report["failures"]
    assert done.returncode == 0, done.stderr[-2000:]
    assert {name: case["path"] for name, case in report["cases"].items()} == CASES
    for name, case in report["cases"].items():
        assert case["text"] == tiny_model.EXPECTED_TEXT[case["path"]], name
        assert case["margin"] >= 25, (name, case["margin"])
        if name not in tiny_model.SPACED_CASES:
            assert case["new_ids_in_prompt"] == [], name
    # a client that sends the call back with spaces holds the pieces in its prompt: still an answer
    assert report["cases"]["tool-result-spaced"]["new_ids_in_prompt"]
    assert report["cases"]["tools-long"]["prompt_tokens"] > 5000


def test_every_chunking_of_the_stream_parses_as_unstreamed(built):
    """vLLM 0.32's own parsers, fed each completion cut into deltas every possible way.

    All 2048 chunkings of each client's tool call (12 tokens) and all 8 of each answer
    stream what the unstreamed request returns, except where vLLM's
    deepseek_v3 parser cannot: a last delta that also completes
    ``<｜tool▁sep｜>read\\n`` streams the name and drops the arguments (reported
    as ``vllm_defect``; here only last deltas of 5 tokens or more, so
    --stream-interval 1 to 5 are safe).
    """
    done = subprocess.run(
        [VENV_PYTHON, STREAM_CHECK, built], env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    info = json.loads((built / "lab-model.json").read_text())
    for path, (name, _) in CLIENT_TOOLS.items():
        tool = report["tools" if path == "tool" else "tools-" + path.removeprefix("tool-")]
        assert tool["unstreamed_is_script"] and tool["failure_count"] == 0, tool["failures"]
        assert tool["chunkings"] == 2048
        # the call end marker is text inside the last piece, never the id the parser counts
        assert EXISTING_IDS["<｜tool▁call▁end｜>"] not in info["script"]["token_ids"][path]
        assert tool["passed"] + tool["vllm_defect"] == 2048
        assert tool["vllm_defect"] in (0, 2 ** tool["name_token"]), tool
        assert set(tool["vllm_defect_streamed_calls"]) <= {json.dumps([[name, ""]])}
        assert (tool["smallest_vllm_defect_last_delta"] or 99) >= 5
        assert {1, 2, 3, 4, 5} <= set(tool["stream_interval"]["ok"])
    for case in ("tool-result", "no-tools"):
        answer = report[case]
        assert answer["unstreamed_is_script"], answer
        assert answer["passed"] == answer["chunkings"] == 8, answer
