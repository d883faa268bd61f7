"""Cluster verbs at 2, 16 and 128 nodes against a real kube-apiserver (issue #18 §3).

Run by hand once .ci/kube-build.sh has built the apiserver (or DDPDEPLOY_KUBE_APISERVER
names one):

    python benchmarks/bench_cluster.py [--trials 3] [--sizes 2,16,128] [--list-jobs 200]

It starts its own etcd + kube-apiserver (tests/kube/apiserver.py) and plays the operator
and the kubelet with the test actors (tests/kube/actors.py): each job's pods are created
on the kubelet stand-in's Node (tests/kube/kubelet.py, in a process of its own) and set
Running, as the operator and kubelets would, and each pod's log is a few lines, torchrun's
``[rankN]:`` prefix on its rank's. For each size it times, per trial:

- ``up --no-wait`` (preflight, server-side dry run, apply),
- ``status`` of the job with its N pods,
- ``logs`` (every pod's log merged: N log reads through the apiserver from the stand-in;
  its output is checked for every pod's lines and the stand-in's count of reads),
- ``down``,

each as the CLI subprocess (wall, Python start-up included) and in-process (``cli.main``
in this interpreter, imports warm: the command's own cost). ``list`` runs with
``--list-jobs`` jobs of ours in the namespace. In-process runs also count the HTTP requests
each command makes. Indexed Job at 128 nodes: kube-apiserver 1.20 has no Indexed Jobs, so
its objects are created directly (without the 1.21 fields) and only status/logs/down are
timed. Every trial is printed, then a table of medians and their growth with N.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kube"))

from actors import container_status, create_pods, res  # noqa: E402
from apiserver import ControlPlane, find_binaries  # noqa: E402
from kubelet import Kubelet  # noqa: E402

IMAGE = "registry.invalid/train:v1"
MERGE = "application/merge-patch+json"
VERBS = ("up", "status", "logs", "list", "down")
MERGED_LINE = re.compile(r"\[(rank\d+ )?node\d+\] ")  # a line of the merged `logs`


def pod_log(node: int) -> str:
    """Node ``node``'s log (one process per node: its global rank is its node): the agent's
    line, then its rank's, as torchrun prefixes them."""
    return (
        f"agent: node {node} starting 1 worker\n"
        f"[rank{node}]:worker up: rank {node}, local rank 0, host n{node}\n"
        f"[rank{node}]:step 1/2 loss 0.5\n"
        f"[rank{node}]:step 2/2 loss 0.25\n"
    )


def operator_node(pod: str) -> int:
    """The node of a pod the operator named: master-0 is node 0, worker-i node i + 1."""
    return 0 if pod.endswith("-master-0") else int(pod.rsplit("-", 1)[1]) + 1


def merged_lines(node: int) -> list[str]:
    """What the merged `logs` shows of ``pod_log(node)``."""
    rank = f"[rank{node} node{node}]"
    return [
        f"[node{node}] agent: node {node} starting 1 worker",
        f"{rank} worker up: rank {node}, local rank 0, host n{node}",
        f"{rank} step 1/2 loss 0.5",
        f"{rank} step 2/2 loss 0.25",
    ]


def serve_kubelet(folder: str, conn: Connection) -> None:
    """The kubelet stand-in in a process of its own, so that serving N logs costs the timed
    command (run in the benchmark's interpreter) neither CPU time of its own nor the GIL.
    Answers ``conn``: ("logs", {pod: text}), ("reads",) -> the log reads since the last ask,
    ("stop",)."""
    stand_in = Kubelet(Path(folder)).start()
    conn.send((stand_in.port, stand_in.node_name))
    while True:
        what, *args = conn.recv()
        if what == "logs":
            for pod, text in args[0].items():
                stand_in.set_log(pod, text)
            conn.send(None)
        elif what == "reads":
            reads, stand_in.requests[:] = list(stand_in.requests), []
            conn.send(reads)
        else:
            stand_in.stop()
            conn.send(None)
            return


