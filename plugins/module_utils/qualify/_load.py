# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The qualification checks that load the server: concurrency, the context ladder,
a shared-prefix batch, head-of-line blocking.

Prompts are sized in the server's own tokens: two short requests measure the
tokens of the chat template and of one filler sentence (``usage.prompt_tokens``),
and every prompt after that is built to a target token count. Each prompt
starts with its own seeded text, so no rung reuses another's prefix cache
unless the check wants it to. No AnsibleModule here.
"""

from __future__ import annotations

import contextlib
import random
import re
import threading
import time
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._metrics import delta
from ansible_collections.localinference.vllm.plugins.module_utils.qualify import _judge as J
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._checks import (
    QualifyInputError,
    Target,
    chat,
    chat_stream,
    judged,
    result,
    short,
    status_problems,
    stream_problems,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._http import (
    HttpError,
)

_WORDS = (
    *("river", "stone", "garden", "window", "yellow", "quiet", "market", "engine", "letter"),
    *("winter", "harbor", "candle", "silver", "forest", "ladder", "orange", "bridge", "pocket"),
    *("thunder", "mirror", "velvet", "island", "copper", "meadow", "lantern", "signal"),
    *("basket", "marble", "comet", "falcon"),
)
# vLLM's context refusals across versions.
_LIMIT = (
    re.compile(r"maximum context length is (\d+)"),
    re.compile(r"max_model_len[= ]+(\d+)"),
    re.compile(r"maximum model length (?:is )?(\d+)"),
)


def filler(seed: int, sentences: int) -> str:
    rng = random.Random(seed)
    return " ".join(
        " ".join(rng.choice(_WORDS) for _ in range(9)).capitalize() + "." for _ in range(sentences)
    )


class Sizer:
    """Prompt tokens = base + per_sentence * sentences, measured on this server."""

    def __init__(self, target: Target) -> None:
        counts = []
        for sentences in (8, 24):
            response, message = chat(
                target,
                [{"role": "user", "content": filler(7, sentences)}],
                max_tokens=1,
            )
            tokens = ((message or {}).get("usage") or {}).get("prompt_tokens")
            if response.status != 200 or not isinstance(tokens, int):
                raise HttpError(
                    "cannot size prompts: a short request answered HTTP"
                    f" {response.status} {short(response.error_message())}"
                )
            counts.append(tokens)
        self.per_sentence = max((counts[1] - counts[0]) / 16, 1.0)
        self.base = max(counts[0] - 8 * self.per_sentence, 0.0)

    def sentences_for(self, tokens: int) -> int:
        return max(1, int((tokens - self.base) / self.per_sentence))


def served_limit(target: Target) -> tuple[int | None, list[str]]:
    """The served max_model_len (``/models``), checked against the declared one."""
    response = target.client.request("GET", "models")
    if response.status != 200:
        return target.max_model_len, status_problems("GET /models", response)
    served = next(
        (
            m.get("max_model_len")
            for m in (response.json() or {}).get("data") or []
            if isinstance(m, dict) and m.get("id") == target.model
        ),
        None,
    )
    if target.max_model_len and served and served != target.max_model_len:
        return served, [
            f"the server serves max_model_len {served}, the plan says {target.max_model_len}:"
            " roll the plan out (--tags rollout)"
        ]
    return served or target.max_model_len, []


def _number(target: Target, name: str, default: float) -> float:
    """``params.<name>``: a finite number, 0 or more (``validate.number``)."""
    try:
        return validate.number(f"params.{name}", target.params.get(name, default), minimum=0)
    except validate.ValidationError as exc:
        raise QualifyInputError(str(exc)) from None


# --- concurrency -------------------------------------------------------------------------


class Sampler(threading.Thread):
    """Polls /metrics while requests run; each sample keeps when its fetch started and ended."""

    def __init__(self, target: Target, interval: float) -> None:
        super().__init__(daemon=True)
        self.target, self.interval = target, interval
        self.stop = threading.Event()
        self.samples: list[tuple[float, float, float, float]] = []  # start, end, running, waiting
        self.error: str | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            summary, error = self.target.metrics()
            if summary is None:
                self.error = error
                return
            self.samples.append(
                (
                    started,
                    time.monotonic(),
                    summary["requests_running"] or 0.0,
                    summary["requests_waiting"] or 0.0,
                )
            )
            self.stop.wait(self.interval)

    def within(self, begin: float, end: float) -> list[tuple[float, float, float, float]]:
        """Samples read wholly while every request was in flight (sent, none finished)."""
        return [s for s in self.samples if s[0] >= begin and s[1] <= end]


def _parallel(target: Target, bodies: list[dict[str, Any]], stream: bool) -> list[dict[str, Any]]:
    """Requests sent together; each outcome has its absolute start and end (and first-token) times.

    Non-streamed requests leave the client idle while the server works: on a
    small machine a client parsing N streams competes with the engine for CPU.
    """
    outcomes: list[dict[str, Any]] = [{} for _ in bodies]
    gate = threading.Barrier(len(bodies))

    def one(index: int) -> None:
        out = outcomes[index]
        with contextlib.suppress(threading.BrokenBarrierError):
            gate.wait(timeout=30)
        out["start"] = time.monotonic()
        try:
            if stream:
                response, message = chat_stream(target, **bodies[index])
                out["problems"] = stream_problems(response, message)
            else:
                response, message = chat(target, **bodies[index])
                out["problems"] = status_problems("the request", response) + (
                    (message or {}).get("shape_problems") or []
                )
        except HttpError as err:
            out["error"] = str(err)
            out["end"] = time.monotonic()
            return
        out["end"] = time.monotonic()
        out["message"] = message
        if message and message.get("first_token_t") is not None:
            out["first"] = out["start"] + message["first_token_t"]

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def _problems(outcomes: list[dict[str, Any]], offset: int = 0) -> list[str]:
    return [
        f"request {index}: {problem}"
        for index, out in enumerate(outcomes, start=offset)
        for problem in ([out["error"]] if "error" in out else out.get("problems", []))
    ]


def _one_request_s(target: Target, max_tokens: int) -> float:
    """One request alone, not streamed: its seconds (the baseline of the concurrency check)."""
    response, message = chat(
        target,
        [{"role": "user", "content": "Request alone: " + filler(99, 2)}],
        max_tokens=max_tokens,
        ignore_eos=True,
    )
    problems = status_problems("the request alone", response)
    if problems or message is None:
        raise HttpError("; ".join(problems or ["the request alone answered no message"]))
    return response.seconds


def check_concurrency(target: Target) -> dict[str, Any]:
    n = target.param("requests", 4, int)
    if n < 2:
        raise QualifyInputError(f"params.requests must be at least 2, got {n}")
    # Each request must last long enough for all to be running together, whatever the
    # decode speed (a 2-core CPU and a GPU differ a hundredfold): sized from one request alone.
    max_tokens = target.params.get("max_tokens")
    cap = max(64, min((target.max_model_len or 8192) // 2, 8192))
    if max_tokens is None:
        probe = _one_request_s(target, 256)
        max_tokens = int(_number(target, "min_duration_s", 3.0) / max(probe / 256, 1e-5))
        max_tokens = max(64, min(max_tokens, cap))
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise QualifyInputError(f"params.max_tokens must be a positive integer, got {max_tokens!r}")
    alone = _one_request_s(target, max_tokens)
    sampler = Sampler(target, _number(target, "sample_interval", 0.1))
    bodies = [
        {
            "messages": [{"role": "user", "content": f"Request {i}: " + filler(100 + i, 2)}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        for i in range(n)
    ]
    sampler.start()
    started = time.monotonic()
    outcomes = _parallel(target, bodies, stream=False)
    wall = time.monotonic() - started
    sampler.stop.set()
    sampler.join(timeout=30)
    server = _problems(outcomes)
    last_sent = max(o["start"] for o in outcomes)
    first_done = min(o["end"] for o in outcomes)
    all_sent_first = last_sent < first_done
    speedup = n * alone / wall if wall > 0 else None
    during = sampler.within(last_sent, first_done)
    peak_running = max((s[2] for s in during), default=None)
    peak_waiting = max((s[3] for s in during), default=None)
    evidence: dict[str, Any] = {
        "requests": n,
        "max_tokens": max_tokens,
        "all_sent_before_any_finished": all_sent_first,
        "speedup_over_one_at_a_time": round(speedup, 2) if speedup else None,
        "metrics_samples": len(sampler.samples),
        "metrics_samples_during_the_burst": len(during),
        "peak_requests_running": peak_running,
        "peak_requests_waiting": peak_waiting,
    }
    if sampler.error:
        evidence["metrics_error"] = sampler.error
    timings = {"one_request_s": alone, "wall_s": wall}
    min_speedup = _number(target, "min_speedup", 1.3)
    if not server:
        if during and peak_running < n:
            server.append(
                f"while all {n} requests were in flight vLLM ran at most {peak_running:g} of them"
                f" (waiting peaked at {peak_waiting:g}): max_num_seqs or the KV cache serialises"
                " the agent (F3)"
            )
        elif not during and (not all_sent_first or (speedup or 0) < min_speedup):
            why = sampler.error or "no /metrics read fell inside the burst"
            server.append(
                f"the {n} requests took {wall:.2f} s together, {alone:.2f} s alone: they ran one"
                f" after another (speedup {speedup or 0:.2f} < {min_speedup:g}); max_num_seqs"
                f" below the agent's concurrency serialises it (F3). /metrics did not confirm: {why}"
            )
    return judged("concurrency", target, server, [], timings, evidence)


# --- context ladder --------------------------------------------------------------------------


def _refused_at(message: str) -> int | None:
    for pattern in _LIMIT:
        match = pattern.search(message)
        if match:
            return int(match.group(1))
    return None


def check_context_ladder(target: Target) -> dict[str, Any]:
    fractions = target.param("fractions", [0.25, 0.5, 0.9, 1.1], list)
    if not fractions or not all(
        isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 4 for f in fractions
    ):
        raise QualifyInputError(f"params.fractions must be numbers in (0, 4], got {fractions!r}")
    limit, server = served_limit(target)
    if not limit:
        return result(
            "context_ladder",
            J.FAIL,
            "the served max_model_len is unknown: pass max_model_len",
            {},
            {},
        )
    sizer = Sizer(target)
    run = random.SystemRandom().randrange(10**9)
    rungs: list[dict[str, Any]] = []
    for index, fraction in enumerate(sorted(fractions)):
        want = int(fraction * limit)
        # A fresh first block per run and rung: no rung is served from the prefix cache.
        text = f"Run {run} document {index}. " + filler(run + index, sizer.sentences_for(want))
        stream, message = chat_stream(
            target, [{"role": "user", "content": text + " Reply with one word."}], max_tokens=1
        )
        rung: dict[str, Any] = {
            "fraction": fraction,
            "target_tokens": want,
            "status": stream.status,
        }
        predicted_ok = want + 1 <= limit
        rung["predicted"] = "accepted" if predicted_ok else "refused"
        if stream.status == 200 and message is not None:
            prompt_tokens = (message["usage"] or {}).get("prompt_tokens")
            ttft = message["first_token_t"]
            rung.update(
                prompt_tokens=prompt_tokens,
                ttft_s=round(ttft, 4) if ttft is not None else None,
                prefill_tps=round(prompt_tokens / ttft, 1) if prompt_tokens and ttft else None,
            )
            server += stream_problems(stream, message)
            actual = prompt_tokens if isinstance(prompt_tokens, int) else want
            if actual + 1 > limit:
                server.append(
                    f"a prompt of {actual} tokens was accepted beyond max_model_len {limit}"
                )
        elif stream.status == 400:
            refused_at = _refused_at(stream.error_message())
            rung.update(refused_at=refused_at, error=short(stream.error_message(), 300))
            if predicted_ok:
                server.append(
                    f"a prompt of about {want} tokens ({fraction:g} of {limit}) was refused:"
                    f" {short(stream.error_message(), 200)}"
                )
            elif refused_at not in (None, limit):
                server.append(
                    f"the refusal names a limit of {refused_at}, the server serves {limit}"
                )
        else:
            server += status_problems(f"the {fraction:g} rung", stream)
        rung["outcome"] = "accepted" if stream.status == 200 else "refused"
        rungs.append(rung)
    evidence: dict[str, Any] = {
        "max_model_len": limit,
        "tokens_per_sentence": round(sizer.per_sentence, 2),
        "rungs": rungs,
    }
    evidence["needle"] = _needle(target, sizer, limit)
    model = [evidence["needle"]["why"]] if evidence["needle"]["status"] == J.FAIL else []
    timings = {
        "ttft_by_rung_s": {
            str(r["fraction"]): r.get("ttft_s") for r in rungs if r["outcome"] == "accepted"
        }
    }
    out = judged("context_ladder", target, server, model, timings, evidence)
    if out["status"] == J.PASS and evidence["needle"]["status"] == J.NOT_MEANINGFUL:
        out["why"] = f"the ladder held; the needle was not meaningful: {evidence['needle']['why']}"
    return out


def _needle(target: Target, sizer: Sizer, limit: int) -> dict[str, Any]:
    if not target.param("needle", True, bool):
        return {"status": J.NOT_MEANINGFUL, "why": "not tried (params.needle is false)"}
    fraction = _number(target, "needle_fraction", 0.5)
    max_tokens = target.param("needle_max_tokens", 512, int)
    code = f"{random.Random(limit).randrange(1000, 9999)}-QX"
    want = max(64, int(fraction * limit) - max_tokens)
    sentences = sizer.sentences_for(want)
    run = random.SystemRandom().randrange(10**9)
    before, after = filler(run, sentences // 2), filler(run + 1, sentences - sentences // 2)
    text = (
        f"Run {run}. {before} The access code for the vault is {code}. {after}\n\n"
        "What is the access code for the vault? Answer with the code only."
    )
    response, message = chat(target, [{"role": "user", "content": text}], max_tokens=max_tokens)
    out: dict[str, Any] = {
        "code": code,
        "prompt_fraction": fraction,
        "seconds": round(response.seconds, 3),
    }
    if response.status != 200 or message is None:
        return {
            **out,
            "status": J.FAIL,
            "why": f"the needle request answered HTTP {response.status}",
        }
    out.update(finish_reason=message["finish_reason"], answer=short(message["content"] or ""))
    if code in (message["content"] or ""):
        return {**out, "status": J.PASS, "why": ""}
    why = f"the answer does not contain the needle {code} ({J.what_it_did(message)})"
    if target.limitation:
        return {**out, "status": J.NOT_MEANINGFUL, "why": f"{target.limitation} ({why})"}
    return {**out, "status": J.FAIL, "why": why}


# --- shared prefix --------------------------------------------------------------------------


def check_shared_prefix(target: Target) -> dict[str, Any]:
    n = target.param("requests", 8, int)
    prefix_tokens = target.param("prefix_tokens", 2048, int)
    if n < 2 or prefix_tokens < 1:
        raise QualifyInputError(
            "params.requests must be at least 2 and params.prefix_tokens positive"
        )
    before, error = target.metrics()
    if before is None:
        return result(
            "shared_prefix",
            J.FAIL,
            f"the prefix-cache counters cannot be read: {error}; give metrics_url (vLLM's"
            " /metrics, or the ingress route <public url>/<served name>/metrics)",
            {},
            {},
        )
    sizer = Sizer(target)
    run = random.SystemRandom().randrange(10**9)
    prefix = f"Run {run} shared context. " + filler(run, sizer.sentences_for(prefix_tokens))
    bodies = [
        {
            "messages": [
                {"role": "user", "content": f"{prefix}\n\nQuestion {i}: which word came first?"}
            ],
            "max_tokens": 4,
        }
        for i in range(n)
    ]
    started = time.monotonic()
    first, first_message = chat(target, **bodies[0])  # fills the cache
    server = status_problems("the first request of the batch", first)
    outcomes = _parallel(target, bodies[1:], stream=False)
    wall = time.monotonic() - started
    server += _problems(outcomes, offset=1)
    after, error = target.metrics()
    evidence: dict[str, Any] = {"requests": n, "prefix_tokens_target": prefix_tokens}
    if after is None:
        server.append(f"the prefix-cache counters cannot be read after the batch: {error}")
        return judged("shared_prefix", target, server, [], {"wall_s": wall}, evidence)
    window = delta(before, after)
    block = int((after.get("cache_config") or {}).get("block_size") or 16)
    prompt = ((first_message or {}).get("usage") or {}).get("prompt_tokens") or prefix_tokens
    shared_blocks = (
        int(sizer.sentences_for(prefix_tokens) * sizer.per_sentence + sizer.base) // block
    )
    expected = (n - 1) * shared_blocks * block
    evidence.update(
        prompt_tokens=prompt,
        block_size=block,
        prefix_cache_queries=window["prefix_cache_queries"],
        prefix_cache_hits=window["prefix_cache_hits"],
        hit_rate=window["prefix_cache_hit_rate"],
        expected_hits=expected,
        cached_tokens_reported=[
            ((o.get("message") or {}).get("usage") or {}).get("prompt_tokens_details")
            for o in outcomes
        ][:3],
    )
    hits = window["prefix_cache_hits"]
    if not server:
        if window["restarted"]:
            server.append("the server restarted during the batch (its counters went down)")
        elif hits is None:
            server.append("this vLLM publishes no prefix-cache hit counter")
        elif hits < 0.5 * expected or hits <= 0:
            server.append(
                f"prefix-cache hits rose by {hits:g} tokens, expected about {expected} for"
                f" {n - 1} requests sharing {shared_blocks} blocks of {block}: is prefix"
                " caching off (enable_prefix_caching)?"
            )
    return judged("shared_prefix", target, server, [], {"wall_s": wall}, evidence)


# --- head of line ----------------------------------------------------------------------------


def check_head_of_line(target: Target) -> dict[str, Any]:
    limit, server = served_limit(target)
    long_tokens = target.param("long_tokens", int(0.75 * (limit or 8192)), int)
    if limit and long_tokens + 1 > limit:
        raise QualifyInputError(
            f"params.long_tokens {long_tokens} does not fit max_model_len {limit}"
        )
    sizer = Sizer(target)
    short_body = {
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 1,
    }
    alone, alone_message = chat_stream(target, **short_body)
    server += stream_problems(alone, alone_message)
    ttft_alone = (alone_message or {}).get("first_token_t")
    run = random.SystemRandom().randrange(10**9)
    long_text = f"Run {run} long document. " + filler(run, sizer.sentences_for(long_tokens))
    outcome: dict[str, Any] = {}

    def run_long() -> None:
        outcome["start"] = time.monotonic()
        try:
            outcome["stream"], outcome["message"] = chat_stream(
                target, [{"role": "user", "content": long_text}], max_tokens=1
            )
        except HttpError as err:
            outcome["error"] = str(err)

    thread = threading.Thread(target=run_long, daemon=True)
    thread.start()
    time.sleep(_number(target, "short_delay_s", 0.3))
    during, during_message = chat_stream(target, **short_body)
    short_sent = time.monotonic() - during.seconds
    thread.join()
    server += stream_problems(during, during_message)
    if "error" in outcome:
        server.append(f"the long request: {outcome['error']}")
    else:
        server += stream_problems(outcome["stream"], outcome["message"])
    long_message = outcome.get("message") or {}
    long_ttft = long_message.get("first_token_t")
    ttft_during = (during_message or {}).get("first_token_t")
    timings = {
        "short_ttft_alone_s": ttft_alone,
        "short_ttft_during_s": ttft_during,
        "long_ttft_s": long_ttft,
    }
    evidence: dict[str, Any] = {
        "long_prompt_tokens": (long_message.get("usage") or {}).get("prompt_tokens"),
        "short_sent_after_long_s": round(short_sent - outcome.get("start", short_sent), 3),
    }
    if server or None in (ttft_alone, ttft_during, long_ttft):
        return judged(
            "head_of_line", target, server or ["a first token is missing"], [], timings, evidence
        )
    min_long = _number(target, "min_long_prefill_s", 1.0)
    if long_ttft < min_long:
        return result(
            "head_of_line",
            J.NOT_MEANINGFUL,
            f"the long prefill took only {long_ttft:.2f} s (< {min_long:g} s): nothing to stall"
            " behind; raise params.long_tokens",
            timings,
            evidence,
        )
    stall = ttft_during - ttft_alone
    share = stall / long_ttft
    evidence.update(stall_s=round(stall, 3), stall_share_of_long_prefill=round(share, 3))
    max_stall = _number(target, "max_stall_s", 2.0)
    max_share = _number(target, "max_stall_share", 0.5)
    if stall > max_stall and share > max_share:
        server.append(
            f"a short request waited {stall:.2f} s behind a {long_ttft:.2f} s prefill"
            f" ({share:.0%} of it): long prefills block other streams (limit them:"
            " max_num_batched_tokens, chunked prefill, long_prefill_token_threshold)"
        )
    return judged("head_of_line", target, server, [], timings, evidence)
