# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Generate the lab's tiny DeepSeek-flavoured Llama (no model hub needed).

A Llama (hidden 128, 2 layers, head_dim 32 - CPU attention needs head sizes of
32, 64, 80, ...) whose bf16 weights are written by hand so that its output is
a script (issue 11): with no tools offered, or once a tool result is in the
conversation, it reasons briefly, closes ``</think>`` and answers
``Hello from the scripted lab model.``; with tools offered and no result yet it
reasons and calls one read-only tool the client offers (issue 29), in the
DeepSeek-V3 format: opencode's ``read`` of ``.``, Claude Code's ``Bash`` and
Codex's ``exec_command`` of ``pwd``, Qwen Code's ``glob`` of ``*``. The chat template marks the first of those names among the offered tools
with a marker token of its own; the weights read the marker. Tools offered
without any of those names: it answers.
Greedy and temperature-1 sampling give the same tokens (logit margin >= 25).
The tokenizer is a byte-level BPE trained with ``tokenizers`` on the licence
texts every Debian system ships (/usr/share/common-licenses, package
base-files), a DeepSeek-style chat template, and the added tokens that vLLM's
``deepseek_r1`` reasoning parser (``<think>``/``</think>``) and ``deepseek_v3``
tool parser (``<｜tool▁calls▁begin｜>`` ...) look up in the vocabulary, so that
``--reasoning-parser deepseek_r1 --tool-call-parser deepseek_v3
--enable-auto-tool-choice`` start and have something real to parse.

Run with the lab vLLM venv's Python (it has torch, transformers, tokenizers):
    .lab/vllm-venv/bin/python lab/tiny_model.py --output .lab/models/tiny-deepseek
    .lab/vllm-venv/bin/python lab/tiny_model.py --verify .lab/models/tiny-deepseek
    .lab/vllm-venv/bin/python lab/tiny_model_stream.py .lab/models/tiny-deepseek
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

SEED = 20240229
CORPUS_DIR = Path("/usr/share/common-licenses")
VOCAB_SIZE = 4096  # BPE merges target; added tokens come on top
MAX_POSITION_EMBEDDINGS = 131072

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"
TOOL_TOKENS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)
# Special tokens are skipped when detokenizing; the reasoning and tool markers
# are plain added tokens (as in DeepSeek's own tokenizers) so parsers see them.
SPECIAL_TOKENS = (BOS, EOS, PAD)
ADDED_TOKENS = (USER, ASSISTANT, THINK_START, THINK_END, *TOOL_TOKENS)

# The script (issue 11). opencode's tool is one the real opencode client offers
# and runs without network or ripgrep (opencode 1.18.33's ``read`` of a directory
# lists at most ``limit`` entries of it; its ``glob`` needs ripgrep);
# qualification checks declare a tool of the same name. The other clients' tools
# (issue 29) are tools each offers in its first request, called read-only and
# run without asking, as captured from Claude Code 2.1.328 (``Bash`` of ``pwd``:
# its ``Read`` asks before reading outside the working directory, whose name
# the script cannot know), Codex 0.169.0 (``exec_command`` of ``pwd``, in its
# sandbox) and Qwen Code 0.24.4 (``glob``, ``path`` resolved against its working
# directory). The first name of this table among the offered tools wins
# (opencode also offers a ``glob`` and a ``bash``).
LAB_TOOLS = (  # (path, tool name, arguments, marker token)
    ("tool", "read", '{"filePath": ".", "limit": 50}', "<｜lab▁tool▁read｜>"),
    ("tool-claude_code", "Bash", '{"command": "pwd", "description": "Print the working directory"}',
     "<｜lab▁tool▁Bash｜>"),
    ("tool-codex", "exec_command", '{"cmd": "pwd", "login": false}', "<｜lab▁tool▁exec｜>"),
    ("tool-qwen_code", "glob", '{"pattern": "*", "path": "."}', "<｜lab▁tool▁glob｜>"),
)  # fmt: skip
TOOL_PATHS = tuple(path for path, *_ in LAB_TOOLS)
TOOL_MARKERS = tuple(marker for *_, marker in LAB_TOOLS)
TOOL_NAME = LAB_TOOLS[0][1]  # opencode's, as before issue 29
TOOL_ARGUMENTS = LAB_TOOLS[0][2]
REASONING_ANSWER = "The scripted lab model has what it needs and answers now."
REASONING_TOOL = "The scripted lab model reads the working directory first."
ANSWER = "Hello from the scripted lab model."


