"""Throughput of `ddpdeploy collect --from local` for a 1 GB checkpoint.

Run by hand:  python benchmarks/bench_collect.py [--size-mb 1024] [--runs 3]

Writes one checkpoint in the trainer's layout (payload + sha256 sidecar) under
.ddpdeploy/checkpoints/bench in a temp folder, then times `python -m ddpdeploy collect` end
to end (fresh process: read, sha256, fsync'd write, renames). The figure is the median.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _write_checkpoint(folder: Path, size_mb: int) -> None:
    folder.mkdir(parents=True)
    digest = hashlib.sha256()
    block = os.urandom(1 << 20)
    with open(folder / "ckpt-step-000000100.pt", "wb") as fh:
        for _ in range(size_mb):
            fh.write(block)
            digest.update(block)
    meta = {"step": 100, "sha256": digest.hexdigest(), "file": "ckpt-step-000000100.pt"}
    (folder / "ckpt-step-000000100.json").write_text(json.dumps(meta))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _write_checkpoint(work / ".ddpdeploy" / "checkpoints" / "bench", args.size_mb)
        times = []
        for i in range(args.runs):
            dest = work / f"out{i}"
            start = time.monotonic()
            subprocess.run(
                [sys.executable, "-m", "ddpdeploy", "collect", "bench", "--to", str(dest)],
                cwd=work, check=True, capture_output=True,
            )  # fmt: skip
            times.append(time.monotonic() - start)
            shutil.rmtree(dest)
        median = statistics.median(times)
        print(f"collect {args.size_mb} MB: median {median:.2f}s = {args.size_mb / median:.0f} MB/s "
              f"({args.runs} runs, min {min(times):.2f}s, max {max(times):.2f}s)")  # fmt: skip


if __name__ == "__main__":
    main()
