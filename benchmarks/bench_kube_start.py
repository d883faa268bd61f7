"""Wall time of the cluster verbs as a user runs them, the kubernetes client's start
included (issue 25 §6, issue 24 §3): `status`, `logs`, `list` and `down` of a running
2-node PyTorchJob against a real kube-apiserver, each a fresh `python -m ddpdeploy`.

Run by hand once .ci/kube-apiserver.sh has built the apiserver (or DDPDEPLOY_KUBE_APISERVER
names one):

    python benchmarks/bench_kube_start.py [--trials 5] [--before REF]

It starts its own etcd + kube-apiserver (tests/kube/apiserver.py) and the kubelet stand-in
(tests/kube/kubelet.py, in a process of its own), as bench_cluster.py does. Per trial it
`up`s a job (not timed), creates its pods on the stand-in's node, Running, each with a log
of a few lines, then times `status` (the job, its pods, rank 0's log for its progress),
`logs` (every pod's log merged), `list` (the namespace's jobs) and `down`. ``--before REF``
also times that commit of this repository (exported with git archive, run through
PYTHONPATH with the same interpreter and packages), its trials interleaved with this tree's
so that both see the same load. Every trial is printed, then the medians; each tree's
kubernetes modules (all, and generated API/model ones) are counted in one extra run of
each verb. The discovery cache is warm, as a user's is after the first command.
``--without-validate`` hides kubernetes-validate (a dev extra here, which the client's
dynamic module imports when present, jsonschema with it) from both trees, as in a user's
install.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kube"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from actors import container_status, create_pods, res  # noqa: E402
from apiserver import ControlPlane, find_binaries  # noqa: E402
from bench_cluster import IMAGE, MERGE, KubeletProcess, load  # noqa: E402

VERBS = ("status", "logs", "list", "down")
GENERATED = ("kubernetes.client.api.", "kubernetes.client.models.")
# `python -m ddpdeploy ARGS`, writing the modules it loaded to $MODULES as it exits.
COUNTING = textwrap.dedent(
    """
    import atexit, json, os, runpy, sys
    atexit.register(lambda: open(os.environ["MODULES"], "w").write(json.dumps(list(sys.modules))))
    sys.argv = ["ddpdeploy", *sys.argv[1:]]
    runpy.run_module("ddpdeploy", run_name="__main__")
    """
)


class Tree:
    """A checkout of ddpdeploy to time: this one, or a commit exported to a folder."""

    def __init__(self, label: str, path: Path | None, env: dict[str, str]) -> None:
        self.label = label
        self.env = dict(env)
        if path is not None:  # ahead of the editable install of this tree
            self.env["PYTHONPATH"] = os.pathsep.join(
                [str(path), *filter(None, [env.get("PYTHONPATH")])]
            )

    def run(self, args: list[str], cwd: Path, counting: Path | None = None) -> tuple[float, str]:
        argv = ["-c", COUNTING, *args] if counting else ["-m", "ddpdeploy", *args]
        env = {**self.env, "MODULES": str(counting)} if counting else self.env
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True
        )
        took = time.perf_counter() - start
        if out.returncode != 0:
            sys.exit(f"bench_kube_start ({self.label}): {' '.join(args)} exited "
                     f"{out.returncode}: {(out.stdout + out.stderr).strip()[-600:]}")  # fmt: skip
        return took, out.stdout


def exported(ref: str, folder: Path) -> Path:
    """Commit ``ref`` of this repository, its files in ``folder`` (git archive)."""
    folder.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


class Bench:
    def __init__(self, plane: ControlPlane, kubelet: KubeletProcess, workdir: Path) -> None:
        self.plane = plane
        self.admin = plane.admin_client()
        self.kubelet = kubelet
        self.workdir = workdir
        self.spec = workdir / "ddpdeploy.yaml"
        self.spec.write_text("checkpoint: {size: 1Gi}\n")
        self.ns = "start"
        res(self.admin, "v1", "Namespace").create(body={"metadata": {"name": self.ns}})
        self.times: dict[tuple[str, str], list[float]] = defaultdict(list)

    def job(self, tree: Tree, name: str) -> None:
        """`up` (not timed), then its pods Running on the stand-in's node, with logs."""
        up = ["up", "-f", str(self.spec), "--image", IMAGE, "--name", name, "-n", self.ns]
        tree.run([*up, "--nodes", "2", "--no-wait"], self.workdir)
        job = res(self.admin, "kubeflow.org/v1", "PyTorchJob").get(name=name, namespace=self.ns)
        pods = create_pods(self.admin, job.to_dict(), node=self.kubelet.node_name)
        status = {
            "phase": "Running",
            "containerStatuses": [container_status(IMAGE, {"running": {}})],
        }
        logs = {}
        for node, pod in enumerate(pods):
            res(self.admin, "v1", "Pod").status.patch(
                body={"status": status}, name=pod, namespace=self.ns, content_type=MERGE
            )
            logs[pod] = f"agent: node {node}\n[rank{node}]:step 1/2 loss 0.5\n"
        self.kubelet.set_logs(logs)

    def argv(self, verb: str, name: str) -> list[str]:
        return ["list", "-n", self.ns] if verb == "list" else [verb, name, "-n", self.ns]

    def trial(self, tree: Tree, trial: int) -> None:
        name = f"{tree.label}-{trial}"
        self.job(tree, name)
        shown = []
        for verb in VERBS:
            took, stdout = tree.run(self.argv(verb, name), self.workdir)
            if verb == "logs" and "[rank1 node1] step 1/2 loss 0.5" not in stdout:
                sys.exit(f"bench_kube_start ({tree.label}): logs missed a line: {stdout!r}")
            self.times[(tree.label, verb)].append(took)
            shown.append(f"{verb} {took:.3f}")
        print(f"  {tree.label:<7} trial {trial}: {', '.join(shown)} s  (load {load()})", flush=True)

    def modules(self, tree: Tree) -> dict[str, tuple[int, int]]:
        """Per verb: (kubernetes modules loaded, of them generated API classes/models)."""
        name = f"{tree.label}-count"
        self.job(tree, name)
        counts = {}
        for verb in VERBS:
            file = self.workdir / f"modules-{tree.label}-{verb}.json"
            tree.run(self.argv(verb, name), self.workdir, counting=file)
            loaded = [m for m in json.loads(file.read_text()) if m.startswith("kubernetes")]
            counts[verb] = (len(loaded), sum(m.startswith(GENERATED) for m in loaded))
        return counts