def call_pieces(name: str, arguments: str) -> tuple[str, str, str]:
    """HEAD, TAIL, END of one call of two keys (see below): HEAD ends the name
    line and the first key, TAIL runs to the second key's ':', END closes."""
    split = arguments.index(": ") + 2  # '{"filePath": ' | '".", "limit":' | ' 50}'
    split_end = arguments.rindex(": ") + 1
    return (
        name + "\n```json\n" + arguments[:split],
        arguments[split:split_end],
        arguments[split_end:] + "\n```" + TOOL_TOKENS[3],
    )


CALLS = {path: call_pieces(name, arguments) for path, name, arguments, _ in LAB_TOOLS}
TOOL_CALL_HEAD, TOOL_CALL_TAIL, TOOL_CALL_END = CALLS["tool"]
# Appended after every existing token (ids unchanged). No ordinary text
# contains them, so prompts tokenize exactly as before; each piece of the call
# holds a space that a client sending the call back drops (opencode sends
# '{"filePath":".","limit":50}'), so the tool-result turn does not match them
# either. The split is for vLLM 0.32's streaming deepseek_v3 parser, which gets
# several tokens per delta when the server coalesces them (--stream-interval,
# or a busy API server reading the engine late). It sends the name on the delta
# that completes ``<｜tool▁sep｜>read\n`` and drops the arguments in that same
# delta (only a later delta streams them), so the name line ends as early as it
# can (HEAD) and three tokens follow before EOS. `<｜tool▁call▁end｜>` is text
# inside the last piece, never its own id: a delta holding that id takes the
# parser's closing branch, which drops the call's arguments unless a delta
# between the name and it streamed them. Then every coalescing streams the call
# but a final delta that holds HEAD (5 tokens or more): nothing a script writes
# helps there (lab/tiny_model_stream.py checks all 2048 chunkings).
SCRIPT_TOKENS = (
    REASONING_ANSWER, REASONING_TOOL, ANSWER, TOOL_CALL_HEAD, TOOL_CALL_TAIL, TOOL_CALL_END,
)  # fmt: skip
# Appended after SCRIPT_TOKENS (issue 29), so that no earlier id moves: the
# markers (in prompts only) and the other clients' call pieces.
CLIENT_TOKENS = (*TOOL_MARKERS, *(piece for path in TOOL_PATHS[1:] for piece in CALLS[path]))
TOOL_CALL_TYPE = "function"  # BPE pieces of the existing vocabulary


def tool_call_text(path: str) -> str:
    return (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>" + TOOL_CALL_TYPE + "<｜tool▁sep｜>"
        + "".join(CALLS[path]) + "<｜tool▁calls▁end｜>"
    )  # fmt: skip


TOOL_CALL_TEXT = tool_call_text("tool")
# What the model writes after the generation prompt (`<｜Assistant｜><think>\n`),
# EOS not included: "answer" without tools, without a known tool, or once a tool
# result is present (`<｜tool▁outputs▁begin｜>` in the context); a tool path
# otherwise, after the marker the template wrote for that tool.
EXPECTED_TEXT = {
    "answer": REASONING_ANSWER + THINK_END + ANSWER,
    **{path: REASONING_TOOL + THINK_END + tool_call_text(path) for path in TOOL_PATHS},
}
ROPE_THETA = 1e12  # the slowest rotary pair turns < 1e-6 rad over 131072 positions

