"""Wall time of `ddpdeploy up --no-wait` for a 2x8 job against a local kube-apiserver.

Run by hand once .ci/kube-build.sh has built the apiserver:

    python benchmarks/bench_up.py [--runs 7]

Each run is a fresh process, end to end as a user sees it: config and discovery, preflight
(CRD, namespace, GPU capacity over two fake 8-GPU nodes, storage class), the server-side dry
run of the PVC and the job, and their apply. The figure is the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kube"))

from apiserver import ControlPlane, find_binaries  # noqa: E402


def _gpu_nodes(admin: object, count: int) -> None:
    nodes = admin.resources.get(api_version="v1", kind="Node")  # type: ignore[attr-defined]
    for i in range(count):
        nodes.create(body={"metadata": {"name": f"gpu-{i}"}})
        nodes.status.patch(
            name=f"gpu-{i}",
            body={
                "status": {
                    "allocatable": {"nvidia.com/gpu": "8"},
                    "capacity": {"nvidia.com/gpu": "8"},
                }
            },
            content_type="application/merge-patch+json",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    apiserver, etcd, missing = find_binaries()
    if missing:
        sys.exit(f"bench_up: no {missing}")
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(Path(tmp), str(apiserver), str(etcd))
        try:
            plane.start()
            plane.install_crd(ROOT / "tests" / "schemas" / "kubeflow.org_pytorchjobs.yaml")
            _gpu_nodes(plane.admin_client(), 2)
            spec = Path(tmp) / "ddpdeploy.yaml"
            spec.write_text("checkpoint: {size: 100Gi}\n")
            # A warm discovery cache after the first run, as a user has.
            env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "XDG_CACHE_HOME": tmp}
            times = []
            for i in range(args.runs):
                argv = ["up", "--image", "t:1", "--nodes", "2", "--gpus", "8", "--no-wait"]
                start = time.monotonic()
                out = subprocess.run(
                    [sys.executable, "-m", "ddpdeploy", *argv, "--name", f"b{i}", "-f", str(spec)],
                    env=env, capture_output=True, text=True,
                )  # fmt: skip
                times.append(time.monotonic() - start)
                if out.returncode:
                    sys.exit(f"bench_up: up failed: {out.stderr}")
            print(f"up --no-wait 2x8, {args.runs} runs: median {statistics.median(times):.2f}s, "
                  f"min {min(times):.2f}s, max {max(times):.2f}s")  # fmt: skip
        finally:
            plane.stop()


if __name__ == "__main__":
    main()
