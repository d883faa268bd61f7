"""`ddpdeploy up` -> first training step on the real e2e cluster, next to `kubectl apply -f`
of the same rendered YAML -> first step: what ddpdeploy adds before a job trains.

Run by hand, as root, with the cluster up and a job image in its Docker engine:

    .ci/cluster.sh up
    python benchmarks/bench_e2e_up.py --image IMAGE [--trials 3]

IMAGE: any `ddpdeploy build --base-image <the local torch image>` (the e2e tests build
one, `ddpdeploy-test/e2e-<pid>:ctx-...`; tests/docker/base_images.py makes the base).

Each trial runs the built-in trainer 2 nodes x 2 processes on CPU (the e2e tier's job:
cpu 400m, memory 1536Mi per pod) twice, each in a fresh namespace: once through
`python -m ddpdeploy up --no-wait` (a fresh process: its start, kubeconfig, preflight,
dry run and apply), once through the built kubectl applying the YAML `ddpdeploy render`
wrote beforehand (not timed). The time is from the command's start to the kubelet's
timestamp on rank 0's first `step` line; the two runs of a trial alternate which goes
first. A namespace is deleted, and its pods gone, before the next run starts.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from e2ejob import SMALL, apis, job_events, wait_for, write_spec  # noqa: E402
from realcluster import Cluster  # noqa: E402

NAME = "bench-up"
STEPS = 40


def _cluster() -> tuple[Cluster, Path]:
    status = subprocess.run(
        ["bash", str(ROOT / ".ci" / "cluster.sh"), "status"], capture_output=True, text=True
    )
    if not status.stdout.startswith("up "):
        sys.exit("bench_e2e_up: no cluster: run `.ci/cluster.sh up` first (as root)")
    kubeconfig = Path(status.stdout.split(None, 1)[1].strip())
    kubectl = Path(os.environ.get("DDPDEPLOY_KUBE_BIN", "")) / "kubectl"
    if not kubectl.is_file():
        found = sorted(Path("/var/cache/ddpdeploy-test").glob("kube-[0-9]*/kubectl"))
        if not found:
            sys.exit("bench_e2e_up: no built kubectl: run .ci/kube-build.sh")
        kubectl = found[-1]
    return Cluster(kubeconfig, kubeconfig.parent), kubectl


def _first_step(core: Any, ns: str, t0: float) -> float:
    """Seconds from ``t0`` to the kubelet's stamp on the job's first `step` line."""
    steps = wait_for(
        f"the first step in {ns}", lambda: job_events(core, ns, NAME, "step"), 600, every=0.2
    )
    return float(steps[0][0].at) - t0


def _fresh(core: Any, tag: str) -> str:
    ns = f"bench-{tag}-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    core.create_namespace({"metadata": {"name": ns}})
    return ns


def _gone(core: Any, ns: str) -> None:
    """Delete the namespace at once and wait until its pods have left the node."""
    for pod in core.list_namespaced_pod(ns).items:
        core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
    core.delete_namespace(ns)
    wait_for(f"{ns}'s pods gone", lambda: not core.list_namespaced_pod(ns).items, 300)


def _by_up(cluster: Cluster, core: Any, spec_file: Path) -> tuple[float, float]:
    ns = _fresh(core, "up")
    env = {**os.environ, **cluster.env}
    try:
        t0 = time.time()
        subprocess.run(
            [sys.executable, "-m", "ddpdeploy", "up", "-f", str(spec_file), "-n", ns, "--no-wait"],
            env=env, check=True, capture_output=True, cwd=ROOT,
        )  # fmt: skip
        own = time.time() - t0
        return _first_step(core, ns, t0), own
    finally:
        _gone(core, ns)


def _by_kubectl(cluster: Cluster, kubectl: Path, core: Any, spec_file: Path) -> tuple[float, float]:
    ns = _fresh(core, "apply")
    try:
        rendered = subprocess.run(
            [sys.executable, "-m", "ddpdeploy", "render", "-f", str(spec_file), "-n", ns],
            check=True, capture_output=True, text=True, cwd=ROOT,
        ).stdout  # fmt: skip
        yaml_file = spec_file.parent / f"{ns}.yaml"
        yaml_file.write_text(rendered)
        t0 = time.time()
        subprocess.run(
            [str(kubectl), "--kubeconfig", str(cluster.kubeconfig), "apply", "-f", str(yaml_file)],
            check=True, capture_output=True,
        )  # fmt: skip
        own = time.time() - t0
        return _first_step(core, ns, t0), own
    finally:
        _gone(core, ns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    cluster, kubectl = _cluster()
    core, _ = apis(cluster)
    spec = {
        **SMALL,
        "name": NAME,
        "image": args.image,
        "command": {"args": ["--steps", str(STEPS)]},
    }
    rows: dict[str, list[tuple[float, float]]] = {"ddpdeploy up": [], "kubectl apply -f": []}
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = write_spec(Path(tmp), spec)
        for trial in range(args.trials):
            runs = [
                ("ddpdeploy up", lambda: _by_up(cluster, core, spec_file)),
                ("kubectl apply -f", lambda: _by_kubectl(cluster, kubectl, core, spec_file)),
            ]
            for label, run in runs if trial % 2 == 0 else runs[::-1]:
                first, own = run()
                rows[label].append((first, own))
                said = f"command {own:5.2f} s, first step {first:5.1f} s"
                print(f"trial {trial + 1}: {label:<17} {said}")
    print("\n| path | command (median) | -> first step (median) | trials |")
    print("|---|---|---|---|")
    for label, got in rows.items():
        firsts = ", ".join(f"{f:.1f}" for f, _ in got)
        own = statistics.median(o for _, o in got)
        first = statistics.median(f for f, _ in got)
        print(f"| `{label}` | {own:.2f} s | {first:.1f} s | {firsts} |")


if __name__ == "__main__":
    main()