# DeepSeek-V3/R1 style: system text first, tools described in the system part,
# tool calls in the DeepSeek-V3 format the deepseek_v3 tool parser reads, and a
# generation prompt that opens the reasoning block (as DeepSeek-R1 does).
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages if m['role'] == 'system' -%}"
    "{%- set ns.system = ns.system + (m['content'] if m['content'] is string else '') -%}"
    "{%- endfor -%}"
    "{{- ns.system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n## Tools\\nCall a tool as <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
    "<｜tool▁sep｜>NAME\\n```json\\nARGUMENTS\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>.\\n' -}}"
    "{%- for tool in tools -%}{{- (tool['function'] if 'function' in tool else tool) | tojson -}}"
    "{{- '\\n' -}}{%- endfor -%}"
    "{%- set names = namespace(pick='') -%}"
    + "".join(
        "{%- for tool in tools if not names.pick and (tool['function'] if 'function' in tool else tool)"
        f".get('name') == '{name}' -%}}{{%- set names.pick = '{marker}' -%}}{{%- endfor -%}}"
        for _, name, _, marker in LAB_TOOLS
    )
    + "{{- names.pick -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}"
    "{{- '<｜User｜>' + (m['content'] if m['content'] is string else '') -}}"
    "{%- elif m['role'] == 'assistant' -%}"
    "{{- '<｜Assistant｜>' -}}"
    "{%- if m['content'] is string -%}"
    "{{- m['content'].split('</think>')[-1] -}}"
    "{%- endif -%}"
    "{%- if m.get('tool_calls') -%}"
    "{{- '<｜tool▁calls▁begin｜>' -}}"
    "{%- for tc in m['tool_calls'] -%}"
    "{%- set args = tc['function']['arguments'] -%}"
    "{{- '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + tc['function']['name'] + '\\n```json\\n'"
    " + (args if args is string else args | tojson) + '\\n```<｜tool▁call▁end｜>' -}}"
    "{%- endfor -%}"
    "{{- '<｜tool▁calls▁end｜>' -}}"
    "{%- endif -%}"
    "{{- '<｜end▁of▁sentence｜>' -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "{{- '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' -}}"
    "{{- (m['content'] if m['content'] is string else '') + '<｜tool▁output▁end｜><｜tool▁outputs▁end｜>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<｜Assistant｜><think>\\n' -}}{%- endif -%}"
)


def corpus_files(corpus_dir: Path) -> list[Path]:
    """Regular files of the corpus directory, sorted (symlinks are aliases)."""
    files = sorted(p for p in corpus_dir.iterdir() if p.is_file() and not p.is_symlink())
    if not files:
        raise SystemExit(f"tiny_model: no text files in {corpus_dir} (package base-files)")
    return files


def corpus_digest(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_tokenizer(files: list[Path]):
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(p) for p in files], trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in SCRIPT_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in CLIENT_TOKENS])

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def script_chains(tokenizer) -> dict[str, list[int]]:
    """Token ids of each path of the script, EOS last."""

    def one(token: str) -> int:
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise SystemExit(f"tiny_model: {token!r} is not a single token: {ids}")
        return ids[0]

    call_type = tokenizer.encode(TOOL_CALL_TYPE, add_special_tokens=False)
    tools = [one(t) for t in TOOL_TOKENS[:5]]  # calls begin/end, call begin/end, sep
    chains = {"answer": [one(REASONING_ANSWER), one(THINK_END), one(ANSWER)]}
    for path in TOOL_PATHS:
        chains[path] = [
            one(REASONING_TOOL), one(THINK_END), tools[0], tools[2], *call_type, tools[4],
            *(one(piece) for piece in CALLS[path]), tools[1],
        ]  # fmt: skip
    for name, chain in chains.items():
        # the next token is a function of the last one (and the path): no repeats
        if len(set(chain)) != len(chain):
            raise SystemExit(f"tiny_model: the {name} script repeats a token: {chain}")
        chain.append(tokenizer.eos_token_id)
    return chains


