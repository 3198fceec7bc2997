# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# ruff: noqa: RUF002 - DeepSeek's special tokens are spelled with fullwidth bars on purpose

"""Stream the tiny model's script through vLLM's own parsers, chunked every way.

vLLM sends a streamed completion as deltas of one or more tokens: one each by
default, ``--stream-interval N`` at a time (the first token alone), and any
number when a busy API server reads the engine's output late (the per-request
collector merges what it has not read yet). The serving layer hands each delta
to the same ``Parser`` this script builds (``--reasoning-parser deepseek_r1
--tool-call-parser deepseek_v3 --enable-auto-tool-choice``, composed by
``ParserManager.get_parser`` as ``vllm serve`` does) through ``parse_delta``,
with the text a detokenizer gives that delta. Here every composition of each
scripted completion (2 ** (tokens - 1) chunkings) goes through a fresh parser,
and what the stream adds up to (reasoning, content, each call's name and
arguments) is compared with what ``Parser.parse`` returns for the whole text,
as the unstreamed request does.

vLLM 0.32's deepseek_v3 streaming parser sends a call's name on the delta that
completes ``<｜tool▁sep｜>NAME\\n`` and returns there: arguments in that delta
are neither sent nor remembered, and only a later delta streams them. When
that delta is the last one (it holds EOS) the stream ends with the name and no
arguments, whatever the model wrote: such chunkings are reported as
``vllm_defect``, every other failure as ``failures`` (exit 1).

Run with the lab vLLM venv's Python:
    .lab/vllm-venv/bin/python lab/tiny_model_stream.py .lab/models/tiny-deepseek
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_model  # after the path insert: run as a script from any directory

# Probe conversations of tiny_model: a tool call (opencode's, then each other
# client's), an answer after a tool result with tools offered, an answer without
# tools.
CASES = ("tools", "tools-claude_code", "tools-codex", "tools-qwen_code", "tool-result", "no-tools")


def compositions(n: int) -> Iterator[tuple[int, ...]]:
    """Every way to cut n tokens into deltas, as delta sizes."""
    for cuts in itertools.product((False, True), repeat=n - 1):
        sizes, size = [], 1
        for cut in cuts:
            if cut:
                sizes.append(size)
                size = 1
            else:
                size += 1
        yield (*sizes, size)


def stream_interval(n: int, interval: int) -> tuple[int, ...]:
    """The deltas of ``--stream-interval`` (vLLM sends the first token alone)."""
    rest = [interval] * ((n - 1) // interval)
    if (n - 1) % interval:
        rest.append((n - 1) % interval)
    return (1, *rest)


class Harness:
    def __init__(self, model_dir: Path) -> None:
        from vllm.parser.parser_manager import ParserManager
        from vllm.tokenizers import get_tokenizer

        self.tokenizer = get_tokenizer(str(model_dir))
        self.parser_cls = ParserManager.get_parser(
            tool_parser_name="deepseek_v3",
            reasoning_parser_name="deepseek_r1",
            enable_auto_tools=True,
            tokenizer=self.tokenizer,
        )
        # the model's own script (lab-model.json), so an older build is checked as built
        self.script = json.loads((model_dir / "lab-model.json").read_text())["script"]
        self.chains = self.script["token_ids"]
        opencode = {"name": self.script["tool_name"], "arguments": self.script["tool_arguments"]}
        self.tools = self.script.get("tools") or {"tool": opencode}

    def request(self, messages: list[dict], tools: list[dict] | None):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest(model="tiny", messages=messages, tools=tools, stream=True)

    def prompt(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def unstreamed(self, ids: list[int], request) -> dict[str, Any]:
        parser = self.parser_cls(self.tokenizer, request.tools, chat_template_kwargs={})
        reasoning, content, calls = parser.parse(
            self.text(ids), request, enable_auto_tools=True, model_output_token_ids=ids
        )
        return {
            "reasoning": reasoning or "",
            "content": content or "",
            "calls": [[call.name, call.arguments] for call in calls or []],
        }

    def streamed(self, ids: list[int], sizes: tuple[int, ...], request, prompt) -> dict[str, Any]:
        parser = self.parser_cls(self.tokenizer, request.tools, chat_template_kwargs={})
        reasoning, content = "", ""
        calls: dict[int, list[str]] = {}
        end = 0
        for size in sizes:
            start, end = end, end + size
            # the detokenizer's delta: the new tokens' share of the whole text
            delta_text = self.text(ids[:end])[len(self.text(ids[:start])) :]
            delta = parser.parse_delta(
                delta_text, ids[start:end], request, prompt, finished=end == len(ids)
            )
            if delta is None:
                continue
            reasoning += delta.reasoning or ""
            content += delta.content or ""
            for call in delta.tool_calls or []:
                got = calls.setdefault(call.index, ["", ""])
                if call.function is not None:
                    got[0] += call.function.name or ""
                    got[1] += call.function.arguments or ""
        return {"reasoning": reasoning, "content": content, "calls": list(calls.values())}

    def name_token(self, ids: list[int], name: str) -> int | None:
        """Index of the token that completes ``<｜tool▁sep｜>NAME\\n``."""
        marker = tiny_model.TOOL_TOKENS[4] + name + "\n"
        for index in range(len(ids)):
            if marker in self.text(ids[: index + 1]):
                return index
        return None

    def check(self, case: str) -> dict[str, Any]:
        path, messages, tools = tiny_model._conversations()[case]
        ids = self.chains[path]
        request, prompt = self.request(messages, tools), self.prompt(messages, tools)
        expected = self.unstreamed(ids, request)
        reasoning, _, content = self.script["expected_text"][path].partition(tiny_model.THINK_END)
        tool = self.tools.get(path)
        script = {
            "reasoning": reasoning,
            "content": "" if tool else content,
            "calls": [[tool["name"], tool["arguments"]]] if tool else [],
        }
        name_token = self.name_token(ids, tool["name"]) if tool else None
        failures, defect, outcomes = [], [], Counter()
        for sizes in compositions(len(ids)):
            got = self.streamed(ids, sizes, request, prompt)
            if got == expected:
                continue
            # the last delta holds the name's newline: vLLM cannot stream the arguments
            if name_token is not None and len(ids) - sizes[-1] <= name_token:
                defect.append(sizes)
                outcomes[json.dumps(got["calls"])] += 1
            else:
                failures.append({"deltas": sizes, "streamed": got})
        failed = {f["deltas"] for f in failures}
        intervals = {}
        for n in range(1, len(ids) + 1):
            sizes = stream_interval(len(ids), n)
            intervals[n] = (
                "vllm_defect" if sizes in defect else "failure" if sizes in failed else "ok"
            )
        return {
            "path": path,
            "tokens": len(ids),
            "unstreamed": expected,
            "unstreamed_is_script": expected == script,
            "name_token": name_token,
            "chunkings": 2 ** (len(ids) - 1),
            "passed": 2 ** (len(ids) - 1) - len(defect) - len(failures),
            "vllm_defect": len(defect),
            "vllm_defect_streamed_calls": dict(outcomes),
            "smallest_vllm_defect_last_delta": min((s[-1] for s in defect), default=None),
            "stream_interval": {
                verdict: [n for n, v in intervals.items() if v == verdict]
                for verdict in ("ok", "vllm_defect", "failure")
            },
            "failures": failures[:20],
            "failure_count": len(failures),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="a model directory tiny_model.py wrote")
    args = parser.parse_args(argv)
    if not (args.model_dir / "lab-model.json").is_file():
        raise SystemExit(f"tiny_model_stream: {args.model_dir}: no lab-model.json (build the model"
                         " with lab/tiny_model.py --output)")  # fmt: skip
    harness = Harness(args.model_dir)
    report = {case: harness.check(case) for case in CASES}
    print(json.dumps(report, indent=2))
    bad = any(r["failure_count"] or not r["unstreamed_is_script"] for r in report.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
