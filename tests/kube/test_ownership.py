"""The cluster verbs change or delete only what ddpdeploy made for the job: foreign jobs,
companions and PVCs of the same name are refused in one line naming the object and its
owner, and a saved spec that does not name its own object is refused too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from actors import get_job, pod_spec, res, set_job_conditions

pytestmark = pytest.mark.slow

IMAGE = "registry.invalid/train:v1"
SPEC = "ddpdeploy.dev/spec"
MANAGED = "app.kubernetes.io/managed-by"


def rendered(ns: str, name: str, *flags: str) -> list[dict]:
    """What `up` would submit (our renderer, our saved spec), as dicts."""
    from ddpdeploy.cluster.saved import with_saved_spec
    from ddpdeploy.commands.options import spec_from_flags as load_spec
    from ddpdeploy.targets import render_objects

    pairs = {k: int(v) if v.isdigit() else v for k, v in zip(flags[::2], flags[1::2], strict=True)}
    spec = load_spec(None, {"--image": IMAGE, "--name": name, "--namespace": ns, **pairs})
    return with_saved_spec(render_objects(spec), spec)


def foreign(obj: dict, labels: dict[str, str] | None = None) -> dict:
    """``obj`` as someone else would make it: their labels (none by default)."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "labels"}
    if labels:
        meta["labels"] = labels
    return {**obj, "metadata": meta}


def create(admin, obj: dict) -> dict:
    meta = obj["metadata"]
    api = res(admin, obj["apiVersion"], obj["kind"])
    return api.create(namespace=meta["namespace"], body=obj).to_dict()


def get(admin, api: str, kind: str, ns: str, name: str) -> dict | None:
    items = res(admin, api, kind).get(namespace=ns).to_dict()["items"]
    return next((i for i in items if i["metadata"]["name"] == name), None)


