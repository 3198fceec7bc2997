# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Generate the lab's tiny DeepSeek-flavoured Llama (no model hub needed).

A deterministic, seeded Llama (hidden 128, 2 layers, head_dim 32 - CPU
attention needs head sizes of 32, 64, 80, ...), random bf16 weights saved as
safetensors, a byte-level BPE tokenizer trained with ``tokenizers`` on the
licence texts every Debian system ships (/usr/share/common-licenses, package
base-files), a DeepSeek-style chat template, and the added tokens that vLLM's
``deepseek_r1`` reasoning parser (``<think>``/``</think>``) and ``deepseek_v3``
tool parser (``<｜tool▁calls▁begin｜>`` ...) look up in the vocabulary, so that
``--reasoning-parser deepseek_r1 --tool-call-parser deepseek_v3
--enable-auto-tool-choice`` start.

Run with the lab vLLM venv's Python (it has torch, transformers, tokenizers):
    .lab/vllm-venv/bin/python lab/tiny_model.py --output .lab/models/tiny-deepseek
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


def build_model(tokenizer, out: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)


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
    parser.add_argument("--output", type=Path, required=True, help="model directory to (re)create")
    parser.add_argument(
        "--corpus-dir", type=Path, default=CORPUS_DIR, help="tokenizer training text"
    )
    parser.add_argument(
        "--print-corpus-digest", action="store_true", help="print the corpus digest and exit"
    )
    args = parser.parse_args(argv)
    if args.print_corpus_digest:
        print(corpus_digest(corpus_files(args.corpus_dir)))
        return 0
    info = generate(args.output, args.corpus_dir)
    print(json.dumps({"output": str(args.output), "vocab_size": info["vocab_size"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
