"""`collect --from cluster` (collect.pod): the helper pod (built by the pod renderer,
hardened like the job's pods) and the pod source's `sh` programs, run here on real folders
through a stand-in for the exec API; and against a real kube-apiserver, the helper pod it
creates is accepted and gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from actors import res
from checkov_scan import allowlist, checkov_path
from fakekube import FakeKube
from reports import Recorded

from ddpdeploy.cluster.labels import ours
from ddpdeploy.collect.checkpoint import collect, payload_name
from ddpdeploy.collect.debug import MAX_DEBUG
from ddpdeploy.collect.plain import SUMS
from ddpdeploy.collect.pod import READ, PodSource, _running_pod, collect_helper_pod
from ddpdeploy.errors import UserError
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import layout_of, render_objects

from .folders import CUT_NOTE, ExecHere, check_collected, put_checkpoint, put_diagnostics

ROOT = Path(__file__).resolve().parents[2]


JOB = {
    "name": "llm",
    "namespace": "team-a",
    "image": "ghcr.io/team/train:v1",
    "checkpoint": {"size": "10Gi", "mountPath": "/ckpt"},
    "network": {"rdma": {"resource": "rdma/hca"}},
    "imagePullSecrets": ["regcred"],
    "nodeSelector": {"pool": "gpu"},
}


def test_the_helper_pod_is_hardened_like_the_jobs_pods():
    pod = collect_helper_pod(JobSpec.model_validate(JOB))
    spec = pod["spec"]
    (box,) = spec["containers"]
    assert box["image"] == "ghcr.io/team/train:v1"  # the job's own image, no busybox
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert box["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},  # no IPC_LOCK, though the job has RDMA
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }
    assert box["resources"]["limits"]["memory"] and box["resources"]["requests"]["cpu"]
    assert box["volumeMounts"] == [{"name": "checkpoints", "mountPath": "/ckpt", "readOnly": True}]
    assert spec["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "llm-checkpoints",
        "readOnly": True,
    }
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert pod["metadata"]["namespace"] == "team-a"
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "ddpdeploy"
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    loosened = JobSpec.model_validate({**JOB, "security": {"readOnlyRootFilesystem": False}})
    other = collect_helper_pod(loosened, "registry.example/tools:1")
    assert other["spec"]["containers"][0]["image"] == "registry.example/tools:1"
    assert other["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert "busybox" not in yaml.safe_dump(pod)


def test_no_image_and_no_checkpoint_are_one_line_errors():
    with pytest.raises(UserError, match="image"):
        collect_helper_pod(JobSpec.model_validate({**JOB, "image": None}))
    with pytest.raises(UserError, match="no checkpoint volume"):
        collect_helper_pod(JobSpec.model_validate({**JOB, "checkpoint": None}))


@pytest.mark.slow  # starts the scanner, as tests/test_checkov.py does
def test_checkov_passes_the_helper_pod(tmp_path):
    checkov = checkov_path()
    spec = JobSpec(**JOB)
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(collect_helper_pod(spec)))
    # The job's NetworkPolicy, which `up` creates beside the job, covers the reader too.
    policy = [o for o in render_objects(spec) if o["kind"] == "NetworkPolicy"]
    assert len(policy) == 1
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy[0]))
    res = subprocess.run(
        [checkov, "-d", str(tmp_path), "--framework", "kubernetes", "--quiet", "--compact"]
        + ["-o", "json", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    assert res.returncode in (0, 1), res.stderr[-3000:]
    report = json.loads(res.stdout)
    failed = {
        c["check_id"]
        for r in (report if isinstance(report, list) else [report])
        for c in r.get("results", {}).get("failed_checks", [])
    }
    everywhere = {check for check, e in allowlist().items() if e["cases"] == "all"}
    assert failed <= everywhere, f"checkov fails {sorted(failed - everywhere)} on the helper pod"


# -- the pod source: the reader's `sh` programs on a real folder ------------------------


def test_the_pod_source_refuses_symlinks_and_falls_back_past_a_vanished_payload(tmp_path):
    vol = tmp_path / "vol"
    vol.mkdir()
    put_checkpoint(vol, 1, os.urandom(70_000))
    put_checkpoint(vol, 2, b"two")
    put_checkpoint(vol, 3, b"three")
    secret = tmp_path / "secret"
    secret.write_bytes(b"two")  # matches step 2's sha256
    (vol / payload_name(2)).unlink()
    (vol / payload_name(2)).symlink_to(secret)
    os.mkfifo(vol / "pipe")
    (vol / "odd\nname").write_bytes(b"x")

    def delete_step_3(path: str) -> None:
        if path.endswith(payload_name(3)):
            os.unlink(path)  # deleted between the listing and the read

    source = PodSource(ExecHere(delete_step_3), "j-collect", "ns", "reader", str(vol))
    entries = source.entries()
    assert entries[payload_name(2)] == "symlink" and entries["pipe"] == "special file"
    assert entries["odd\nname"] == "regular file"
    said = Recorded()
    warnings = said.warnings
    got = collect(source, tmp_path / "out", report=said)
    assert got.step == 1
    assert (tmp_path / "out" / payload_name(1)).read_bytes() == (vol / payload_name(1)).read_bytes()
    text = "\n".join(warnings)
    assert "step 3" in text and "vanished" in text
    assert "step 2" in text and "a symlink, not a regular file" in text
    assert "skipping pipe" in text


def test_the_pod_source_collects_plain_files(tmp_path):
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "snapshot.pt").write_bytes(os.urandom(50_000))
    (vol / "lost+found").mkdir()
    (vol / "link").symlink_to("/etc/passwd")
    source = PodSource(ExecHere(), "j-master-0", "ns", "pytorch", str(vol))
    got = collect(source, tmp_path / "out")
    assert got.files == ["snapshot.pt"]
    assert (tmp_path / "out" / "snapshot.pt").read_bytes() == (vol / "snapshot.pt").read_bytes()
    check = subprocess.run(["sha256sum", "-c", SUMS], cwd=tmp_path / "out", capture_output=True)
    assert check.returncode == 0


def test_pod_source_reads_through_exec_chunks(tmp_path):
    folder = tmp_path / "vol"
    folder.mkdir()
    for step in (3, 5):
        payload = bytes(range(256)) * (step * 10)
        put_checkpoint(folder, step, payload, meta={"file": payload_name(step)})
    (folder / "ckpt-step-000000007.pt").write_bytes(b"no sidecar: not a checkpoint")
    source = PodSource(ExecHere(), "j-worker-0", "ns", "pytorch", str(folder))
    said = Recorded()
    assert collect(source, tmp_path / "out", report=said).step == 5
    assert said.warnings == []
    check_collected(tmp_path / "out", 5)


class LyingExec(ExecHere):
    """The exec stand-in, with a file that grows between collect's two reads of it; its
    chunks uneven and some large (it hands back tens of MiB)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(chunks=(7, 65_537))
        self.folder, self.reads, self.sent = folder, 0, 0

    def exec_stream(self, pod, namespace, container, argv):
        if "ddpdeploy-refused" in argv[2] and argv[4].endswith("hang-rank1.txt"):
            self.reads += 1
            if self.reads == 2:
                with open(self.folder / "hang-rank1.txt", "ab") as f:
                    f.write(b"more\n")
        for chunk in super().exec_stream(pod, namespace, container, argv):
            self.sent += len(chunk)
            yield chunk