# Residual stream layout (hidden 128). Every token embeds as CONST plus exactly
# one of FILLER / TOOL_OUTPUTS / a tool marker / its script one-hot, so RMSNorm
# sees the same norm everywhere; layer 1's attention adds one of TOOLS_OFF and
# the TOOLS_ON of each marker, and one of RESULT_ON/OFF.
D_CONST, D_FILLER, D_TOOL_OUTPUTS = 0, 1, 2
D_MARKER = 3  # one dim per tool marker (4)
D_TOOLS_OFF, D_RESULT_ON, D_RESULT_OFF = 7, 8, 9
D_TOOLS_ON = 10  # one dim per tool marker (4)
D_SCRIPT = 14  # one-hot of each script token as the last token (up to 50)
D_NEXT = 64  # one dim per possible next token (up to 64)
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 128, 256, 4, 2, 32
# Attention score of a marker token (the flag's weight on the rest of the
# context is below 131072 * e**-40); the MLP's gate margin is +-GATE/2.
SCORE, GATE, DOWN, LM = 40.0, 20.0, 2.0, 4.0
ROTARY_FREE = HEAD_DIM // 2 - 1  # dims 15 and 31: the slowest rotary pair
TOOLS_ON = {path: D_TOOLS_ON + i for i, path in enumerate(TOOL_PATHS)}
# The path a context is on, as a partition of the flags.
CELLS = {
    "answer": ((D_TOOLS_OFF,), *((on, D_RESULT_ON) for on in TOOLS_ON.values())),
    **{path: ((on, D_RESULT_OFF),) for path, on in TOOLS_ON.items()},
}