def live_pvcs(admin, ns: str) -> list[str]:
    items = res(admin, "v1", "PersistentVolumeClaim").get(namespace=ns).to_dict()["items"]
    return [p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")]


def one_error_line(out) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture
def ckpt_spec(tmp_path: Path) -> Path:
    path = tmp_path / "ddpdeploy.yaml"
    path.write_text("checkpoint: {size: 1Gi}\n")
    return path


def up(kube_cli, ns: str, name: str, *more: str):
    return kube_cli("up", "--image", IMAGE, "--name", name, "-n", ns, "--no-wait", *more)


NP = ("networking.k8s.io/v1", "NetworkPolicy")
PTJ = ("kubeflow.org/v1", "PyTorchJob")


def test_down_refuses_foreign_jobs_and_companions(kube_cli, admin, namespace):
    # A PyTorchJob made by `kubectl apply`, without our labels.
    job = create(admin, foreign(rendered(namespace, "theirs")[-1]))
    out = kube_cli("down", "theirs", "-n", namespace)
    assert out.returncode == 1
    line = one_error_line(out)
    assert f"PyTorchJob {namespace}/theirs" in line and "no ddpdeploy labels" in line
    assert get_job(admin, namespace, "theirs")["metadata"]["uid"] == job["metadata"]["uid"]
    # A batch Job another tool labelled as its own.
    batch = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "helmjob", "namespace": namespace, "labels": {MANAGED: "Helm"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "c", "image": IMAGE}]}}},
    }  # fmt: skip
    create(admin, batch)
    out = kube_cli("down", "helmjob", "-n", namespace)
    assert out.returncode == 1
    assert f"{MANAGED}=Helm" in one_error_line(out)
    assert get(admin, "batch/v1", "Job", namespace, "helmjob") is not None
    # Our job whose NetworkPolicy was swapped for someone else's: the job goes, their
    # NetworkPolicy stays (test_down_keeps_a_foreign_network_policy_and_deletes_our_job).
    assert up(kube_cli, namespace, "j").returncode == 0
    res(admin, *NP).delete(name="j", namespace=namespace)
    theirs_np = create(admin, foreign(rendered(namespace, "j")[0], {"owner": "me"}))
    out = kube_cli("down", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert f"kept NetworkPolicy {namespace}/j: not ours (owner: no ddpdeploy labels)" in out.stderr
    assert get_job(admin, namespace, "j") is None
    assert get(admin, *NP, namespace, "j")["metadata"]["uid"] == theirs_np["metadata"]["uid"]


def test_down_keeps_a_foreign_network_policy_and_deletes_our_job(kube_cli, admin, namespace):
    # Found by the third hostile pass: a NetworkPolicy of the job's name that someone else
    # made (ours was never made: --no-network-policy) made `down` refuse to delete our own
    # job, which kept running.
    theirs_np = create(admin, foreign(rendered(namespace, "j2")[0]))
    made = up(kube_cli, namespace, "j2", "--no-network-policy")
    assert made.returncode == 0, made.stderr
    out = kube_cli("down", "j2", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        f"deleted PyTorchJob {namespace}/j2",
        f"kept NetworkPolicy {namespace}/j2: not ours (owner: no ddpdeploy labels)",
    ]
    assert get_job(admin, namespace, "j2") is None
    assert get(admin, *NP, namespace, "j2")["metadata"]["uid"] == theirs_np["metadata"]["uid"]
    # A job that is not ours is still refused, its NetworkPolicy and all.
    create(admin, foreign(rendered(namespace, "j3")[-1]))
    out = kube_cli("down", "j3", "-n", namespace)
    assert out.returncode == 1
    assert "PyTorchJob" in one_error_line(out) and "not deleted" in one_error_line(out)
    assert get_job(admin, namespace, "j3") is not None


def test_scale_refuses_a_foreign_job_and_a_foreign_companion(kube_cli, admin, namespace):
    flags = ("--nodes", "2", "--elastic", "1:3")
    # Someone copied our rendering, saved spec included, but it is theirs.
    objs = rendered(namespace, "theirs", *flags)
    create(admin, foreign(objs[-1], {MANAGED: "someone"}))
    workers = objs[-1]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    assert workers != 3
    out = kube_cli("scale", "theirs", "--nodes", "3", "-n", namespace)
    assert out.returncode == 1
    assert f"{MANAGED}=someone" in one_error_line(out)
    job = get_job(admin, namespace, "theirs")
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == workers
    assert get(admin, *NP, namespace, "theirs") is None  # nothing applied beside it
    # Our elastic job beside a foreign NetworkPolicy of its name.
    assert up(kube_cli, namespace, "e", *flags).returncode == 0
    res(admin, *NP).delete(name="e", namespace=namespace)
    create(admin, foreign(rendered(namespace, "e", *flags)[0]))
    out = kube_cli("scale", "e", "--nodes", "3", "-n", namespace)
    assert out.returncode == 1
    assert f"NetworkPolicy {namespace}/e" in one_error_line(out)
    assert get(admin, *NP, namespace, "e")["metadata"].get("labels") is None  # not relabelled
    job = get_job(admin, namespace, "e")
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == workers


def test_resume_and_replace_refuse_a_foreign_job(kube_cli, admin, namespace):
    job = create(admin, foreign(rendered(namespace, "theirs")[-1]))
    set_job_conditions(admin, namespace, "theirs", ("Created", ""), ("Failed", "boom"))
    out = kube_cli("resume", "theirs", "-n", namespace)
    assert out.returncode == 1
    assert "no ddpdeploy labels" in one_error_line(out)
    again = up(kube_cli, namespace, "theirs", "--replace")
    assert again.returncode == 1
    assert "no ddpdeploy labels" in again.stderr.strip().splitlines()[-1]
    assert get_job(admin, namespace, "theirs")["metadata"]["uid"] == job["metadata"]["uid"]
    assert get(admin, *NP, namespace, "theirs") is None
    # A new job beside a foreign NetworkPolicy of its name: refused, nothing created.
    create(admin, foreign(rendered(namespace, "k")[0], {MANAGED: "kustomize"}))
    out = up(kube_cli, namespace, "k")
    assert out.returncode == 1
    assert f"NetworkPolicy {namespace}/k" in out.stderr and f"{MANAGED}=kustomize" in out.stderr
    assert get_job(admin, namespace, "k") is None
    assert get(admin, *NP, namespace, "k")["metadata"]["labels"] == {MANAGED: "kustomize"}


def test_a_hand_made_pvc_is_used_only_when_adopted_and_never_purged(
    kube_cli, admin, namespace, ckpt_spec
):
    mine = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "j-checkpoints", "namespace": namespace, "labels": {"owner": "me"}},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    pvc = create(admin, mine)
    out = up(kube_cli, namespace, "j", "-f", str(ckpt_spec))
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert "PersistentVolumeClaim" in last and "--adopt-pvc" in last and "no ddpdeploy" in last
    assert get_job(admin, namespace, "j") is None
    adopted = up(kube_cli, namespace, "j", "-f", str(ckpt_spec), "--adopt-pvc")
    assert adopted.returncode == 0, adopted.stderr
    assert "--adopt-pvc" in adopted.stderr and "as is" in adopted.stderr
    claim = get(admin, "v1", "PersistentVolumeClaim", namespace, "j-checkpoints")
    assert claim["metadata"]["labels"] == {"owner": "me"}  # not relabelled
    # Only the saved spec goes on it, as annotations of ours (test_hostile_adopt.py).
    assert SPEC in (claim["metadata"].get("annotations") or {})
    volumes = pod_spec(get_job(admin, namespace, "j"))["volumes"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "j-checkpoints"}} in [
        {k: v for k, v in vol.items() if v is not None} for vol in volumes
    ]
    out = kube_cli("down", "j", "-n", namespace, "--purge")
    assert out.returncode == 0, out.stderr
    assert get_job(admin, namespace, "j") is None
    assert live_pvcs(admin, namespace) == ["j-checkpoints"]
    claim = get(admin, "v1", "PersistentVolumeClaim", namespace, "j-checkpoints")
    assert claim["metadata"]["uid"] == pvc["metadata"]["uid"]


