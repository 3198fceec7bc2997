# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark model_manifest's hashing (a script, not a timed test).

1. Full verification throughput against `cat FILES > /dev/null` on the same
   files, as a ratio in one run (goal: >= 0.8). Both are measured cold (the
   files' pages are evicted with posix_fadvise(DONTNEED) before each run: a
   180 GB checkpoint never sits in the page cache) and warm.
2. The no-change re-run cost per 100 files (goal: well under a second): the
   fast path of verify and of create over an unchanged snapshot.

Usage: .venv/bin/python benchmarks/manifest_verify.py [--files 8] [--file-mib 256]
                                                     [--small-files 1000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab import harness

m = harness.module_utils("_manifest")
MIB = 1024 * 1024


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


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def sha256_per_core() -> float:
    """Hash speed of one core on a buffer already in memory: the ceiling per worker."""
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--file-mib", type=int, default=256)
    parser.add_argument("--small-files", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=0, help="0: one per CPU")
    parser.add_argument(
        "--dir", default=None, help="where to write the test files (default: a temp dir)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="manifest-bench-") as tmp:
        big = os.path.join(tmp, "big")
        os.mkdir(big)
        names = make_big_files(big, args.files, args.file_mib)
        paths = [os.path.join(big, n) for n in names]
        total = args.files * args.file_mib * MIB
        manifest = m.manifest_document(
            m.create(big, None, workers=args.workers).records, None, None
        )
        print(
            f"{args.files} files x {args.file_mib} MiB = {total / MIB:.0f} MiB in {big}; "
            f"{os.cpu_count()} CPUs; hash workers {args.workers or m.default_workers(args.files)}"
        )

        rows = []
        for label, cold in (("cold", True), ("warm", False)):
            if not cold:
                cat(paths)  # warm the cache
            if cold:
                evict(paths)
            t_cat = timed(lambda: cat(paths))
            for workers in sorted({1, args.workers or m.default_workers(args.files)}):
                if cold:
                    evict(paths)
                else:
                    cat(paths)
                start = time.perf_counter()
                outcome = m.verify(big, manifest, full=True, workers=workers, drop_cache=cold)
                t_ver = time.perf_counter() - start
                assert outcome.ok and outcome.hashed == args.files
                rows.append(
                    (label, workers, total / MIB / t_cat, total / MIB / t_ver, t_cat / t_ver)
                )
        print(f"{'cache':<6}{'workers':>8}{'cat MiB/s':>12}{'verify MiB/s':>14}{'ratio':>8}")
        for label, workers, cat_rate, ver_rate, ratio in rows:
            print(f"{label:<6}{workers:>8}{cat_rate:>12.0f}{ver_rate:>14.0f}{ratio:>8.2f}")
        best_cold = max(r[4] for r in rows if r[0] == "cold")
        ceiling = sha256_per_core()
        cold_cat = next(r[2] for r in rows if r[0] == "cold")
        print(
            f"sha256 in memory, one core: {ceiling:.0f} MiB/s; load average {os.getloadavg()[0]:.1f} "
            f"on {os.cpu_count()} CPUs; free cores needed for ratio 0.8: {0.8 * cold_cat / ceiling:.1f}"
        )
        print(f"RATIO full verify / cat (cold, best worker count): {best_cold:.2f} (goal >= 0.8)")

        small = os.path.join(tmp, "small")
        os.mkdir(small)
        for i in range(args.small_files):
            with open(os.path.join(small, f"f{i:05d}.json"), "w") as handle:
                handle.write("{}" * (i % 50 + 1))
        doc = m.manifest_document(m.create(small, None).records, None, None)
        runs = 5
        t_verify = min(timed(lambda: m.verify(small, doc)) for _ in range(runs))
        t_create = min(timed(lambda: m.create(small, doc)) for _ in range(runs))
        assert m.verify(small, doc).hashed == 0 and m.create(small, doc).hashed == 0
        per100 = 100 / args.small_files
        print(
            f"NO-CHANGE re-run per 100 files: verify {t_verify * per100 * 1000:.2f} ms, "
            f"create {t_create * per100 * 1000:.2f} ms (files hashed: 0; goal well under 1 s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