def test_the_pod_source_brings_the_diagnostics_and_sends_no_more_than_the_bound(tmp_path):
    vol = tmp_path / "vol"
    vol.mkdir()
    files = put_diagnostics(vol)
    with open(vol / "hang-rank2.txt", "wb") as f:
        f.truncate(2 << 30)  # 2 GB: the pod's reader stops at 33 MiB
    (vol / "hang-rank3.txt").symlink_to("/etc/passwd")
    exec_ = LyingExec(vol)
    said = Recorded()
    warnings = said.warnings
    source = PodSource(exec_, "j-master-0", "ns", "pytorch", str(vol))
    got = collect(source, tmp_path / "out", report=said, debug=True)
    assert got.no_checkpoint and got.step is None
    assert sorted(f.name for f in got.debug or []) == [
        "ddpkit-nccl.node-1.4242.log",
        "hang-rank0.txt",
        "hang-rank2.txt",
        "nccl_trace_rank_0",
    ]
    assert got.debug_summary() == "2 hang stacks, 1 flight recorder dump, 1 NCCL debug log"
    text = "\n".join(warnings)
    assert "skipping hang-rank1.txt in pod j-master-0" in text and "changed between" in text
    assert "skipping hang-rank3.txt in pod j-master-0" in text and "a symlink" in text
    assert exec_.sent < 3 * 34 << 20  # the 2 GB file was read three times at most 33 MiB
    out = tmp_path / "out" / "debug"
    assert (out / "nccl_trace_rank_0").read_bytes() == files["nccl_trace_rank_0"]
    assert (out / "hang-rank2.txt").stat().st_size == MAX_DEBUG + len(CUT_NOTE)
    assert not (out / "hang-rank1.txt").exists()