def _tamper(admin, kind_api: tuple[str, str], ns: str, name: str, edit) -> None:
    obj = get(admin, *kind_api, ns, name)
    text = obj["metadata"]["annotations"][SPEC]
    body = {"metadata": {"annotations": {SPEC: edit(text)}}}
    res(admin, *kind_api).patch(
        body=body, name=name, namespace=ns, content_type="application/merge-patch+json"
    )


def _elsewhere(text: str) -> str:
    doc = json.loads(text)
    doc.update(namespace="kube-system", image="evil.invalid/miner:latest")
    return json.dumps(doc)


def _other_image(text: str) -> str:
    return json.dumps({**json.loads(text), "image": "evil.invalid/miner:latest"})


def test_resume_refuses_a_tampered_saved_spec(kube_cli, admin, namespace, ckpt_spec):
    assert up(kube_cli, namespace, "rs1", "-f", str(ckpt_spec)).returncode == 0
    assert kube_cli("down", "rs1", "-n", namespace).returncode == 0
    pvc = ("v1", "PersistentVolumeClaim")
    claim = get(admin, *pvc, namespace, "rs1-checkpoints")
    saved = claim["metadata"]["annotations"][SPEC]
    _tamper(admin, pvc, namespace, "rs1-checkpoints", _elsewhere)
    out = kube_cli("resume", "rs1", "-n", namespace)
    assert out.returncode == 1
    line = one_error_line(out)
    assert "saved spec" in line and "kube-system/rs1" in line
    assert get_job(admin, namespace, "rs1") is None
    assert get_job(admin, "kube-system", "rs1") is None
    _tamper(admin, pvc, namespace, "rs1-checkpoints", lambda _: "[" * 50_000 + "]" * 50_000)
    out = kube_cli("resume", "rs1", "-n", namespace)
    assert out.returncode == 1
    assert "nested deeper than" in one_error_line(out)
    # An edit that keeps the names is the editor's to make, but is shown before the job
    # runs (found by the fourth hostile pass: resume ran an edited image without a word).
    _tamper(admin, pvc, namespace, "rs1-checkpoints", lambda _: saved)
    _tamper(admin, pvc, namespace, "rs1-checkpoints", _other_image)
    out = kube_cli("resume", "rs1", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[0] == (
        f"resubmitting from the spec saved on PersistentVolumeClaim {namespace}/rs1-checkpoints:"
        " image evil.invalid/miner:latest, 1 node(s) x 1 process(es)"
    )
    assert pod_spec(get_job(admin, namespace, "rs1"))["containers"][0]["image"] == (
        "evil.invalid/miner:latest"
    )
    # On the job itself (failed, so resume would recreate it).
    assert up(kube_cli, namespace, "rs2").returncode == 0
    set_job_conditions(admin, namespace, "rs2", ("Created", ""), ("Failed", "boom"))
    _tamper(admin, PTJ, namespace, "rs2", _elsewhere)
    first = get_job(admin, namespace, "rs2")
    out = kube_cli("resume", "rs2", "-n", namespace)
    assert out.returncode == 1
    assert "kube-system/rs2" in one_error_line(out)
    assert get_job(admin, namespace, "rs2")["metadata"]["uid"] == first["metadata"]["uid"]
    assert get_job(admin, "kube-system", "rs2") is None


def test_a_terminating_pvc_is_refused(kube_cli, admin, namespace, ckpt_spec):
    assert up(kube_cli, namespace, "j", "-f", str(ckpt_spec)).returncode == 0
    assert kube_cli("down", "j", "-n", namespace).returncode == 0
    # pvc-protection's finalizer keeps it Terminating (no controller here removes it).
    res(admin, "v1", "PersistentVolumeClaim").delete(name="j-checkpoints", namespace=namespace)
    out = up(kube_cli, namespace, "j", "-f", str(ckpt_spec))
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert f"PersistentVolumeClaim {namespace}/j-checkpoints is being deleted" in last
    assert get_job(admin, namespace, "j") is None
    # A named claim that is Terminating, too.
    data = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    create(admin, data)
    res(admin, "v1", "PersistentVolumeClaim").delete(name="data", namespace=namespace)
    named = ckpt_spec.parent / "named.yaml"
    named.write_text("checkpoint: {claimName: data}\n")
    out = up(kube_cli, namespace, "k", "-f", str(named))
    assert out.returncode == 1
    assert "checkpoint.claimName" in one_error_line(out) and "being deleted" in out.stderr
    assert get_job(admin, namespace, "k") is None


def test_a_terminating_namespace_is_refused(kube_cli, admin, namespace):
    # No namespace controller here: a deleted namespace stays Terminating.
    res(admin, "v1", "Namespace").delete(name=namespace)
    out = up(kube_cli, namespace, "j", "--create-namespace")
    assert out.returncode == 1
    assert f"namespace {namespace} is being deleted (Terminating)" in one_error_line(out)
    assert get_job(admin, namespace, "j") is None


def test_down_keeps_a_look_alike_claim_with_our_labels_and_deletes_ours(
    kube_cli, admin, namespace, ckpt_spec
):
    # Found by the fourth hostile pass: a claim with our labels but no saved spec made
    # `down --purge` refuse everything, and plain `down` called it the job's checkpoints.
    assert up(kube_cli, namespace, "j", "-f", str(ckpt_spec)).returncode == 0
    look_alike = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "precious",
            "namespace": namespace,
            "labels": {MANAGED: "ddpdeploy", "app.kubernetes.io/instance": "j"},
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    theirs = create(admin, look_alike)
    kept = (
        f"kept PersistentVolumeClaim {namespace}/precious: not ours (ddpdeploy did not "
        "create it for job j (no saved spec naming the job))"
    )
    out = kube_cli("down", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert kept in out.stderr.splitlines()
    assert f"kept PersistentVolumeClaim {namespace}/j-checkpoints (checkpoints" in out.stderr
    assert "precious (checkpoints" not in out.stderr
    out = kube_cli("down", "j", "-n", namespace, "--purge")
    assert out.returncode == 0, out.stderr
    assert f"deleted PersistentVolumeClaim {namespace}/j-checkpoints" in out.stderr
    assert kept in out.stderr.splitlines()
    assert live_pvcs(admin, namespace) == ["precious"]
    claim = get(admin, "v1", "PersistentVolumeClaim", namespace, "precious")
    assert claim["metadata"]["uid"] == theirs["metadata"]["uid"]
