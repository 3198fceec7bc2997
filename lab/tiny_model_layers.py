# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Deepen the lab's tiny model for pipeline parallelism across more hosts.

The tiny model (lab/tiny_model.py) has 2 layers and 4 attention heads: TP 3
does not divide its heads, and PP 3 would leave one pipeline stage without a
layer (vLLM's ``get_pp_indices`` gives it none). Its layer 0 is empty (zero
attention and MLP weights, unit norms), so it adds nothing to the residual
stream: copies of it placed in front change no output. This writes a copy of
the model with ``--layers N`` layers (N - 2 more empty ones in front of the
scripted layer), the same tokenizer and script, and a ``lab-model.json`` that
names its source.

Run with the lab vLLM venv's Python (it has torch and safetensors):
    .lab/vllm-venv/bin/python lab/tiny_model_layers.py \\
        --source .lab/models/tiny-deepseek --output .lab/models/tiny-deepseek-3l --layers 3
    .lab/vllm-venv/bin/python lab/tiny_model.py --verify .lab/models/tiny-deepseek-3l
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def deepen(tensors: dict, layers: int) -> dict:
    """The state dict with ``layers`` layers: copies of the empty layer 0 in front."""
    old = sorted({int(m.group(1)) for name in tensors if (m := LAYER.match(name))})
    if old != list(range(len(old))) or not old:
        raise SystemExit(f"tiny_model_layers: unexpected layer numbering {old}")
    extra = layers - len(old)
    if extra < 0:
        raise SystemExit(f"tiny_model_layers: the source has {len(old)} layers, more than {layers}")
    empty = {
        m.group(2): t
        for name, t in tensors.items()
        if (m := LAYER.match(name)) and m.group(1) == "0"
    }
    for part, tensor in empty.items():
        if not part.endswith("layernorm.weight") and tensor.abs().sum().item() != 0:
            raise SystemExit(
                f"tiny_model_layers: layer 0 is not empty ({part}); refusing to deepen"
            )
    out = {name: t for name, t in tensors.items() if not LAYER.match(name)}
    for name, tensor in tensors.items():
        if m := LAYER.match(name):
            out[f"model.layers.{int(m.group(1)) + extra}.{m.group(2)}"] = tensor
    for layer in range(extra):
        for part, tensor in empty.items():
            out[f"model.layers.{layer}.{part}"] = tensor.clone()
    return out


def digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != "lab-model.json"
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="the generated tiny model")
    parser.add_argument("--output", type=Path, required=True, help="model directory to (re)create")
    parser.add_argument("--layers", type=int, required=True, help="layers of the output (>= 2)")
    args = parser.parse_args(argv)

    from safetensors.torch import load_file, save_file

    config = json.loads((args.source / "config.json").read_text())
    tensors = load_file(str(args.source / "model.safetensors"))
    deeper = deepen(tensors, args.layers)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{args.output.name}.", dir=args.output.parent))
    try:
        for path in args.source.iterdir():
            if path.is_file() and path.name not in (
                "model.safetensors",
                "config.json",
                ".lab-stamp",
            ):
                shutil.copyfile(path, tmp / path.name)
        config["num_hidden_layers"] = args.layers
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(deeper, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        info = json.loads((args.source / "lab-model.json").read_text())
        info["derived_from"] = {
            "source": str(args.source),
            "source_files": info.get("files", {}),
            "layers": args.layers,
            "how": "copies of the empty layer 0 in front of the scripted layer (lab/tiny_model_layers.py)",
        }
        info["files"] = digests(tmp)
        (tmp / "lab-model.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        if args.output.exists():
            shutil.rmtree(args.output)
        os.replace(tmp, args.output)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    print(json.dumps({"output": str(args.output), "layers": args.layers}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