def baseline(tree: Tree, cwd: Path, trials: int) -> None:
    """Python's start, the CLI's own without the client, and the client's import, before
    and now: what the verbs stand on."""
    floors = {
        "python -c pass": ["-c", "pass"],
        "ddpdeploy --version": ["-m", "ddpdeploy", "--version"],
        # the client as the adapter imported it before (CoreV1Api: logs, status's progress)
        "import kubernetes + CoreV1Api": ["-c", "import kubernetes; kubernetes.client.CoreV1Api"],
        "import kubernetes": ["-c", "import kubernetes"],
        # what it imports now, of the same client
        "the adapter's _load_client()": [
            "-c", "from ddpdeploy.adapters.kube import _load_client; _load_client()"],
    }  # fmt: skip
    for what, argv in floors.items():
        times = []
        for _ in range(trials):
            start = time.perf_counter()
            subprocess.run([sys.executable, *argv], env=tree.env, cwd=cwd, capture_output=True)
            times.append(time.perf_counter() - start)
        shown = ", ".join(f"{t:.3f}" for t in times)
        print(f"floor: {what:<30} median {statistics.median(times):.3f} s ({shown})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--before", metavar="REF", help="also time this commit, interleaved")
    parser.add_argument("--json", type=Path, help="also write every trial here")
    parser.add_argument(
        "--without-validate", action="store_true", help="hide kubernetes-validate (dev extra)"
    )
    args = parser.parse_args()
    apiserver, etcd, missing = find_binaries()
    if missing:
        sys.exit(f"bench_kube_start: no {missing}")
    hidden = ", without kubernetes-validate" if args.without_validate else ""
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"load {load()}{hidden}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plane = ControlPlane(work, str(apiserver), str(etcd))
        kubelet = None
        try:
            plane.start()
            plane.install_crd(ROOT / "tests" / "schemas" / "kubeflow.org_pytorchjobs.yaml")
            kubelet = KubeletProcess(work)
            kubelet.register(plane.admin_client())
            env = {
                **os.environ,
                "KUBECONFIG": str(plane.kubeconfig),
                "XDG_CACHE_HOME": str(work / "cache"),
            }
            if args.without_validate:  # an import of it fails, as where it is not installed
                hidden = work / "hidden" / "kubernetes_validate"
                hidden.mkdir(parents=True)
                (hidden / "__init__.py").write_text("raise ImportError('hidden')\n")
                env["PYTHONPATH"] = str(hidden.parent)
            trees = [Tree("after", None, env)]
            if args.before:
                trees.insert(0, Tree("before", exported(args.before, work / "before"), env))
            bench = Bench(plane, kubelet, work)
            for tree in trees:  # the discovery cache warm, the .pyc files written
                bench.trial(tree, 0)
            bench.times.clear()
            baseline(trees[-1], work, args.trials)
            for trial in range(1, args.trials + 1):
                for tree in trees if trial % 2 else trees[::-1]:
                    bench.trial(tree, trial)
            counts = {tree.label: bench.modules(tree) for tree in trees}
            print("\nwall seconds per CLI run (median; every trial), kubernetes modules loaded "
                  "(generated ones):")  # fmt: skip
            for verb in VERBS:
                for tree in trees:
                    times = bench.times[(tree.label, verb)]
                    shown = ", ".join(f"{t:.2f}" for t in times)
                    total, generated = counts[tree.label][verb]
                    print(f"  {verb:<7} {tree.label:<7} {statistics.median(times):6.3f}  "
                          f"({shown})  modules {total} ({generated})")  # fmt: skip
            print(f"load at the end {load()}")
            if args.json:
                rows = [{"tree": t, "verb": v, "seconds": s} for (t, v), s in bench.times.items()]
                args.json.write_text(json.dumps(rows, indent=1))
        finally:
            if kubelet is not None:
                kubelet.stop()
            plane.stop()


if __name__ == "__main__":
    main()