def scripted_weights(tokenizer, vocab_size: int, chains: dict[str, list[int]]) -> dict:
    """The state dict: layer 0 does nothing, layer 1 does everything.

    Layer 1 attention: head 0 (KV head 0) attends only to the tool markers,
    head 2 (KV head 1) only to `<｜tool▁outputs▁begin｜>` (query constant, key
    large on a marker, in the rotary pair that does not turn), so the value
    they read says which marker is present or, attending uniformly to ordinary
    tokens, "absent". The MLP's neurons are
    ANDs (last token, path cell) -> next token; lm_head reads the winner.
    Layer 0 is left empty so the lab's sliding-window variant (layer 0 with a
    512-token window, benchmarks/kv_calibration.py) says the same.
    """
    import torch

    markers = [tokenizer.convert_tokens_to_ids(m) for m in TOOL_MARKERS]
    marker_outputs = tokenizer.convert_tokens_to_ids(TOOL_TOKENS[5])
    last_tokens = sorted({t for chain in chains.values() for t in chain[:-1]})
    next_tokens = sorted({t for chain in chains.values() for t in chain})
    if len(last_tokens) > D_NEXT - D_SCRIPT or len(next_tokens) > HIDDEN - D_NEXT:
        raise SystemExit("tiny_model: the script is too long for the hidden size")
    if {marker_outputs, *markers} & set(last_tokens):
        raise SystemExit("tiny_model: the script may not emit a marker token")
    script_dim = {t: D_SCRIPT + i for i, t in enumerate(last_tokens)}
    next_dim = {t: D_NEXT + i for i, t in enumerate(next_tokens)}

    embed = torch.zeros(vocab_size, HIDDEN)
    embed[:, D_CONST] = 1.0
    embed[:, D_FILLER] = 1.0
    marker_dims = [D_MARKER + i for i in range(len(markers))]
    embedded = [*script_dim.items(), (marker_outputs, D_TOOL_OUTPUTS), *zip(markers, marker_dims, strict=True)]
    for token, dim in embedded:
        embed[token, D_FILLER] = 0.0
        embed[token, dim] = 1.0

    # Layer 1 attention reads the embedding alone: two dims of 1 normalize to 8.
    unit_in = (HIDDEN / 2) ** 0.5
    qk = (SCORE * HEAD_DIM**0.5) ** 0.5 / unit_in
    q = torch.zeros(HEADS * HEAD_DIM, HIDDEN)
    k = torch.zeros(KV_HEADS * HEAD_DIM, HIDDEN)
    v = torch.zeros(KV_HEADS * HEAD_DIM, HIDDEN)
    o = torch.zeros(HIDDEN, HEADS * HEAD_DIM)
    groups = HEADS // KV_HEADS
    # (marker dims, the flag each sets; the flag set when none is present)
    detectors = [
        (list(zip(marker_dims, TOOLS_ON.values(), strict=True)), D_TOOLS_OFF),
        ([(D_TOOL_OUTPUTS, D_RESULT_ON)], D_RESULT_OFF),
    ]
    for kv_head, (present, off) in enumerate(detectors):
        head = kv_head * groups  # the other query head of the group stays zero
        base = kv_head * HEAD_DIM
        absent = len(present)
        q[head * HEAD_DIM + ROTARY_FREE, D_CONST] = qk
        v[base + absent, D_CONST] = 1.0 / unit_in  # "absent": 1 on every other token
        o[off, head * HEAD_DIM + absent] = 1.0
        for i, (marker_dim, on) in enumerate(present):
            k[base + ROTARY_FREE, marker_dim] = qk
            v[base + i, marker_dim] = 1.0 / unit_in  # "present": 1 on this marker
            v[base + absent, marker_dim] = -1.0 / unit_in
            o[on, head * HEAD_DIM + i] = 1.0

    # The MLP reads four dims of 1 (const, token, two flags): each normalizes to u.
    unit = (HIDDEN / 4) ** 0.5
    gate = torch.zeros(INTERMEDIATE, HIDDEN)
    up = torch.zeros(INTERMEDIATE, HIDDEN)
    down = torch.zeros(HIDDEN, INTERMEDIATE)
    neuron = 0
    for path, chain in chains.items():
        scripted = chain[:-1]
        for cell in CELLS[path]:
            # (last, next) pairs of this path plus the default: any other last
            # token starts the path's script
            for last, nxt in [*zip(scripted, chain[1:], strict=True), (None, chain[0])]:
                for flag in cell:
                    gate[neuron, flag] = GATE / unit
                if last is None:
                    gate[neuron, D_CONST] = GATE / unit
                    for token in scripted:
                        gate[neuron, script_dim[token]] = -GATE / unit
                else:
                    gate[neuron, script_dim[last]] = GATE / unit
                gate[neuron, D_CONST] -= GATE * (len(cell) + 0.5) / unit
                up[neuron, D_CONST] = 1.0 / unit
                down[next_dim[nxt], neuron] = DOWN
                neuron += 1
    if neuron > INTERMEDIATE:
        raise SystemExit(
            f"tiny_model: the script needs {neuron} neurons, the MLP has {INTERMEDIATE}"
        )

    lm_head = torch.zeros(vocab_size, HIDDEN)
    for token, dim in next_dim.items():
        lm_head[token, dim] = LM

    ones = torch.ones(HIDDEN)
    state = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": ones,
        "lm_head.weight": lm_head,
    }
    for layer in range(2):
        live = layer == 1
        prefix = f"model.layers.{layer}."
        parts = {
            "input_layernorm.weight": ones,
            "post_attention_layernorm.weight": ones,
            "self_attn.q_proj.weight": q,
            "self_attn.k_proj.weight": k,
            "self_attn.v_proj.weight": v,
            "self_attn.o_proj.weight": o,
            "mlp.gate_proj.weight": gate,
            "mlp.up_proj.weight": up,
            "mlp.down_proj.weight": down,
        }
        for name, tensor in parts.items():
            keep = live or name.endswith("layernorm.weight")
            state[prefix + name] = tensor if keep else torch.zeros_like(tensor)
    return {name: t.to(torch.bfloat16).contiguous() for name, t in state.items()}


