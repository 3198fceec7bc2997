# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark model_manifest's hashing (a script, not a timed test).

1. Full verification throughput against `cat FILES > /dev/null` on the same
   files, as a ratio in one run (goal: >= 0.8). Both are measured cold (the
   files' pages are evicted with posix_fadvise(DONTNEED) before each run: a
   180 GB checkpoint never sits in the page cache) and warm. The cold rounds
   alternate cat, the overlapped hashing (read ahead by a reader thread, the
   current code) and the sequential hashing it replaced (read 1 MiB, hash it,
   in turn), and report the median of each: before and after from one run.
2. The no-change re-run cost per 100 files (goal: well under a second): the
   fast path of verify and of create over an unchanged snapshot.
3. Cost growth: cold full verification of the same bytes split into 1 to
   hundreds of files, and the no-change re-run over 100 to 10,000 files.

Usage: .venv/bin/python benchmarks/manifest_verify.py [--files 8] [--file-mib 256]
           [--small-files 1000] [--rounds 3] [--no-growth] [--dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._measured import exit_code
from lab import harness

m = harness.module_utils("weights._manifest")
MIB = 1024 * 1024
# (files, MiB each): the same 512 MiB in one file up to 256 files
GROWTH_LAYOUTS = ((1, 512), (4, 128), (32, 16), (256, 2))
GROWTH_SMALL = (100, 1000, 10000)
# The hashing the reader thread replaced: 1 MiB read, then hashed, in one thread.
sequential_hasher = functools.partial(m.hash_file, chunk_bytes=MIB, overlap=False)


def evict(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_big_files(root: str, count: int, mib: int) -> list[str]:
    block = os.urandom(MIB)
    names = []
    for i in range(count):
        name = f"model-{i + 1:05d}-of-{count:05d}.bin"
        with open(os.path.join(root, name), "wb") as handle:
            for j in range(mib):
                handle.write(block[j % 7 :] + block[: j % 7])
        names.append(name)
    return names


def make_small_files(root: str, count: int) -> None:
    for i in range(count):
        with open(os.path.join(root, f"f{i:05d}.json"), "w") as handle:
            handle.write("{}" * (i % 50 + 1))


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def sha256_per_core() -> float:
    """Hash speed of one core on a buffer already in memory (MiB/s): the ceiling per worker."""
    import hashlib

    block = memoryview(os.urandom(MIB))
    digest = hashlib.sha256()
    start = time.perf_counter()
    for _ in range(256):
        digest.update(block)
    return 256 / (time.perf_counter() - start)


def cat(paths: list[str]) -> None:
    # Not harness.run: its output goes to /dev/null, as in the shell comparison.
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True, timeout=3600)


def full_verify(root: str, manifest: dict[str, Any], workers: int, cold: bool) -> None:
    outcome = m.verify(root, manifest, full=True, workers=workers, drop_cache=cold)
    if not outcome.ok or outcome.hashed != len(manifest["files"]):
        raise SystemExit(f"full verification of {root} failed: {outcome.mismatched[:3]}")


def cold_rounds(
    root: str, names: list[str], manifest: dict[str, Any], workers: int, rounds: int
) -> dict[str, float]:
    """Median cold seconds of cat, the overlapped verify and the sequential hashing, alternated."""
    paths = [os.path.join(root, n) for n in names]
    times: dict[str, list[float]] = {"cat": [], "overlapped": [], "sequential": []}
    for _ in range(rounds):
        evict(paths)
        times["cat"].append(timed(lambda: cat(paths)))
        evict(paths)
        times["overlapped"].append(timed(lambda: full_verify(root, manifest, workers, True)))
        evict(paths)
        times["sequential"].append(
            timed(
                lambda: m.hash_many(
                    root, names, workers=workers, drop_cache=True, hasher=sequential_hasher
                )
            )
        )
    return {key: statistics.median(values) for key, values in times.items()}


def snapshot(root: str, count: int, mib: int) -> tuple[list[str], dict[str, Any]]:
    os.makedirs(root)
    names = make_big_files(root, count, mib)
    return names, m.manifest_document(m.create(root, None).records, None, None)


def no_change_ms_per_100(root: str, count: int, runs: int = 5) -> dict[str, float]:
    os.makedirs(root)
    make_small_files(root, count)
    doc = m.manifest_document(m.create(root, None).records, None, None)
    t_verify = min(timed(lambda: m.verify(root, doc)) for _ in range(runs))
    t_create = min(timed(lambda: m.create(root, doc)) for _ in range(runs))
    if m.verify(root, doc).hashed or m.create(root, doc).hashed:
        raise SystemExit(f"the no-change re-run over {root} hashed files")
    return {
        "files": count,
        "verify_ms_per_100_files": round(t_verify * 100 / count * 1000, 3),
        "create_ms_per_100_files": round(t_create * 100 / count * 1000, 3),
        "verify_seconds": round(t_verify, 4),
    }


def measure(
    files: int = 8,
    file_mib: int = 256,
    small_files: int = 1000,
    workers: int = 0,
    directory: str | None = None,
    rounds: int = 3,
    growth: bool = True,
) -> dict[str, Any]:
    workers = workers or m.default_workers(files)
    load = os.getloadavg()[0]
    result: dict[str, Any] = {"cpus": os.cpu_count(), "load_at_start": round(load, 2)}
    with tempfile.TemporaryDirectory(dir=directory, prefix="manifest-bench-") as tmp:
        big = os.path.join(tmp, "big")
        names, manifest = snapshot(big, files, file_mib)
        paths = [os.path.join(big, n) for n in names]
        total = files * file_mib * MIB
        medians = cold_rounds(big, names, manifest, workers, rounds)
        rows = []
        for workers_used in sorted({1, workers}):
            cat(paths)  # warm
            t_cat = timed(lambda: cat(paths))
            t_ver = timed(functools.partial(full_verify, big, manifest, workers_used, False))
            rows.append(
                {
                    "cache": "warm",
                    "workers": workers_used,
                    "cat_mib_s": round(total / MIB / t_cat),
                    "verify_mib_s": round(total / MIB / t_ver),
                    "ratio": round(t_cat / t_ver, 2),
                }
            )
        result.update(
            {
                "files": files,
                "file_mib": file_mib,
                "workers": workers,
                "rounds": rounds,
                "cat_seconds": round(medians["cat"], 3),
                "verify_seconds": round(medians["overlapped"], 3),
                "verify_ratio": round(medians["cat"] / medians["overlapped"], 2),
                "verify_sequential_seconds": round(medians["sequential"], 3),
                "verify_ratio_sequential": round(medians["cat"] / medians["sequential"], 2),
                "cold_mib_s": {
                    key: round(total / MIB / value) for key, value in medians.items()
                },
                "warm": rows,
                "sha256_mib_s_per_core": round(sha256_per_core()),
            }
        )
        small = no_change_ms_per_100(os.path.join(tmp, "small"), small_files)
        result["reverify_ms_per_100_files"] = small["verify_ms_per_100_files"]
        result["recreate_ms_per_100_files"] = small["create_ms_per_100_files"]
        if growth:
            result["growth"] = growth_tables(tmp, workers, rounds)
    return result


def growth_tables(tmp: str, workers: int, rounds: int) -> dict[str, Any]:
    layouts = []
    for count, mib in GROWTH_LAYOUTS:
        root = os.path.join(tmp, f"growth-{count}x{mib}")
        names, manifest = snapshot(root, count, mib)
        medians = cold_rounds(root, names, manifest, min(workers, count), rounds)
        layouts.append(
            {
                "files": count,
                "file_mib": mib,
                "cat_seconds": round(medians["cat"], 3),
                "verify_seconds": round(medians["overlapped"], 3),
                "sequential_seconds": round(medians["sequential"], 3),
                "ratio": round(medians["cat"] / medians["overlapped"], 2),
            }
        )
        for name in names:
            os.unlink(os.path.join(root, name))
    no_change = [
        no_change_ms_per_100(os.path.join(tmp, f"small-{count}"), count) for count in GROWTH_SMALL
    ]
    return {"full_verify": layouts, "no_change": no_change}


def report(result: dict[str, Any]) -> str:
    files, mib = result["files"], result["file_mib"]
    cold = result["cold_mib_s"]
    lines = [
        f"{files} files x {mib} MiB = {files * mib} MiB; {result['cpus']} CPUs, load average"
        f" {result['load_at_start']:.1f} at start; hash workers {result['workers']};"
        f" cold = median of {result['rounds']} alternated rounds",
        f"{'cache':<6}{'hashing':<13}{'workers':>8}{'cat MiB/s':>12}{'verify MiB/s':>14}{'ratio':>8}",
        f"{'cold':<6}{'overlapped':<13}{result['workers']:>8}{cold['cat']:>12}"
        f"{cold['overlapped']:>14}{result['verify_ratio']:>8.2f}",
        f"{'cold':<6}{'sequential':<13}{result['workers']:>8}{cold['cat']:>12}"
        f"{cold['sequential']:>14}{result['verify_ratio_sequential']:>8.2f}",
    ]
    for row in result["warm"]:
        lines.append(
            f"{'warm':<6}{'overlapped':<13}{row['workers']:>8}{row['cat_mib_s']:>12}"
            f"{row['verify_mib_s']:>14}{row['ratio']:>8.2f}"
        )
    ceiling = result["sha256_mib_s_per_core"]
    lines.append(
        f"sha256 in memory, one core: {ceiling} MiB/s; cores needed for ratio 0.8 at this"
        f" cat rate: {0.8 * cold['cat'] / ceiling:.1f} (one file is hashed by one core: its"
        " whole-file sha256 is sequential)"
    )
    lines.append(
        f"RATIO full verify / cat (cold): {result['verify_ratio']:.2f} (before, sequential"
        f" hashing: {result['verify_ratio_sequential']:.2f}; goal >= 0.8)"
    )
    lines.append(
        f"NO-CHANGE re-run per 100 files: verify {result['reverify_ms_per_100_files']:.2f} ms,"
        f" create {result['recreate_ms_per_100_files']:.2f} ms (files hashed: 0; goal < 1 s)"
    )
    growth = result.get("growth")
    if growth:
        lines.append("growth: the same bytes in more, smaller files (cold, full verify)")
        lines.append(
            f"{'files':>7}{'MiB each':>10}{'cat s':>9}{'verify s':>10}{'sequential s':>14}{'ratio':>8}"
        )
        for row in growth["full_verify"]:
            lines.append(
                f"{row['files']:>7}{row['file_mib']:>10}{row['cat_seconds']:>9.2f}"
                f"{row['verify_seconds']:>10.2f}{row['sequential_seconds']:>14.2f}{row['ratio']:>8.2f}"
            )
        lines.append("growth: the no-change re-run over more files")
        lines.append(f"{'files':>7}{'verify s':>10}{'ms / 100 files':>16}")
        for row in growth["no_change"]:
            lines.append(
                f"{row['files']:>7}{row['verify_seconds']:>10.3f}{row['verify_ms_per_100_files']:>16.2f}"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--file-mib", type=int, default=256)
    parser.add_argument("--small-files", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=0, help="0: one per CPU")
    parser.add_argument("--rounds", type=int, default=3, help="cold rounds; the median is reported")
    parser.add_argument("--no-growth", action="store_true", help="skip the growth tables")
    parser.add_argument(
        "--dir", default=None, help="where to write the test files (default: a temp dir)"
    )
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()
    result = measure(
        args.files,
        args.file_mib,
        args.small_files,
        args.workers,
        args.dir,
        args.rounds,
        not args.no_growth,
    )
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return exit_code("verify", result)


if __name__ == "__main__":
    sys.exit(main())
