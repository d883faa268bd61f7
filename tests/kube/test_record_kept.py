"""`scale` and `resume` keep the run record `up --build` gave the pods (the image digest, the
git commit and dirty flag), read back from the live job's saved record against a real
kube-apiserver; a tampered record loses the malformed field alone, in one warning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from actors import MERGE, get_job, res, set_job_conditions

from ddpdeploy.contract import RunRecord

pytestmark = pytest.mark.slow

# A tag, so that the digest the pods get comes from the record alone (a repo@sha256 image
# names its own digest, record or not).
IMAGE = "registry.invalid/train:v1"
DIGEST = "sha256:" + "ab" * 32
COMMIT = "c0ffee" * 6 + "abcd"
RECORD = RunRecord(image_digest=DIGEST, git_commit=COMMIT, git_dirty=True)
WANT = {
    "DDPDEPLOY_IMAGE_DIGEST": DIGEST,
    "DDPDEPLOY_GIT_COMMIT": COMMIT,
    "DDPDEPLOY_GIT_DIRTY": "1",
}
PREFIX = "record.ddpdeploy.dev/"  # one annotation per fact, named by its env


@pytest.fixture
def up_built(control_plane, namespace, tmp_path: Path, monkeypatch):
    """What `up --build` does once its image is pushed (commands/up.py): plan the spec's
    objects with the build's record and apply them, through the real apiserver."""
    from ddpdeploy.adapters.kube import Kube
    from ddpdeploy.cluster import apply as deploy
    from ddpdeploy.commands.options import spec_from_flags

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    file = tmp_path / "ddpdeploy.yaml"
    file.write_text("checkpoint: {size: 1Gi}\n")

    def run(name: str, **flags: Any) -> None:
        given = {"--image": IMAGE, "--name": name, "--namespace": namespace, **flags}
        spec = spec_from_flags(file, given)
        kube = Kube(str(control_plane.kubeconfig))
        said: list[str] = []
        deploy.apply(
            kube, deploy.prepare(kube, spec, said.append, record=RECORD), False, said.append
        )
        assert not record_warnings(said), said

    return run


def record_warnings(lines: list[str]) -> list[str]:
    """The run record's warnings (the test cluster's lack of a StorageClass gives another)."""
    return [line for line in lines if line.startswith("warning") and "run record" in line]


def warnings(out) -> list[str]:
    return record_warnings(out.stderr.splitlines())


def envs(job: dict) -> list[dict[str, str | None]]:
    """The literal env of each replica's training container."""
    out = []
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        (container,) = [
            c for c in replica["template"]["spec"]["containers"] if c["name"] == "pytorch"
        ]
        out.append({e["name"]: e.get("value") for e in container.get("env") or []})
    assert out, "no training container"
    return out


def records(job: dict) -> list[dict[str, str | None]]:
    """The record each replica's pods get; the same on every replica."""
    found = [record_of(env) for env in envs(job)]
    assert all(r == found[0] for r in found), found
    return found[:1]


def record_of(env: dict[str, str | None]) -> dict[str, str | None]:
    return {k: env.get(k) for k in WANT if k in env}


def spec_sha256_of(job: dict) -> str:
    import hashlib

    return hashlib.sha256(job["metadata"]["annotations"]["ddpdeploy.dev/spec"].encode()).hexdigest()


def saved(obj: dict) -> dict[str, str]:
    annotations = obj["metadata"].get("annotations") or {}
    return {k.removeprefix(PREFIX): v for k, v in annotations.items() if k.startswith(PREFIX)}


def claim(admin, ns: str, name: str) -> dict:
    items = res(admin, "v1", "PersistentVolumeClaim").get(namespace=ns).to_dict()["items"]
    return next(i for i in items if i["metadata"]["name"] == name)


