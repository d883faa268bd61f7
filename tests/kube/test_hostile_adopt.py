"""`up --adopt-pvc`, then `down`, then `resume` (issue 24 §6), against the real
kube-apiserver: the adopted claim is never relabelled or deleted, and carries the job's
saved spec as annotations of ours (an apply that holds only those), so that `resume` after
`down` finds it; `down --purge` keeps the claim and takes our annotations off it."""

from __future__ import annotations

from pathlib import Path

import pytest
from actors import get_job, pod_spec, res

IMAGE = "registry.invalid/train:v1"
SPEC = "ddpdeploy.dev/spec"
PVC = ("v1", "PersistentVolumeClaim")

pytestmark = pytest.mark.slow  # an apiserver, CLI subprocesses


def claim(admin, namespace: str) -> dict | None:
    items = res(admin, *PVC).get(namespace=namespace).to_dict()["items"]
    return next((c for c in items if c["metadata"]["name"] == "j-checkpoints"), None)


def test_resume_after_down_with_an_adopted_claim(kube_cli, admin, namespace, tmp_path: Path):
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")
    mine = {
        "metadata": {"name": "j-checkpoints", "labels": {"owner": "me"},
                     "annotations": {"example.com/note": "mine"}},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    uid = res(admin, *PVC).create(namespace=namespace, body=mine).to_dict()["metadata"]["uid"]
    args = ["--image", IMAGE, "--name", "j", "-n", namespace, "-f", str(spec), "--no-wait"]
    up = kube_cli("up", *args, "--adopt-pvc")
    assert up.returncode == 0, up.stderr
    assert f"saved the spec on PersistentVolumeClaim {namespace}/j-checkpoints" in up.stderr
    got = claim(admin, namespace)
    assert got["metadata"]["uid"] == uid and got["metadata"]["labels"] == {"owner": "me"}
    notes = got["metadata"]["annotations"]
    assert notes["example.com/note"] == "mine" and '"claimName": "j-checkpoints"' in notes[SPEC]
    first = get_job(admin, namespace, "j")["metadata"]["uid"]

    down = kube_cli("down", "j", "-n", namespace)
    assert down.returncode == 0, down.stderr
    assert f"kept PersistentVolumeClaim {namespace}/j-checkpoints (adopted: never deleted" in (
        down.stderr
    )
    assert get_job(admin, namespace, "j") is None and claim(admin, namespace) is not None

    resumed = kube_cli("resume", "j", "-n", namespace)
    assert resumed.returncode == 0, resumed.stderr
    assert "was missing and is new" not in resumed.stderr
    job = get_job(admin, namespace, "j")
    assert job is not None and job["metadata"]["uid"] != first
    volumes = pod_spec(job)["volumes"]
    assert {"claimName": "j-checkpoints"} in [v.get("persistentVolumeClaim") for v in volumes]

    purged = kube_cli("down", "j", "-n", namespace, "--purge")
    assert purged.returncode == 0, purged.stderr
    assert "removed ddpdeploy's saved spec" in purged.stderr
    got = claim(admin, namespace)
    assert got["metadata"]["uid"] == uid and got["metadata"]["labels"] == {"owner": "me"}
    assert got["metadata"]["annotations"] == {"example.com/note": "mine"}
    again = kube_cli("resume", "j", "-n", namespace)
    assert again.returncode == 1 and "no saved spec for j" in again.stderr


def test_a_forged_spec_on_the_adopted_claim_is_refused(kube_cli, admin, namespace, tmp_path):
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")
    body = {
        "metadata": {"name": "j-checkpoints"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    res(admin, *PVC).create(namespace=namespace, body=body)
    args = ["--image", IMAGE, "--name", "j", "-n", namespace, "-f", str(spec), "--no-wait"]
    assert kube_cli("up", *args, "--adopt-pvc").returncode == 0
    assert kube_cli("down", "j", "-n", namespace).returncode == 0
    text = claim(admin, namespace)["metadata"]["annotations"][SPEC]
    forged = text.replace(f'"namespace": "{namespace}"', '"namespace": "elsewhere"')
    body = {"metadata": {"annotations": {SPEC: forged}}}
    merge = "application/merge-patch+json"
    res(admin, *PVC).patch(name="j-checkpoints", namespace=namespace, body=body, content_type=merge)
    out = kube_cli("resume", "j", "-n", namespace)
    assert out.returncode == 1 and get_job(admin, namespace, "j") is None
    (line,) = out.stderr.strip().splitlines()
    assert "saved spec" in line and "refusing it" in line