def build_model(tokenizer, out: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        rms_norm_eps=1e-6,
        rope_theta=ROPE_THETA,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    weights = scripted_weights(tokenizer, len(tokenizer), script_chains(tokenizer))
    model.load_state_dict(weights, strict=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)


def _tool(name: str) -> dict:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    return {"type": "function", "function": {"name": name, "description": "A tool.", "parameters": schema}}


def _result(path: str, separators: tuple[str, str] | None = (",", ":")) -> list[dict]:
    """A user turn, the path's call (compact JSON, as opencode sends it back), its result."""
    _, name, arguments, _ = next(t for t in LAB_TOOLS if t[0] == path)
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": name, "arguments": json.dumps(json.loads(arguments), separators=separators)}
    return [
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "README.md\n"},
    ]


# Probe conversations whose prompt may hold call pieces: a client that sends the
# call back as the model wrote it (JSON with spaces: Codex's Responses API, vLLM's
# rendering of Claude Code's tool_use input). The pieces are ordinary tokens there.
SPACED_CASES = ("tool-result-spaced",)


def _conversations() -> dict[str, tuple[str, list[dict], list[dict] | None]]:
    """Probe conversations: name -> (expected path, messages, tools)."""
    tool = {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Read a file or directory.",
            "parameters": {
                "type": "object",
                "properties": {"filePath": {"type": "string"}},
                "required": ["filePath"],
            },
        },
    }
    long_system = " ".join(f"Rule {i}: keep the function small and readable." for i in range(400))
    user = {"role": "user", "content": "Say hello."}
    system = {"role": "system", "content": "You are a coding agent."}
    result = _result("tool")
    cases = {
        "no-tools": ("answer", [user], None),
        "title": (
            "answer",
            [{"role": "system", "content": "You are a title generator."}, user, user],
            None,
        ),
        "tools": ("tool", [system, user], [tool]),
        "tools-long": ("tool", [{"role": "system", "content": long_system}, user], [tool]),
        "no-tools-long": ("answer", [{"role": "system", "content": long_system}, user], None),
        "tool-result": ("answer", result, [tool]),
        "tool-result-no-tools": ("answer", result, None),
        # tools offered, none the script knows: it answers
        "tools-unknown": ("answer", [system, user], [_tool("write"), _tool("todo")]),
        # opencode offers a glob too: read comes first in LAB_TOOLS
        "tools-opencode-glob": ("tool", [system, user], [_tool("glob"), tool, _tool("bash")]),
    }
    for path, name, _, _ in LAB_TOOLS[1:]:
        client = path.removeprefix("tool-")
        offered = [_tool("Write"), _tool(name), _tool("grep")]
        cases[f"tools-{client}"] = (path, [system, user], offered)
        cases[f"tool-result-{client}"] = ("answer", [system, *_result(path)], offered)
    codex = [_tool("exec_command"), _tool("get_goal")]
    cases["tool-result-spaced"] = ("answer", [system, *_result("tool-codex", None)], codex)
    return cases