def test_scale_keeps_the_record(kube_cli, admin, namespace, up_built):
    up_built("e", **{"--nodes": 2, "--elastic": "1:3"})
    before = get_job(admin, namespace, "e")
    assert records(before) == [WANT]
    out = kube_cli("scale", "e", "--nodes", "3", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert warnings(out) == [], out.stderr
    job = get_job(admin, namespace, "e")
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    for env in envs(job):
        assert record_of(env) == WANT
        # The scaled spec's own sha256, not the one before the scale.
        assert env["DDPDEPLOY_SPEC_SHA256"] == spec_sha256_of(job) != spec_sha256_of(before)
    # Saved again beside the spec, on the job and its PVC: the next scale or resume has it.
    for obj in (job, claim(admin, namespace, "e-checkpoints")):
        assert saved(obj) == WANT


def test_resume_keeps_the_record_from_the_job_and_from_the_pvc(
    kube_cli, admin, namespace, up_built
):
    up_built("r", **{"--nodes": 2})
    set_job_conditions(admin, namespace, "r", ("Created", ""), ("Failed", "boom"))
    first = get_job(admin, namespace, "r")
    out = kube_cli("resume", "r", "-n", namespace)
    assert out.returncode == 0, out.stderr
    again = get_job(admin, namespace, "r")
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    assert records(again) == [WANT]
    # After `down` only the PVC holds the saved spec and record.
    assert kube_cli("down", "r", "-n", namespace).returncode == 0
    assert get_job(admin, namespace, "r") is None
    out = kube_cli("resume", "r", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert warnings(out) == [], out.stderr
    assert records(get_job(admin, namespace, "r")) == [WANT]


def test_resume_keeps_the_record_of_a_trainjob(kube_cli, admin, namespace, up_built):
    """The saved record reads the same on every target (a TrainJob's env is spec.trainer's)."""
    up_built("tj", **{"--nodes": 2, "--target": "trainjob"})
    trainjobs = res(admin, "trainer.kubeflow.org/v1alpha1", "TrainJob")

    def trainer_record() -> dict[str, str | None]:
        job = trainjobs.get(name="tj", namespace=namespace).to_dict()
        return record_of({e["name"]: e.get("value") for e in job["spec"]["trainer"]["env"]})

    assert trainer_record() == WANT
    assert kube_cli("down", "tj", "-n", namespace).returncode == 0
    out = kube_cli("resume", "tj", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert warnings(out) == [], out.stderr
    assert trainer_record() == WANT


def _tamper(admin, kind: tuple[str, str], ns: str, name: str, fact: str, value: str) -> None:
    """An edit by someone else (a merge patch: the key is theirs from now on)."""
    body = {"metadata": {"annotations": {PREFIX + fact: value}}}
    res(admin, *kind).patch(body=body, name=name, namespace=ns, content_type=MERGE)


def test_a_tampered_record_loses_the_bad_field_and_warns_once(kube_cli, admin, namespace, up_built):
    up_built("t", **{"--nodes": 2, "--elastic": "1:3"})
    evil = "[bold red]deadbeef[/]\x1b]0;owned\x07\x1b[2J"
    _tamper(admin, ("kubeflow.org/v1", "PyTorchJob"), namespace, "t", "DDPDEPLOY_GIT_COMMIT", evil)
    out = kube_cli("scale", "t", "--nodes", "3", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert warnings(out) == [
        f"warning: PyTorchJob {namespace}/t: its run record is malformed in "
        f"{PREFIX}DDPDEPLOY_GIT_COMMIT; left out of the new pods"
    ], out.stderr
    assert "\x1b" not in out.stderr and "deadbeef" not in out.stderr
    job = get_job(admin, namespace, "t")
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    kept = {k: v for k, v in WANT.items() if k != "DDPDEPLOY_GIT_COMMIT"}
    assert records(job) == [kept]
    assert "deadbeef" not in json.dumps(job["spec"])  # in no pod
    # The edited key is the editor's now: ddpdeploy leaves it, and applies the rest.
    assert saved(job) == {**kept, "DDPDEPLOY_GIT_COMMIT": evil}
    # After `down`, a bad dirty flag on the PVC: resume recreates the job without it.
    assert kube_cli("down", "t", "-n", namespace).returncode == 0
    pvc = ("v1", "PersistentVolumeClaim")
    _tamper(admin, pvc, namespace, "t-checkpoints", "DDPDEPLOY_GIT_DIRTY", "yes\nwarning: forged")
    out = kube_cli("resume", "t", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert warnings(out) == [
        f"warning: PersistentVolumeClaim {namespace}/t-checkpoints: its run record is "
        f"malformed in {PREFIX}DDPDEPLOY_GIT_DIRTY; left out of the new pods"
    ], out.stderr
    job = get_job(admin, namespace, "t")
    digest_only = {"DDPDEPLOY_IMAGE_DIGEST": DIGEST}
    assert records(job) == [digest_only]
    assert saved(job) == digest_only  # a new job: only what was well-formed
