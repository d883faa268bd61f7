"""`collect --from cluster`: the helper pod (built by the pod renderer, hardened like the
job's pods) and the pod source's `sh` programs, run here on real folders."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from reports import Recorded

from ddpdeploy.collect.checkpoint import collect, payload_name, sidecar_name
from ddpdeploy.collect.plain import SUMS
from ddpdeploy.collect.pod import PodSource, collect_helper_pod
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.spec import JobSpec

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
    from checkov_scan import allowlist, checkov_path  # skips without checkov

    from ddpdeploy.targets import render_objects

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


class ExecHere:
    """Stands in for the exec API (which needs a kubelet): runs the pod source's argv (`sh -c
    PROGRAM sh ARG`) here, hands stdout back in small uneven chunks as a websocket does, and
    fails on a non-zero exit as Kube.exec_stream does."""

    def __init__(self, before_read=None) -> None:
        self.before_read = before_read

    def exec_stream(self, pod, namespace, container, argv):
        if self.before_read and "ddpdeploy-refused" in argv[2]:
            self.before_read(argv[-1])
        res = subprocess.run(argv, capture_output=True)
        for i in range(0, len(res.stdout), 7):
            yield res.stdout[i : i + 7]
        if res.returncode:
            tail = res.stderr.decode(errors="replace").strip()[-300:]
            raise OperationError(f"running sh in pod {pod}: exit code {res.returncode}: {tail}")


def put(folder: Path, step: int, payload: bytes) -> None:
    (folder / payload_name(step)).write_bytes(payload)
    meta = {"step": step, "sha256": hashlib.sha256(payload).hexdigest()}
    (folder / sidecar_name(step)).write_text(json.dumps(meta))


def test_the_pod_source_refuses_symlinks_and_falls_back_past_a_vanished_payload(tmp_path):
    vol = tmp_path / "vol"
    vol.mkdir()
    put(vol, 1, os.urandom(70_000))
    put(vol, 2, b"two")
    put(vol, 3, b"three")
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