def test_the_pod_reader_without_gnu_dd_bounds_too(tmp_path):
    """The busybox branch of the reader (no `dd iflag=nofollow`) with a bound."""
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(5 << 20)
    program = READ.replace("iflag=nofollow status=none 2>/dev/null", "iflag=no-such-flag 2>&-")
    assert program != READ  # the probe for GNU dd now fails: the other branch runs
    res = subprocess.run(["sh", "-c", program, "sh", str(big), "2"], capture_output=True)
    assert res.returncode == 0 and len(res.stdout) == 2 << 20


# -- against a real kube-apiserver (kube_fixtures.py) -------------------------------------

IMAGE = "registry.invalid/train:v1"


@pytest.mark.kube
@pytest.mark.slow
def test_collect_creates_the_rendered_helper_pod_and_removes_it(
    kube_cli, admin, namespace, tmp_path
):
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")
    up = kube_cli(
        "up", "--image", IMAGE, "--name", "j", "-n", namespace, "-f", str(spec), "--no-wait"
    )
    assert up.returncode == 0, up.stderr
    env = kube_cli.keywords["env"]
    dest = tmp_path / "out"
    args = ["collect", "j", "--from", "cluster", "--to", str(dest), "-n", namespace]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdeploy", *args, "--timeout", "4"],
        cwd=ROOT,
        env={**os.environ, **env},
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = None
    deadline = time.monotonic() + 30
    while seen is None and proc.poll() is None and time.monotonic() < deadline:
        items = res(admin, "v1", "Pod").get(namespace=namespace).to_dict()["items"]
        seen = next((p for p in items if p["metadata"]["name"].startswith("j-collect-")), None)
        time.sleep(0.2)
    _, stderr = proc.communicate(timeout=60)
    assert seen is not None, stderr
    # The helper pod as the apiserver admitted it.
    pod = seen["spec"]
    box = pod["containers"][0]
    assert box["image"] == IMAGE  # the job's own image
    assert box["securityContext"]["runAsNonRoot"] is True
    assert box["securityContext"]["readOnlyRootFilesystem"] is True
    assert box["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert box["resources"]["limits"]["memory"] == "256Mi"
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    # No token volume was injected: the service account admission honours the opt-out.
    assert [v["name"] for v in pod["volumes"]] == ["checkpoints"]
    assert proc.returncode == 1 and f"helper pod {seen['metadata']['name']} " in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert res(admin, "v1", "Pod").get(namespace=namespace).to_dict()["items"] == []
    assert not dest.exists()


def _pod(name: str, phase: str, state: dict, deleting: bool = False) -> dict:
    meta: dict = {"name": name, "namespace": "default", "labels": {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "status": {"phase": phase, "containerStatuses": [{"name": "pytorch", "state": state}]},
    }


def _job_of(kube: FakeKube, spec: JobSpec) -> dict:
    """The job object of ``spec`` on the fake cluster, as `up` makes it."""
    layout = layout_of(spec.target)
    meta = {"name": spec.name, "namespace": spec.namespace, "labels": ours(spec.name)}
    return kube.add({"apiVersion": layout.api_version, "kind": layout.kind, "metadata": meta})


def _made_by(job: dict, pod: dict, target: str = "pytorchjob") -> dict:
    """``pod`` as the operator makes it for ``job``: the job's labels and its controller."""
    layout = layout_of(target)
    name = job["metadata"]["name"]
    pod["metadata"]["namespace"] = job["metadata"]["namespace"]
    pod["metadata"]["labels"] = {**layout.pod_selector(name), **ours(name)}
    owner = {k: job[k] for k in ("apiVersion", "kind")}
    owner |= {"name": name, "uid": job["metadata"]["uid"], "controller": True}
    pod["metadata"]["ownerReferences"] = [owner]
    return pod


def test_a_running_pod_between_two_container_restarts_is_not_read_through():
    spec = JobSpec.model_validate({"name": "j", "image": "t:1", "checkpoint": {"size": "1Gi"}})
    kube = FakeKube()
    job = _job_of(kube, spec)
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    running = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    for pod in (
        _pod("j-worker-0", "Running", waiting),  # its container between two restarts
        _pod("j-worker-1", "Running", running, deleting=True),  # about to lose it
    ):
        kube.add(_made_by(job, pod))
    assert _running_pod(kube, spec) is None  # a helper pod, then
    kube.add(_made_by(job, _pod("j-worker-2", "Running", running)))
    assert _running_pod(kube, spec) == "j-worker-2"


def test_a_look_alike_pod_is_never_read_through():
    # From the cluster2 pass: the pod to exec into was the lowest name the label selector
    # matched, so a pod made by hand with the job's labels (j-aaa sorts first) was read.
    spec = JobSpec.model_validate({"name": "j", "image": "t:1", "checkpoint": {"size": "1Gi"}})
    kube = FakeKube()
    job = _job_of(kube, spec)
    running = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    by_hand = _made_by(job, _pod("j-aaa", "Running", running))
    del by_hand["metadata"]["ownerReferences"]
    theirs = _made_by(job, _pod("j-aab", "Running", running))
    theirs["metadata"]["ownerReferences"][0]["uid"] = "another-jobs"
    for pod in (by_hand, theirs):
        kube.add(pod)
    assert _running_pod(kube, spec) is None
    kube.add(_made_by(job, _pod("j-worker-0", "Running", running)))
    assert _running_pod(kube, spec) == "j-worker-0"
    kube.objects.pop(("PyTorchJob", "default", "j"))  # after `down`: no job, no job pod
    assert _running_pod(kube, spec) is None


def test_a_job_pods_container_gone_before_the_first_read_leaves_it_to_the_helper():
    """The hang watchdog ends the run as collect begins: exec into the ending container
    fails (exit 126, or 137 mid-read), --to is left as it was, and the command retries through
    the helper pod (ContainerGone); the helper pod's own failure stays an error."""
    from ddpdeploy.collect.pod import ContainerGone
    from ddpdeploy.errors import OperationError

    def gone() -> None:
        raise OperationError("running sh in pod j-worker-0: exit code 126: ")

    kube = FakeKube()
    kube.hooks[("exec", "Pod")] = gone
    with pytest.raises(ContainerGone):
        PodSource(kube, "j-worker-0", "default", "pytorch", "/ck", job_pod=True).entries()
    kube.hooks[("exec", "Pod")] = gone
    with pytest.raises(OperationError) as err:
        PodSource(kube, "j-collect", "default", "reader", "/ck").entries()
    assert not isinstance(err.value, ContainerGone)


# -- the helper pod's life: its name, a container that cannot start, an interrupt ---------


class Kubelike(FakeKube):
    """FakeKube whose created pods take ``status`` at once; a deleted pod's name can stay
    taken (``terminating``), as the API server keeps a pod Terminating for its grace period.
    The stand-in: a real kubelet starts or fails a container when it will, not on cue."""

    def __init__(self, status: dict) -> None:
        super().__init__()
        self.status, self.terminating = status, False

    def create(self, obj, dry_run=False):
        created = super().create(obj, dry_run)
        self.objects[("Pod", obj["metadata"]["namespace"], obj["metadata"]["name"])]["status"] = (
            self.status
        )
        return created

    def delete(self, api_version, kind, name, namespace):
        gone = super().delete(api_version, kind, name, namespace)
        if self.terminating and gone:  # still there, being deleted: its name is taken
            self.add({"kind": kind, "metadata": {"name": name, "namespace": namespace}})
        return gone


RUNNING = {"phase": "Running", "containerStatuses": [{"name": "reader", "state": {"running": {}}}]}
CKPT_JOB = {"name": "j", "namespace": "ns", "image": "t:1", "checkpoint": {"size": "1Gi"}}


def _helpers(kube: FakeKube) -> list[str]:
    return [n for k, n in kube.kinds() if k == "Pod"]


# Found by the third hostile pass: the helper pod had a fixed name (JOB-collect), so a second
# collect while the first one's helper was still Terminating (2-30 s), or two at once, failed
# with `conflict: object is being deleted`.
def test_two_collects_at_once_or_one_after_another_get_their_own_helper_pods():
    from ddpdeploy.collect.pod import pod_source

    spec = JobSpec.model_validate(CKPT_JOB)
    kube = Kubelike(RUNNING)
    kube.terminating = True
    with pod_source(kube, spec, 5) as first, pod_source(kube, spec, 5) as second:
        assert first.pod != second.pod  # two at once
    with pod_source(kube, spec, 5) as third:  # both earlier ones still Terminating
        assert third.pod not in (first.pod, second.pod)
    for name in (first.pod, second.pod, third.pod):
        assert name.startswith("j-collect-")
        assert ("delete", "Pod", name) in kube.calls


def test_the_helper_name_is_a_dns_label_for_the_longest_job_name():
    import re

    from ddpdeploy.spec import OWN_DOMAIN

    # The longest name the spec takes (54), one cut just after a hyphen.
    specs = [
        JobSpec.model_validate({**CKPT_JOB, "name": n}) for n in ("a" * 54, "a" * 48 + "-b" * 3)
    ]
    pods = [collect_helper_pod(spec) for spec in specs for _ in range(10)]
    names = {p["metadata"]["name"] for p in pods}
    assert len(names) == 20
    for name in names:
        assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
    # Found again by its labels (the job's, and the collect role), whatever its name.
    labels = pods[0]["metadata"]["labels"]
    assert labels[f"{OWN_DOMAIN}/role"] == "collect"
    assert labels["app.kubernetes.io/instance"] == specs[0].name


# Found by the third hostile pass: an unpullable or invalid image kept collect waiting the
# whole --timeout (300 s), then blamed the ReadWriteOnce volume.
@pytest.mark.parametrize(
    ("state", "said"),
    [
        (
            {"waiting": {"reason": "ErrImagePull", "message": "pull access denied\nfor x"}},
            "cannot start its container: ErrImagePull: pull access denied for x (image t:1;",
        ),
        ({"waiting": {"reason": "ImagePullBackOff"}}, "container: ImagePullBackOff (image"),
        ({"waiting": {"reason": "InvalidImageName", "message": "bad"}}, "InvalidImageName: bad"),
        (
            {"terminated": {"reason": "StartError", "message": "exec: sleep: not found"}},
            "container: it ended (StartError: exec: sleep: not found)",
        ),
    ],
)
def test_a_container_that_cannot_start_is_said_at_once_and_the_helper_deleted(state, said):
    from ddpdeploy.collect.pod import pod_source
    from ddpdeploy.errors import OperationError

    spec = JobSpec.model_validate(CKPT_JOB)
    status = {"phase": "Pending", "containerStatuses": [{"name": "reader", "state": state}]}
    kube = Kubelike(status)
    began = time.monotonic()
    with pytest.raises(OperationError) as err, pod_source(kube, spec, 30):
        pass
    assert time.monotonic() - began < 5  # not the whole --timeout
    line = str(err.value)
    assert said in line and line.endswith("it has been deleted"), line
    assert "ReadWriteOnce" not in line and "\n" not in line
    assert _helpers(kube) == []


# Found by the third hostile pass: Ctrl-C or SIGTERM while the helper pod started said
# `aborted (SIGINT); nothing more was done`, though a helper pod had been made and deleted.
@pytest.mark.parametrize(("signum", "code"), [(2, 130), (15, 143)])
def test_an_interrupt_while_the_helper_starts_says_it_was_deleted(signum, code):
    from ddpdeploy.collect.pod import pod_source
    from ddpdeploy.errors import OperationError
    from ddpdeploy.signals import Interrupted

    spec = JobSpec.model_validate(CKPT_JOB)
    kube = Kubelike({"phase": "Pending"})

    def interrupt() -> None:
        raise Interrupted(signum)

    kube.hooks[("get", "Pod")] = interrupt  # as the wait polls the helper pod
    with pytest.raises(BaseException) as err, pod_source(kube, spec, 30):
        pass
    assert isinstance(err.value, OperationError), err.value  # not the bare interrupt
    (name,) = [n for verb, kind, n in kube.calls if verb == "create"]
    name_ = "SIGINT" if signum == 2 else "SIGTERM"
    assert str(err.value) == (
        f"interrupted ({name_}): the helper pod {name} was deleted; --to is as it was"
    )
    assert err.value.exit_code == code
    assert _helpers(kube) == []
    # Before the create reached the API server: nothing was made, and that is what is said.
    kube = Kubelike({"phase": "Pending"})
    kube.hooks[("create", "Pod")] = interrupt
    with pytest.raises(BaseException) as err, pod_source(kube, spec, 30):
        pass
    assert isinstance(err.value, OperationError), err.value  # not the bare interrupt
    assert str(err.value) == f"interrupted ({name_}): no helper pod was created; --to is as it was"


class Retried(Kubelike):
    """A helper whose container the kubelet fails to create ``fails`` times (each poll
    one), then starts (``fails`` None: never)."""

    def __init__(self, waiting: dict, fails: int | None) -> None:
        super().__init__(
            {"phase": "Pending", "containerStatuses": [{"name": "reader", "state": waiting}]}
        )
        self.fails = fails

    def get(self, api_version, kind, name, namespace=None):
        got = super().get(api_version, kind, name, namespace)
        if got is not None and self.fails is not None:
            if self.fails <= 0:
                got["status"] = RUNNING
            self.fails -= 1
        return got


# Found by the fourth hostile pass: a helper in CreateContainerError (or
# CreateContainerConfigError: a ConfigMap or Secret not there yet) ended the wait at once,
# though the kubelet retries it and the container may well start.
@pytest.mark.parametrize("reason", ["CreateContainerError", "CreateContainerConfigError"])
def test_a_container_the_kubelet_retries_is_waited_for_and_said_once(reason):
    from ddpdeploy.collect.pod import pod_source

    spec = JobSpec.model_validate(CKPT_JOB)
    waiting = {"waiting": {"reason": reason, "message": 'configmap \x1b[31m"c" not found'}}
    kube = Retried(waiting, fails=2)
    notes: list[str] = []
    with pod_source(kube, spec, 30, note=notes.append) as src:
        assert src.pod.startswith("j-collect-")
    assert notes == [
        f"the helper pod {src.pod} cannot create its container yet ({reason}: configmap "
        '\ufffd"c" not found); the kubelet retries it: waiting up to --timeout 30s'
    ]
    assert _helpers(kube) == []


def test_a_container_never_created_ends_the_wait_at_its_timeout_with_the_reason():
    from ddpdeploy.collect.pod import pod_source
    from ddpdeploy.errors import OperationError

    spec = JobSpec.model_validate(CKPT_JOB)
    waiting = {"waiting": {"reason": "CreateContainerError", "message": "name in use"}}
    kube = Retried(waiting, fails=None)
    began = time.monotonic()
    with pytest.raises(OperationError) as err, pod_source(kube, spec, 2.5):
        pass
    assert time.monotonic() - began >= 2.5
    line = str(err.value)
    assert line.endswith(
        "is Pending after 2.5s: CreateContainerError: name in use; it has been deleted"
    ), line
    assert _helpers(kube) == []


# Found by the fourth hostile pass: a helper pod the scheduler cannot place (too little CPU
# left, a quota) ended its --timeout blaming a ReadWriteOnce volume.
def test_an_unschedulable_helper_times_out_with_the_schedulers_reason():
    from ddpdeploy.collect.pod import pod_source
    from ddpdeploy.errors import OperationError

    spec = JobSpec.model_validate(CKPT_JOB)
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 Insufficient cpu."}  # fmt: skip
    kube = Kubelike({"phase": "Pending", "conditions": [cond]})
    with pytest.raises(OperationError) as err, pod_source(kube, spec, 1):
        pass
    assert str(err.value).endswith(
        "is Pending after 1s: Unschedulable: 0/1 nodes are available: 1 Insufficient cpu; "
        "it has been deleted"
    ), err.value


class Placed(Kubelike):
    """A helper the scheduler put on ``node`` whose container never starts and says nothing
    (a volume mount or an image pull still going). The stand-in: a real kubelet cannot be
    held at that point on cue."""

    def __init__(self, node: str | None) -> None:
        super().__init__({"phase": "Pending"})
        self.node = node

    def create(self, obj, dry_run=False):
        created = super().create(obj, dry_run)
        if self.node:
            key = ("Pod", obj["metadata"]["namespace"], obj["metadata"]["name"])
            self.objects[key]["spec"]["nodeName"] = self.node
        return created


# Left by the fifth hostile pass: a --timeout too short for the helper to start ended with
# "a ReadWriteOnce volume attaches to one node at a time: are the job's pods gone?", a guess
# with nothing behind it; the job's pod on another node is named only when there is one.
@pytest.mark.parametrize(
    ("node", "job_pod_on", "said"),
    [
        (None, None, "no node was chosen for it yet; give it longer with --timeout"),
        ("n1", None, "placed on n1, its container had not started (pulling its image or "
         "mounting the volume); give it longer with --timeout"),
        ("n1", "n1", "placed on n1, its container had not started (pulling its image"),
        ("n1", "n2", "placed on n1, its container had not started; the job's pods "
         "j-worker-0 (on n2) run on another node and its ReadWriteOnce volume attaches to one "
         "node at a time (`ddpdeploy down` removes the job's pods and keeps the claim)"),
    ],
)  # fmt: skip
def test_a_helper_not_started_by_its_timeout_is_told_as_far_as_known(node, job_pod_on, said):
    from ddpdeploy.cluster.labels import ours
    from ddpdeploy.collect.pod import pod_source
    from ddpdeploy.errors import OperationError

    spec = JobSpec.model_validate(CKPT_JOB)
    kube = Placed(node)
    claim = {"kind": "PersistentVolumeClaim", "metadata": {"name": "j-checkpoints",
             "namespace": "ns"}, "spec": {"accessModes": ["ReadWriteOnce"]}}  # fmt: skip
    kube.add(claim)  # adopted, or made with accessMode ReadWriteOnce
    if job_pod_on:
        labels = layout_of(spec.target).pod_selector("j") | ours("j")
        kube.add({"kind": "Pod", "metadata": {"name": "j-worker-0", "namespace": "ns",
                  "labels": labels}, "spec": {"nodeName": job_pod_on},
                  "status": {"phase": "Pending"}})  # fmt: skip
    with pytest.raises(OperationError) as err, pod_source(kube, spec, 1, job_pods=False):
        pass
    line = str(err.value)
    assert f"is Pending after 1s: {said}" in line and line.endswith("; it has been deleted")
    assert ("ReadWriteOnce" in line) == (job_pod_on == "n2"), line


# Found by the fourth hostile pass (a leftover of the third): Ctrl-C while collect read
# through the job's own running pod said `aborted (SIGINT); nothing more was done`, unlike
# the helper pod's line, and did not say that --to was as it was.
@pytest.mark.parametrize(("signum", "name"), [(2, "SIGINT"), (15, "SIGTERM")])
def test_an_interrupt_while_reading_the_jobs_pod_says_what_was_done(signum, name):
    from ddpdeploy.collect.pod import pod_source
    from ddpdeploy.errors import OperationError
    from ddpdeploy.signals import Interrupted

    spec = JobSpec.model_validate(CKPT_JOB)
    kube = FakeKube()
    kube.add(_made_by(_job_of(kube, spec), _pod("j-worker-0", "Running", {"running": {}})))
    with pytest.raises(OperationError) as err, pod_source(kube, spec, 5) as src:
        assert src.pod == "j-worker-0"
        raise Interrupted(signum)
    assert str(err.value) == (
        f"interrupted ({name}): it was reading the job's pod j-worker-0, nothing was made; "
        "--to is as it was"
    )
    assert err.value.exit_code == 128 + signum
    assert [c for c in kube.calls if c[0] in ("create", "delete")] == []
