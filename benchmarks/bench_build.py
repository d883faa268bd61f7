"""Benchmark `ddpdeploy build`: full build vs rebuild after a code-only change, and size.

Run by hand on a machine with an engine (see .ci/docker-setup.sh):

    python benchmarks/bench_build.py [--base-image IMAGE] [--repeat 3]

Without --base-image it uses the docker tests' local torch image (built on first use).
Times are end to end, as a user sees them: `python -m ddpdeploy build` in a fresh process.
Target: a code-only rebuild within 5 s, with the user-code layer as small as the code.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
REPO = "ddpdeploy-bench/build"


def build(ws: Path, base: str, *extra: str) -> tuple[str, float]:
    start = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddpdeploy",
            "build",
            "-w",
            str(ws),
            "--image",
            REPO,
            "--base-image",
            base,
            "--network",
            "none",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - start
    if out.returncode:
        sys.exit(f"build failed: {out.stderr}")
    return out.stdout.strip(), seconds


def write_code(ws: Path, files: int = 40) -> None:
    """A small project: some modules and a README, about 200 kB."""
    for i in range(files):
        body = "".join(f"def f{j}(x):\n    return x * {j}\n\n" for j in range(150))
        (ws / f"mod_{i:02d}.py").write_text(body)
    (ws / "train.py").write_text("import mod_00\nprint(mod_00.f1(2))\n")


def mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    client = docker.from_env()
    base = args.base_image
    if base is None:
        sys.path.insert(0, str(ROOT / "tests" / "docker"))
        import base_images

        base = base_images.ensure_images(client)["torch"]

    with tempfile.TemporaryDirectory(prefix="ddpdeploy-bench-") as tmp:
        ws = Path(tmp)
        write_code(ws)
        ref, full = build(ws, base, "--no-cache")
        code_only = []
        for i in range(args.repeat):
            (ws / "train.py").write_text(f"import mod_00\nprint(mod_00.f1({i + 3}))\n")
            ref, seconds = build(ws, base)
            code_only.append(seconds)
        unchanged = build(ws, base)[1]

    image = client.images.get(ref)
    base_size = client.images.get(base).attrs["Size"]
    history = client.api.history(ref)  # newest first
    code_layer = next(h for h in history if "COPY" in h["CreatedBy"] and h["Size"])
    print(f"base image          {base}  {mb(base_size)}")
    print(f"full build          {full:.1f} s  (--no-cache)")
    print(f"code-only rebuild   {statistics.median(code_only):.1f} s  (median of {args.repeat})")
    print(f"unchanged rebuild   {unchanged:.1f} s")
    print(f"image over base     {mb(image.attrs['Size'] - base_size)}")
    print(f"user-code layer     {mb(code_layer['Size'])}")
    for tag in client.images.list(name=REPO):
        for name in tag.tags:
            client.images.remove(name)


if __name__ == "__main__":
    main()
