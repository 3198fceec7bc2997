# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Download one pinned model revision into a Hugging Face cache, space checked first.

Run by the model_weights role on the head node with a Python that has
huggingface_hub.  Prints one JSON object on stdout; exit code 0 on success,
3 when the disk is too small, 2 on any other failure.  The token is read from
stdin (--token-stdin) or taken from a file (--token-file, via HF_TOKEN_PATH),
never from the command line, and is scrubbed from every message.

Downloads resume: huggingface_hub keeps ``blobs/*.incomplete`` and continues
them.  Progress lines (bytes done, total, rate) go to --progress-log every
--progress-interval seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any


def nearest_existing(path: str) -> str:
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe


def plan_space(
    files: Iterable[Any], free_bytes: int, reserve_bytes: int, cache_dir: str
) -> dict[str, Any]:
    """Bytes to download (files marked will_download) against free space; 'msg' set when short."""
    needed = sum(int(f.file_size or 0) for f in files if f.will_download)
    plan: dict[str, Any] = {
        "needed_bytes": needed,
        "free_bytes": free_bytes,
        "reserve_bytes": reserve_bytes,
    }
    if needed + reserve_bytes > free_bytes:
        gib = 1024**3
        plan["msg"] = (
            f"model_weights: the download needs {needed / gib:.1f} GiB plus a reserve of "
            f"{reserve_bytes / gib:.1f} GiB, but the filesystem holding {cache_dir} has only "
            f"{free_bytes / gib:.1f} GiB free. Free space there, or point model_weights_hub_cache "
            "at a larger filesystem (or lower model_weights_disk_reserve_gib)."
        )
    return plan


def directory_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def format_progress(
    done: int, total: int, elapsed: float, previous: tuple[int, float] | None
) -> str:
    """One progress line: bytes done of total, share, rate since the previous line."""
    unit, name = (1024**3, "GiB") if total >= 1024**3 else (1024**2, "MiB")
    if previous:
        rate = (done - previous[0]) / max(elapsed - previous[1], 1e-6)
    else:
        rate = done / max(elapsed, 1e-6)
    pct = 100.0 * done / total if total else 100.0
    return (
        f"{time.strftime('%H:%M:%S')} {done / unit:.2f}/{total / unit:.2f} {name} "
        f"{pct:5.1f}% {rate / 1024**2:.1f} MiB/s"
    )


class Progress(threading.Thread):
    """Write a progress line every interval, from the bytes under the repo's blobs/."""

    def __init__(self, blobs: str, baseline: int, total: int, log: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.blobs, self.baseline, self.total, self.log, self.interval = (
            blobs,
            baseline,
            total,
            log,
            interval,
        )
        self.stop = threading.Event()
        self.started_at = time.monotonic()

    def line(self, previous: tuple[int, float] | None) -> tuple[str, tuple[int, float]]:
        done = max(0, directory_bytes(self.blobs) - self.baseline)
        elapsed = time.monotonic() - self.started_at
        return format_progress(min(done, self.total), self.total, elapsed, previous), (
            done,
            elapsed,
        )

    def run(self) -> None:
        previous = None
        while not self.stop.wait(self.interval):
            text, previous = self.line(previous)
            with open(self.log, "a", encoding="utf-8") as handle:
                handle.write(text + "\n")


def scrub(text: str, token: str | None) -> str:
    return text.replace(token, "<token>") if token else text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo-id", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--reserve-bytes", type=int, default=0)
    parser.add_argument("--max-workers", type=int, default=8)
    parser.add_argument("--token-stdin", action="store_true")
    parser.add_argument("--token-file")
    parser.add_argument(
        "--endpoint", help="a hub mirror (default: huggingface_hub's, or HF_ENDPOINT)"
    )
    parser.add_argument("--progress-log")
    parser.add_argument("--progress-interval", type=float, default=15.0)
    args = parser.parse_args(argv)

    token: str | None = None
    if args.token_stdin:
        token = sys.stdin.read().strip() or None
    if args.token_file:
        os.environ["HF_TOKEN_PATH"] = args.token_file
    result: dict[str, Any] = {"changed": False, "repo_id": args.repo_id, "revision": args.revision}
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        result["msg"] = f"huggingface_hub is not importable by {sys.executable}: {exc}"
        print(json.dumps(result))
        return 2

    common = {
        "repo_id": args.repo_id,
        "revision": args.revision,
        "cache_dir": args.cache_dir,
        "token": token,
        "max_workers": args.max_workers,
        "endpoint": args.endpoint or None,
    }
    try:
        planned = snapshot_download(dry_run=True, **common)
        plan = plan_space(
            planned,
            shutil.disk_usage(nearest_existing(args.cache_dir)).free,
            args.reserve_bytes,
            args.cache_dir,
        )
        result.update(plan)
        result["files"] = len(planned)
        result["downloaded_files"] = sum(1 for f in planned if f.will_download)
        if "msg" in plan:
            print(json.dumps(result))
            return 3
        os.makedirs(args.cache_dir, exist_ok=True)
        progress = None
        if args.progress_log and plan["needed_bytes"]:
            repo_dir = os.path.join(args.cache_dir, "models--" + args.repo_id.replace("/", "--"))
            blobs = os.path.join(repo_dir, "blobs")
            progress = Progress(
                blobs,
                directory_bytes(blobs),
                plan["needed_bytes"],
                args.progress_log,
                args.progress_interval,
            )
            progress.start()
        try:
            path = snapshot_download(**common)
        finally:
            if progress is not None:
                progress.stop.set()
                text, _ = progress.line(None)
                with open(args.progress_log, "a", encoding="utf-8") as handle:
                    handle.write(text + " done\n")
    except Exception as exc:  # the hub raises many kinds; report one line, never the token
        result["msg"] = scrub(
            f"download of {args.repo_id}@{args.revision} failed: {type(exc).__name__}: {exc}", token
        )
        print(json.dumps(result))
        return 2
    result["path"] = path
    result["changed"] = result["downloaded_files"] > 0
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
