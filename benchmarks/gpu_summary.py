"""The one summary table of benchmarks/gpu_check.sh, from the files it left in a folder:
tests.xml + tests.rc (pytest's JUnit report and exit code), bench.out + bench.rc (the
trainer benchmark's stdout, ending with its JSON results, its stderr in bench.err, and its
exit code, or `none` when it could not be started).

Exit status 0 only if GPU-only tests ran and passed and the benchmark ran to the end.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

# The targets for the benchmark's figures: (≥ or ≤, bound).
TARGETS = {"steps_per_s_ratio": (">=", 0.97), "stall_ratio": ("<=", 0.10)}


def device() -> str:
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    return f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}"


def test_rows(folder: Path) -> tuple[list[tuple[str, str, str]], bool]:
    rc = (folder / "tests.rc").read_text().strip()
    xml = folder / "tests.xml"
    if not xml.is_file():
        return [("GPU-only tests", f"no report (pytest exit {rc}; timed out?)", "")], False
    rows = []
    for case in ET.parse(xml).iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = "failed" if tag != "skipped" else "skipped"
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        rows.append((name, outcome, f"{float(case.get('time', 0)):.1f} s"))
    if not rows:
        rows.append(("GPU-only tests", f"none found (pytest exit {rc})", ""))
    # On a GPU, all-skipped is a failure (say, CUDA not seen by torch); a dry run skips all.
    ran = any(r[1] == "passed" for r in rows) or bool(os.environ.get("GPU_CHECK_DRY_RUN"))
    return rows, rc == "0" and ran


def bench_results(text: str) -> dict[str, Any] | None:
    """The JSON object the benchmark prints last (indented over several lines)."""
    start = 0 if text.startswith("{") else text.rfind("\n{") + 1
    try:
        return json.loads(text[start:]) if start or text.startswith("{") else None
    except json.JSONDecodeError:
        return None


def flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key} ")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def bench_rows(folder: Path) -> tuple[list[tuple[str, str, str]], bool]:
    rc = (folder / "bench.rc").read_text().strip()
    text = (folder / "bench.out").read_text()
    results = bench_results(text) if rc == "0" else None
    if results is None:
        err = folder / "bench.err"
        last = (err.read_text() if err.is_file() else "").strip() or text.strip()
        why = last.splitlines()[-1:] or ["no output"]
        status = "timed out" if rc == "124" else f"exit {rc}" if rc != "none" else "not run"
        return [("bench_trainer", f"{status}: {why[0]}", "")], False
    rows = []
    for key, value in flatten(results).items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        op, bound = TARGETS.get(key.split()[-1], ("", None))
        target = ""
        if bound is not None:
            met = value >= bound if op == ">=" else value <= bound
            target = f"target {op} {bound}" + ("" if met else ": missed")
        rows.append((f"bench_trainer {key}", shown, target))
    return rows, True


def main(folder: Path) -> int:
    tests, tests_ok = test_rows(folder)
    bench, bench_ok = bench_rows(folder)
    rows = [("check", "result", "time / target"), *tests, *bench]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    print(f"\ngpu_check summary: {device()}")
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    ok = tests_ok and bench_ok
    print(f"gpu_check: {'all passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