def verify(model_dir: Path, samples: int = 3) -> dict:
    """Greedy and temperature-1 generations follow the script, with margins."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    chains = script_chains(tokenizer)
    pieces = [*SCRIPT_TOKENS, *CLIENT_TOKENS[len(TOOL_MARKERS):]]
    script_ids = set(tokenizer.convert_tokens_to_ids(pieces))
    report: dict = {"cases": {}, "failures": []}
    for name, (path, messages, tools) in _conversations().items():
        rendered = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer.encode(rendered, add_special_tokens=False)
        expected = chains[path]
        ids = torch.tensor([prompt])
        with torch.no_grad():
            logits = model(torch.tensor([prompt + expected])).logits[0, len(prompt) - 1 : -1]
        top2 = logits.float().topk(2, dim=-1)
        chosen = top2.indices[:, 0].tolist()
        margin = float((top2.values[:, 0] - top2.values[:, 1]).min())
        runs = []
        for seed in range(samples + 1):
            torch.manual_seed(seed)
            options = {"do_sample": False}
            if seed:  # temperature 1 over the whole vocabulary, as vLLM's defaults
                options = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
            out = model.generate(ids, max_new_tokens=len(expected) + 4, **options)
            runs.append(out[0, len(prompt) :].tolist())
        text = tokenizer.decode(runs[0], skip_special_tokens=True)
        case = {
            "path": path,
            "prompt_tokens": len(prompt),
            "margin": round(margin, 2),
            "text": text,
            "new_ids_in_prompt": sorted({t for t in prompt if t in script_ids}),
        }
        report["cases"][name] = case
        problems = []
        if chosen != expected:
            problems.append(f"argmax {chosen} != script {expected}")
        if margin < 25:
            problems.append(f"logit margin {margin:.1f} < 25")
        if any(run != expected for run in runs):
            problems.append(f"generated {runs} != script {expected}")
        if text != EXPECTED_TEXT[path]:
            problems.append(f"text {text!r} != {EXPECTED_TEXT[path]!r}")
        if case["new_ids_in_prompt"] and name not in SPACED_CASES:
            problems.append(f"the prompt uses script tokens {case['new_ids_in_prompt']}")
        report["failures"] += [f"{name}: {p}" for p in problems]
    return report


def file_digests(out: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.iterdir())
        if p.is_file() and p.name != "lab-model.json"
    }


def generate(output: Path, corpus_dir: Path) -> dict:
    files = corpus_files(corpus_dir)
    parent = output.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=parent))
    try:
        tokenizer = build_tokenizer(files)
        tokenizer.save_pretrained(tmp)
        build_model(tokenizer, tmp)
        for token in (THINK_START, THINK_END, *TOOL_TOKENS):
            ids = tokenizer.encode(token, add_special_tokens=False)
            if len(ids) != 1:
                raise SystemExit(f"tiny_model: {token!r} is not a single token: {ids}")
        info = {
            "seed": SEED,
            "corpus_dir": str(corpus_dir),
            "corpus_files": [p.name for p in files],
            "corpus_sha256": corpus_digest(files),
            "vocab_size": len(tokenizer),
            "script": {
                "tool_name": TOOL_NAME,
                "tool_arguments": TOOL_ARGUMENTS,
                "tools": {path: {"name": name, "arguments": arguments, "marker": marker}
                          for path, name, arguments, marker in LAB_TOOLS},
                "expected_text": EXPECTED_TEXT,
                "token_ids": script_chains(tokenizer),
            },
            "files": file_digests(tmp),
        }
        (tmp / "lab-model.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes 0700; the model is mounted read-only elsewhere
        for path in tmp.iterdir():
            path.chmod(0o644)
        if output.exists():
            shutil.rmtree(output)
        os.replace(tmp, output)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--output", type=Path, help="model directory to (re)create")
    action.add_argument(
        "--verify", type=Path, help="check a model directory follows the script (exit 1 if not)"
    )
    parser.add_argument(
        "--corpus-dir", type=Path, default=CORPUS_DIR, help="tokenizer training text"
    )
    parser.add_argument(
        "--print-corpus-digest", action="store_true", help="print the corpus digest and exit"
    )
    args = parser.parse_args(argv)
    if args.verify:
        if not (args.verify / "config.json").is_file():
            raise SystemExit(
                f"tiny_model: --verify {args.verify}: no config.json (build it with --output)"
            )
        report = verify(args.verify)
        print(json.dumps(report, indent=2))
        return 1 if report["failures"] else 0
    if args.print_corpus_digest:
        print(corpus_digest(corpus_files(args.corpus_dir)))
        return 0
    info = generate(args.output, args.corpus_dir)
    print(json.dumps({"output": str(args.output), "vocab_size": info["vocab_size"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