class KubeletProcess:
    def __init__(self, folder: Path) -> None:
        self.conn, theirs = multiprocessing.Pipe()
        spawn = multiprocessing.get_context("spawn")  # no fork of a process with threads
        self.proc = spawn.Process(target=serve_kubelet, args=(str(folder), theirs), daemon=True)
        self.proc.start()
        self.port, self.node_name = self.conn.recv()

    def register(self, admin: Any) -> None:
        Kubelet(Path(), port=self.port, node_name=self.node_name).register(admin)

    def set_logs(self, logs: dict[str, str]) -> None:
        self.conn.send(("logs", logs))
        self.conn.recv()

    def reads(self) -> list[str]:
        self.conn.send(("reads",))
        return self.conn.recv()

    def stop(self) -> None:
        self.conn.send(("stop",))
        self.conn.recv()
        self.proc.join(timeout=10)


class Counter:
    """HTTP requests through the kubernetes client's REST layer, in this process."""

    def __init__(self) -> None:
        from kubernetes.client import rest

        self.count = 0
        self.calls: list[str] = []
        lock = threading.Lock()  # `logs` reads pods from several threads
        original = rest.RESTClientObject.request

        def counted(client: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            with lock:
                self.count += 1
                self.calls.append(f"{method} {url.split('?')[0].split('/', 3)[-1]}")
            return original(client, method, url, *args, **kwargs)

        rest.RESTClientObject.request = counted  # type: ignore[method-assign]

    @contextlib.contextmanager
    def counting(self) -> Iterator[list[str]]:
        self.count, self.calls = 0, []
        yield self.calls


@contextlib.contextmanager
def quiet_fds() -> Iterator[io.StringIO]:
    """fd 1 and 2 into a file for the in-process run (the CLI writes to both); their text
    comes back in the yielded buffer afterwards, to check the run."""
    captured = io.StringIO()
    with tempfile.TemporaryFile("w+") as tmp:
        saved = [os.dup(1), os.dup(2)]
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            captured.write(tmp.read())


class Bench:
    def __init__(
        self,
        plane: ControlPlane,
        kubelet: KubeletProcess,
        workdir: Path,
        trials: int,
        show_requests: bool = False,
    ) -> None:
        self.show_requests = show_requests
        self.plane = plane
        self.kubelet = kubelet
        self.admin = plane.admin_client()
        self.workdir = workdir
        self.trials = trials
        self.env = {
            **os.environ,
            "KUBECONFIG": str(plane.kubeconfig),
            "XDG_CACHE_HOME": str(workdir / "cache"),  # a warm discovery cache, as a user has
        }
        os.environ["KUBECONFIG"] = self.env["KUBECONFIG"]
        os.environ["XDG_CACHE_HOME"] = self.env["XDG_CACHE_HOME"]
        self.spec = workdir / "ddpdeploy.yaml"
        self.spec.write_text("checkpoint: {size: 1Gi}\n")
        self.counter = Counter()
        # (kind, N, verb, mode) -> seconds per trial; requests per in-process run.
        self.times: dict[tuple[str, int, str, str], list[float]] = defaultdict(list)
        self.requests: dict[tuple[str, int, str], int] = {}

    # --- running a verb --------------------------------------------------------------

    def cli(self, argv: list[str]) -> tuple[float, int, str]:
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "ddpdeploy", *argv],
            env=self.env, cwd=self.workdir, capture_output=True, text=True,
        )  # fmt: skip
        return time.perf_counter() - start, out.returncode, out.stdout + out.stderr

    def inproc(self, argv: list[str]) -> tuple[float, int, str, int]:
        from ddpdeploy.cli import main

        # The client reads $KUBECONFIG once, at import (before this benchmark set it).
        argv = [*argv, "--kubeconfig", str(self.plane.kubeconfig)]
        code = 0
        with self.counter.counting(), quiet_fds() as text:
            start = time.perf_counter()
            try:
                main(argv)
            except SystemExit as exc:
                code = int(exc.code or 0)
            took = time.perf_counter() - start
        return took, code, text.getvalue(), self.counter.count

    def timed(self, kind: str, n: int, verb: str, mode: str, argv: list[str], trial: int) -> None:
        if verb == "logs":
            self.kubelet.reads()  # from now on: this run's (`status` reads rank 0's log too)
        if mode == "cli":
            took, code, text = self.cli(argv)
            requests = None
        else:
            took, code, text, requests = self.inproc(argv)
            self.requests[(kind, n, verb)] = requests
        if code != 0:
            sys.exit(f"bench_cluster: {' '.join(argv)} exited {code}: {text.strip()[-600:]}")
        more = f", {requests} requests" if requests is not None else ""
        if verb == "logs":
            more += self.check_logs(argv, n, text)
        self.times[(kind, n, verb, mode)].append(took)
        print(f"  {kind} N={n:<3} {verb:<6} {mode:<7} trial {trial}: {took:.3f}s{more}", flush=True)
        if self.show_requests and mode == "inproc" and trial == 1:
            print("".join(f"      {call}\n" for call in self.counter.calls), end="")

    def check_logs(self, argv: list[str], n: int, text: str) -> str:
        """That the merged `logs` showed every pod's lines, and nothing else, from N reads."""
        lines = text.splitlines()
        shown = [line for line in lines if MERGED_LINE.match(line)]
        missing = [want for node in range(n) for want in merged_lines(node) if want not in lines]
        reads = [r for r in self.kubelet.reads() if r.startswith("/containerLogs/")]
        if missing or len(shown) != 4 * n or len(reads) != n:
            sys.exit(
                f"bench_cluster: {' '.join(argv)}: {len(shown)} lines of {4 * n}, "
                f"{len(reads)} log reads of {n}; missing {missing[:3]}"
            )
        return f", {len(shown)} lines from {len(reads)} log reads"

    # --- the actors ------------------------------------------------------------------

    def namespace(self, name: str) -> str:
        res(self.admin, "v1", "Namespace").create(body={"metadata": {"name": name}})
        return name

    def pods_running(self, ns: str, nodes: dict[str, int]) -> None:
        """The pods (name -> node) Running, each with its log at the stand-in."""
        pods = res(self.admin, "v1", "Pod")
        status = {
            "phase": "Running",
            "containerStatuses": [container_status(IMAGE, {"running": {}})],
        }
        for name in nodes:
            pods.status.patch(body={"status": status}, name=name, namespace=ns, content_type=MERGE)
        self.kubelet.set_logs({name: pod_log(node) for name, node in nodes.items()})

    def pytorchjob_pods(self, ns: str, name: str) -> None:
        job = res(self.admin, "kubeflow.org/v1", "PyTorchJob").get(name=name, namespace=ns)
        names = create_pods(self.admin, job.to_dict(), node=self.kubelet.node_name)
        self.pods_running(ns, {pod: operator_node(pod) for pod in names})

    def indexed_job(self, ns: str, name: str, n: int) -> None:
        """The Indexed Job's objects, created without the fields 1.20 lacks, and its pods
        as the Job controller names and labels them."""
        from ddpdeploy.cluster.saved import with_saved_spec
        from ddpdeploy.commands.options import spec_from_flags
        from ddpdeploy.targets import render_objects

        file = self.workdir / f"indexed-{n}.yaml"
        file.write_text(f"target: indexed-job\nnodes: {n}\ncheckpoint: {{size: 1Gi}}\n")
        spec = spec_from_flags(file, {"--image": IMAGE, "--name": name, "--namespace": ns})
        for obj in with_saved_spec(render_objects(spec), spec):
            if obj["kind"] == "Job":
                for field in ("completionMode", "podFailurePolicy"):
                    obj["spec"].pop(field, None)
            res(self.admin, obj["apiVersion"], obj["kind"]).create(namespace=ns, body=obj)
        pods = res(self.admin, "v1", "Pod")
        nodes = {}
        for index in range(n):
            labels = {
                "batch.kubernetes.io/job-name": name,
                "batch.kubernetes.io/job-completion-index": str(index),
            }
            body = {
                "metadata": {"name": f"{name}-{index}-x{index:03d}", "labels": labels},
                "spec": {"hostname": f"{name}-{index}", "nodeName": self.kubelet.node_name,
                         "containers": [{"name": "pytorch", "image": IMAGE}]},
            }  # fmt: skip
            pods.create(namespace=ns, body=body)
            nodes[body["metadata"]["name"]] = index
        self.pods_running(ns, nodes)

    def list_jobs(self, ns: str, count: int) -> None:
        """``count`` PyTorchJobs of ours, created directly (what `up` would submit)."""
        from ddpdeploy.cluster.saved import with_saved_spec
        from ddpdeploy.commands.options import spec_from_flags
        from ddpdeploy.targets import render_objects

        jobs = res(self.admin, "kubeflow.org/v1", "PyTorchJob")
        for i in range(count):
            given = {"--image": IMAGE, "--name": f"l{i}", "--namespace": ns}
            spec = spec_from_flags(self.spec, given)
            for obj in with_saved_spec(render_objects(spec), spec):
                if obj["kind"] == "PyTorchJob":
                    jobs.create(namespace=ns, body=obj)

    # --- the runs --------------------------------------------------------------------

    def pytorchjob(self, n: int) -> None:
        ns = self.namespace(f"pt{n}")
        for trial in range(1, self.trials + 1):
            for mode in ("cli", "inproc"):
                name = f"j{mode[0]}{trial}"
                up = ["up", "--image", IMAGE, "--name", name, "-n", ns, "-f", str(self.spec)]
                self.timed(
                    "pytorchjob", n, "up", mode, [*up, "--nodes", str(n), "--no-wait"], trial
                )
                self.pytorchjob_pods(ns, name)
                self.verbs("pytorchjob", n, mode, name, ns, trial)

    def indexed(self, n: int) -> None:
        ns = self.namespace(f"ij{n}")
        for trial in range(1, self.trials + 1):
            for mode in ("cli", "inproc"):
                name = f"j{mode[0]}{trial}"
                self.indexed_job(ns, name, n)
                self.verbs("indexed-job", n, mode, name, ns, trial)

    def verbs(self, kind: str, n: int, mode: str, name: str, ns: str, trial: int) -> None:
        self.timed(kind, n, "status", mode, ["status", name, "-n", ns], trial)
        self.timed(kind, n, "logs", mode, ["logs", name, "-n", ns], trial)
        self.timed(kind, n, "down", mode, ["down", name, "-n", ns], trial)

    def listing(self, count: int) -> None:
        ns = self.namespace("listing")
        self.list_jobs(ns, count)
        for trial in range(1, self.trials + 1):
            for mode in ("cli", "inproc"):
                self.timed("pytorchjob", count, "list", mode, ["list", "-n", ns], trial)

    def waiting(self, n: int) -> None:
        """`up --wait` (the CLI) of an N-node job whose pods run: from the moment the job's
        Succeeded condition is written to `up`'s line saying so (and to its exit)."""
        from actors import set_job_conditions, wait_for_job

        ns = self.namespace(f"wait{n}")
        for trial in range(1, self.trials + 1):
            name = f"w{trial}"
            argv = ["up", "--image", IMAGE, "--name", name, "-n", ns, "-f", str(self.spec)]
            proc = subprocess.Popen(
                [sys.executable, "-m", "ddpdeploy", *argv, "--nodes", str(n), "--wait"],
                env=self.env, cwd=self.workdir, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            self.pytorchjob_pods(ns, wait_for_job(self.admin, ns, name, proc)["metadata"]["name"])
            time.sleep(3)  # `up` is watching (or polling) by now
            flipped = time.perf_counter()
            set_job_conditions(self.admin, ns, name, ("Created", ""), ("Succeeded", "done"))
            seen = None
            assert proc.stderr is not None
            for line in proc.stderr:
                if "succeeded" in line:
                    seen = time.perf_counter() - flipped
            proc.wait(timeout=60)
            took = time.perf_counter() - flipped
            if proc.returncode or seen is None:
                sys.exit(f"bench_cluster: up --wait exited {proc.returncode}")
            self.times[("pytorchjob", n, "wait", "cli")].append(seen)
            print(f"  pytorchjob N={n:<3} up --wait: Succeeded -> its line {seen:.3f}s, "
                  f"-> exit {took:.3f}s, trial {trial}")  # fmt: skip

    def warm_up(self) -> None:
        """Imports and the discovery cache warm before the in-process trials."""
        ns = self.namespace("warm")
        for argv in (["list", "-n", ns], ["status", "none", "-n", ns]):
            self.inproc(argv)
            self.cli(argv)

    # --- the report ------------------------------------------------------------------

    def table(self, sizes: list[int], list_jobs: int | None) -> None:
        print("\nmedian seconds (in-process / CLI), requests in-process, growth vs. N=2:")
        print(
            f"{'kind':<12} {'verb':<7} {'N':>4} {'in-proc':>8} {'CLI':>7} {'reqs':>5} {'growth':>7}"
        )
        for kind, ns in (("pytorchjob", sizes), ("indexed-job", [128] if 128 in sizes else [])):
            for verb in VERBS:
                if verb == "list":
                    continue
                base = None
                for n in ns:
                    inproc = self.times.get((kind, n, verb, "inproc"))
                    cli = self.times.get((kind, n, verb, "cli"))
                    if not inproc:
                        continue
                    med = statistics.median(inproc)
                    base = base or med
                    reqs = self.requests.get((kind, n, verb), 0)
                    clim = f"{statistics.median(cli):7.3f}" if cli else "    n/a"
                    print(f"{kind:<12} {verb:<7} {n:>4} {med:8.3f} {clim} {reqs:>5} "
                          f"{med / base:6.2f}x")  # fmt: skip
        for n in sizes:
            if waited := self.times.get(("pytorchjob", n, "wait", "cli")):
                med = statistics.median(waited)
                row = f"{'pytorchjob':<12} {'wait':<7} {n:>4} {'':>8} {med:7.3f}"
                print(f"{row}   (up --wait: Succeeded -> its line)")
        if list_jobs is None:
            return
        inproc = self.times[("pytorchjob", list_jobs, "list", "inproc")]
        cli = self.times[("pytorchjob", list_jobs, "list", "cli")]
        reqs = self.requests[("pytorchjob", list_jobs, "list")]
        print(f"{'pytorchjob':<12} {'list':<7} {list_jobs:>4} {statistics.median(inproc):8.3f} "
              f"{statistics.median(cli):7.3f} {reqs:>5}   (jobs in the namespace)")  # fmt: skip


def startup_cost(env: dict[str, str], cwd: Path, trials: int) -> None:
    """What Python start-up and the imports cost a CLI run, before any request."""
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "ddpdeploy --version": [sys.executable, "-m", "ddpdeploy", "--version"],
        "import kubernetes client": [
            sys.executable, "-c", "import kubernetes.client, kubernetes.dynamic"],
    }  # fmt: skip
    for what, argv in cases.items():
        times = []
        for _ in range(trials):
            start = time.perf_counter()
            subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=True)
            times.append(time.perf_counter() - start)
        shown = ", ".join(f"{t:.3f}" for t in times)
        print(f"start-up: {what:<26} median {statistics.median(times):.3f}s ({shown})")


