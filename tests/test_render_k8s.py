"""PyTorchJob rendering over a matrix of options, validated against the real CRD schema
(unknown fields rejected) and built-in kinds against kubernetes-validate --strict."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from job_matrix import FULL, MATRIX
from k8s_schema import builtin_errors, pytorchjob_errors

from ddpdeploy.image_layout import RUNNER_IN_IMAGE
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import render_objects


def render(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    objects = render_objects(JobSpec.model_validate(doc))
    jobs = [o for o in objects if o["kind"] == "PyTorchJob"]
    pvcs = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    assert len(jobs) == 1 and len(pvcs) <= 1
    return jobs[0], (pvcs[0] if pvcs else None)


def by_kind(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [o for o in render_objects(JobSpec.model_validate(doc)) if o["kind"] == kind]


@pytest.mark.parametrize("case", list(MATRIX))
def test_every_rendered_object_validates(case):
    job, pvc = render(MATRIX[case])
    assert pytorchjob_errors(job) == []
    for policy in by_kind(MATRIX[case], "NetworkPolicy"):
        assert builtin_errors(policy) == []
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "t", "namespace": job["metadata"]["namespace"]},
            "template": replica["template"],
        }
        assert builtin_errors(pod_template) == []
    if pvc is not None:
        assert builtin_errors(pvc) == []


def test_validators_reject_what_the_apiserver_would():
    job, pvc = render(FULL)
    (replica,) = job["spec"]["pytorchReplicaSpecs"]  # c10d: the Worker replicas alone
    bad = copy.deepcopy(job)
    bad["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0][
        "imagePullPolicyy"
    ] = "Always"
    assert any("imagePullPolicyy" in e for e in pytorchjob_errors(bad))
    bad = copy.deepcopy(job)
    bad["spec"]["pytorchReplicaSpecs"][replica]["replicas"] = "one"
    assert pytorchjob_errors(bad)
    bad = copy.deepcopy(job)
    limits = bad["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0][
        "resources"
    ]["limits"]
    limits["memory"] = "lots"
    assert pytorchjob_errors(bad)
    bad_pvc = copy.deepcopy(pvc)
    bad_pvc["spec"]["accessMode"] = "ReadWriteMany"
    assert builtin_errors(bad_pvc)


def container(job: dict[str, Any], replica: str) -> dict[str, Any]:
    return job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0]


def values(env: list[dict[str, Any]]) -> dict[str, str]:
    """A container's literal env (the downward API's entries aside)."""
    return {e["name"]: e["value"] for e in env if "value" in e}


STATIC = {"rendezvous": {"mode": "static"}}


def test_static_layout_master_plus_workers():
    job, _ = render({"image": "train:v1", "nodes": 4, "gpus": 8, **STATIC})
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1
    assert specs["Worker"]["replicas"] == 3
    assert job["spec"]["nprocPerNode"] == "8"
    assert "elasticPolicy" not in job["spec"]
    c = container(job, "Master")
    assert c["name"] == "pytorch"
    assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert c["command"][-3:] == ["/opt/ddpdeploy/train/ddptrain.py", "--backend", "nccl"]


def test_one_node_job_has_no_worker_replicas():
    job, _ = render({"image": "train:v1", **STATIC})
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    assert job["spec"]["nprocPerNode"] == "1"


def test_the_default_is_c10d_of_a_fixed_size():
    """Workers only, met through c10d with min = max: a restart rejoins a fresh round, so a
    plain script survives it; `scale` leaves such a job alone (not elastic)."""
    job, _ = render({"image": "train:v1", "nodes": 3, "gpus": 8})
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    policy = job["spec"]["elasticPolicy"]
    assert (policy["rdzvBackend"], policy["minReplicas"], policy["maxReplicas"]) == ("c10d", 3, 3)
    env = values(container(job, "Worker")["env"])
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    from ddpdeploy.targets import layout_of

    assert layout_of("pytorchjob").elastic_range(job) is None
    assert layout_of("pytorchjob").rank0_hostname(job) is None


def test_elastic_layout_is_workers_only_with_policy():
    job, _ = render(MATRIX["elastic"])
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    policy = job["spec"]["elasticPolicy"]
    assert policy["rdzvBackend"] == "c10d"
    assert (policy["minReplicas"], policy["maxReplicas"], policy["maxRestarts"]) == (2, 6, 3)
    assert policy["rdzvPort"] == 23456


def test_pod_defaults_shm_istio_labels():
    job, _ = render({"image": "train:v1", "nodes": 2})
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in template[
        "spec"
    ]["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container(job, "Worker")["volumeMounts"]
    for meta in (job["metadata"], template["metadata"]):
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "ddpdeploy"
        assert meta["labels"]["app.kubernetes.io/name"] == "ddp-train"
        assert meta["labels"]["app.kubernetes.io/instance"] == "ddp-train"


def test_full_spec_reaches_the_pod():
    job, pvc = render(FULL)
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pvc is not None and pvc["metadata"]["name"] == "llm-checkpoints"
    assert pvc["spec"]["storageClassName"] == "fast-rwx"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "llm-checkpoints"}} in (
        pod["volumes"]
    )
    assert {"name": "checkpoints", "mountPath": "/ckpt"} in pod["containers"][0]["volumeMounts"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "trainer"
    assert pod["terminationGracePeriodSeconds"] == 120
    assert pod["priorityClassName"] == "high"
    assert pod["tolerations"][0]["operator"] == "Exists"
    env = values(pod["containers"][0]["env"])
    assert env["NCCL_DEBUG"] == "INFO" and env["OMP_NUM_THREADS"] == "4"
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 8},
        "limits": {"memory": "256Gi", "nvidia.com/gpu": 8},
    }
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    assert pod["containers"][0]["command"][-3:] == ["train.py", "--epochs", "3"]


def test_no_shm_mount_when_disabled():
    job, _ = render(MATRIX["no-shm"])
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert "dshm" not in [v["name"] for v in pod["volumes"]]
    assert "/dev/shm" not in [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]]


def test_builtin_trainer_gets_the_checkpoint_dir():
    job, pvc = render(MATRIX["existing-claim"])
    assert pvc is None
    cmd = container(job, "Worker")["command"]
    assert cmd[cmd.index("--checkpoint-dir") + 1] == "/checkpoints"


EXAMPLES = sorted(
    (Path(__file__).resolve().parents[1] / "k8s" / "examples").glob("*.ddpdeploy.yaml")
)


@pytest.mark.parametrize("spec_file", EXAMPLES, ids=lambda p: p.name)
def test_committed_examples_are_what_render_produces(spec_file):
    from ddpdeploy.commands.options import spec_from_flags
    from ddpdeploy.render.output import RECORD, folder_files, plan_folder

    folder = spec_file.with_name(spec_file.name.removesuffix(".ddpdeploy.yaml"))
    expected = folder_files(render_objects(spec_from_flags(spec_file)))
    expected[RECORD] = plan_folder(str(folder), expected, {}, {}).final
    assert {p.name: p.read_text() for p in folder.iterdir()} == expected


def _found(node: Any, key: str) -> list[Any]:
    """Every value under ``key`` anywhere in ``node`` (the targets nest the pod differently)."""
    if isinstance(node, dict):
        here = [node[key]] if key in node else []
        return here + [v for child in node.values() for v in _found(child, key)]
    if isinstance(node, list):
        return [v for child in node for v in _found(child, key)]
    return []


CKPT_ENV = "DDPDEPLOY_CHECKPOINT_DIR"


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob", "indexed-job"])
@pytest.mark.parametrize(
    "command", [{"script": "train.py", "args": ["--lr", "0.1"]}, {"module": "pkg.train"}, {}]
)
def test_every_process_is_told_the_checkpoint_mount(target, command):
    doc = {"image": "t:1", "nodes": 2, "target": target, "command": command}
    with_volume = {**doc, "checkpoint": {"claimName": "ck", "mountPath": "/data/ck"}}
    objects = render_objects(JobSpec.model_validate(with_volume))
    told = [e for env in _found(objects, "env") for e in env if e["name"] == CKPT_ENV]
    assert told and all(e == {"name": CKPT_ENV, "value": "/data/ck"} for e in told)
    assert "/data/ck" in _found(objects, "mountPath")  # ...where the volume is mounted
    without = render_objects(JobSpec.model_validate(doc))
    names = [e.get("name") for env in _found(without, "env") for e in env]
    assert CKPT_ENV not in names and "DDPDEPLOY_DNS_WAIT" in names


def test_script_example_runs_the_script_with_its_args_and_validates():
    from yaml_readers import kustomize_load_all

    folder = Path(__file__).resolve().parents[1] / "k8s" / "examples" / "script-2x4"
    built = kustomize_load_all(folder)
    (job,) = [o for o in built if o["kind"] == "PyTorchJob"]
    assert pytorchjob_errors(job) == []
    assert all(builtin_errors(o) == [] for o in built if o["kind"] != "PyTorchJob")
    for replica in job["spec"]["pytorchReplicaSpecs"]:  # c10d: the Workers alone
        c = container(job, replica)
        assert c["command"][-7:] == [
            "torchrun",
            RUNNER_IN_IMAGE,
            "train.py",
            "--epochs",
            "10",
            "--lr",
            "3e-4",
        ]
        env = {e["name"]: e.get("value") for e in c["env"]}
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert env["DDPDEPLOY_CHECKPOINT_DIR"] == mounts["checkpoints"] == "/checkpoints"