def load() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--sizes", default="2,16,128")
    parser.add_argument("--list-jobs", type=int, default=200)
    parser.add_argument("--json", type=Path, help="also write every trial here")
    parser.add_argument(
        "--only-wait", action="store_true", help="only time `up --wait` seeing the end"
    )
    parser.add_argument(
        "--only-jobs",
        action="store_true",
        help="only the jobs' verbs at each size (no start-up, list or `up --wait`)",
    )
    parser.add_argument(
        "--show-requests", action="store_true", help="print each in-process run's requests"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    apiserver, etcd, missing = find_binaries()
    if missing:
        sys.exit(f"bench_cluster: no {missing}")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"load {load()}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(Path(tmp), str(apiserver), str(etcd))
        kubelet = None
        try:
            plane.start()
            plane.install_crd(ROOT / "tests" / "schemas" / "kubeflow.org_pytorchjobs.yaml")
            kubelet = KubeletProcess(Path(tmp))
            kubelet.register(plane.admin_client())
            bench = Bench(plane, kubelet, Path(tmp), args.trials, args.show_requests)
            bench.warm_up()
            if args.only_wait:
                for n in sizes:
                    bench.waiting(n)
                return
            if not args.only_jobs:
                startup_cost(bench.env, Path(tmp), args.trials)
            for n in sizes:
                bench.pytorchjob(n)
            if 128 in sizes:
                bench.indexed(128)
            if not args.only_jobs:
                bench.listing(args.list_jobs)
                for n in sizes:
                    bench.waiting(n)
            bench.table(sizes, None if args.only_jobs else args.list_jobs)
            print(f"load at the end {load()}")
            if args.json:
                rows = [
                    {"kind": k, "n": n, "verb": v, "mode": m, "seconds": t}
                    for (k, n, v, m), t in bench.times.items()
                ]
                args.json.write_text(json.dumps(rows, indent=1))
        finally:
            if kubelet is not None:
                kubelet.stop()
            plane.stop()


if __name__ == "__main__":
    main()
