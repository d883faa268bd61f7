"""Every target (pytorchjob, trainjob, indexed-job) over a matrix of options: the TrainJob
against its CRD (unknown fields rejected) and the pod Trainer would run from it, the Job,
Service and pod templates with kubernetes-validate --strict; the targets' refusals; their
GitOps folders through `kubectl kustomize`; and each layout emulated on CPU."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from cli_runner import run_main
from job_matrix import FULL, MATRIX
from k8s_schema import builtin_errors, pytorchjob_errors, trainjob_errors, trainjob_pod_template
from yaml_readers import kustomize_load_all

from ddpdeploy.image_layout import RUNNER_IN_IMAGE
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import render_objects

TARGETS = ["pytorchjob", "trainjob", "indexed-job"]
# What a target refuses (tested below); the matrix leaves it out for that target.
UNSUPPORTED = {
    "trainjob": {"priorityClass", "runPolicy"},
    "indexed-job": set(),
}


def for_target(doc: dict[str, Any], target: str) -> dict[str, Any] | None:
    if target != "pytorchjob" and doc.get("rendezvous", {}).get("mode") == "elastic":
        return None
    out = {k: v for k, v in doc.items() if k not in UNSUPPORTED.get(target, ())}
    if target == "trainjob" and "runPolicy" in doc:
        out["runPolicy"] = {"activeDeadlineSeconds": 86400}
    if target == "trainjob" and "network" in doc:  # a runtime patch has no hostNetwork
        out["network"] = {k: v for k, v in doc["network"].items() if k != "hostNetwork"}
    if target == "trainjob" and "scheduling" in doc:  # nor a schedulerName
        out["scheduling"] = {k: v for k, v in doc["scheduling"].items() if k != "scheduler"}
    if target == "indexed-job" and "runPolicy" in doc:
        out["runPolicy"] = {k: v for k, v in doc["runPolicy"].items() if k != "cleanPodPolicy"}
    return {**out, "target": target}


GANG = {"image": "train:v1", "nodes": 2, "scheduling": {"scheduler": "volcano", "queue": "q"}}


CASES = [
    pytest.param(doc, id=f"{target}-{name}")
    for target in TARGETS
    for name, base in {**MATRIX, "volcano-static": GANG}.items()
    if (doc := for_target(base, target)) is not None
]


def pod_template(template: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "t", "namespace": namespace},
        "template": template,
    }


def errors(obj: dict[str, Any]) -> list[str]:
    ns = obj["metadata"]["namespace"]
    if obj["kind"] == "PyTorchJob":
        out = pytorchjob_errors(obj)
        for replica in obj["spec"]["pytorchReplicaSpecs"].values():
            out += builtin_errors(pod_template(replica["template"], ns))
        return out
    if obj["kind"] == "TrainJob":
        return trainjob_errors(obj) + builtin_errors(trainjob_pod_template(obj))
    if obj["kind"] == "PodGroup":
        return []  # Volcano's CRD is not in tests/schemas; tests/test_render_hardening.py
    return builtin_errors(obj)  # Job (with its pod template), Service, PVC, NetworkPolicy


@pytest.mark.parametrize("doc", CASES)
def test_every_target_renders_valid_objects(doc):
    objects = render_objects(JobSpec.model_validate(doc))
    kinds = [o["kind"] for o in objects]
    expected = {
        "pytorchjob": ["PyTorchJob"],
        "trainjob": ["TrainJob"],
        "indexed-job": ["Service", "Job"],
    }[doc["target"]]
    beside = ("PersistentVolumeClaim", "NetworkPolicy", "PodGroup")
    assert [k for k in kinds if k not in beside] == expected
    # No operator makes the Indexed Job's PodGroup: it is rendered (PyTorchJob's operator
    # makes its own; a TrainJob cannot be gang-scheduled from here, see below).
    gang = doc.get("scheduling", {}).get("scheduler") == "volcano"
    assert ("PodGroup" in kinds) == (gang and doc["target"] == "indexed-job")
    for obj in objects:
        assert errors(obj) == [], obj["kind"]


def test_trainjob_validator_rejects_unknown_fields():
    job = render_one(for_target(FULL, "trainjob"), "TrainJob")
    bad = copy.deepcopy(job)
    bad["spec"]["trainer"]["numProcsPerNode"] = 8
    assert any("numProcsPerNode" in e for e in trainjob_errors(bad))
    bad = copy.deepcopy(job)
    patch = bad["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["priorityClassName"] = "x"
    assert any("priorityClassName" in e for e in trainjob_errors(bad))


def render_one(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in render_objects(JobSpec.model_validate(doc)) if o["kind"] == kind]
    return obj


def test_trainjob_carries_the_pod_through_trainer_and_runtime_patch():
    doc = {**for_target(FULL, "trainjob"), "runtime": "torch-cuda-251"}
    job = render_one(doc, "TrainJob")
    spec = job["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-cuda-251",
    }
    trainer = spec["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 8)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert trainer["command"][-1] == "torchrun"
    assert trainer["args"][:2] == [RUNNER_IN_IMAGE, "train.py"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["DDPDEPLOY_RDZV_HOST"] == "llm-node-0-0.llm"  # Trainer's PET_MASTER_ADDR
    # Trainer injects the topology (and refuses PET_NNODES, ..._NPROC_PER_NODE, ..._NODE_RANK,
    # ..._MASTER_ADDR, ..._MASTER_PORT in trainer.env); PET_TEE is the contract's rank prefix,
    # PET_LOG_DIR the pod's bounded log volume for it, and c10d (the default) meets at that
    # master address, a fresh round after a restart.
    c10d = {"PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF"}
    ours = {"PET_TEE", "PET_LOG_DIR", "PET_LOCAL_ADDR", *c10d}
    assert {n for n in env if n.startswith("PET_")} == ours
    assert env["PET_RDZV_ENDPOINT"] == "llm-node-0-0.llm:29400"
    static = render_one({**doc, "rendezvous": {"mode": "static"}}, "TrainJob")["spec"]["trainer"]
    own = ("PET_TEE", "PET_LOG_DIR")
    assert not [e for e in static["env"] if e["name"].startswith("PET_") and e["name"] not in own]
    assert spec["activeDeadlineSeconds"] == 86400
    pod = trainjob_pod_template(job)["template"]
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    assert volumes == {"dshm", "checkpoints", "tmp", "home", "torchrun-logs"}
    (container,) = pod["spec"]["containers"]
    assert {"/dev/shm", "/ckpt", "/tmp"} <= {m["mountPath"] for m in container["volumeMounts"]}
    # The hardened pod's settings reach the pod Trainer runs.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["spec"]["serviceAccountName"] == "trainer"


def test_indexed_job_layout():
    doc = for_target(FULL, "indexed-job")
    job, svc = render_one(doc, "Job"), render_one(doc, "Service")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 3
    assert spec["backoffLimit"] == 3 and spec["ttlSecondsAfterFinished"] == 3600
    assert spec["podFailurePolicy"]["rules"][0]["action"] == "Ignore"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    labels = spec["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    values = {n: e.get("value") for n, e in env.items()}
    # c10d (the default): every node meets at node 0, which numbers no node itself.
    assert values["PET_RDZV_ENDPOINT"] == "llm-0.llm:23456" and "PET_NODE_RANK" not in env
    assert values["DDPDEPLOY_RDZV_HOST"] == "llm-0.llm"
    assert (values["PET_NNODES"], values["PET_NPROC_PER_NODE"]) == ("3", "8")
    static = render_one({**doc, "rendezvous": {"mode": "static"}}, "Job")
    env = {e["name"]: e for e in static["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PET_NODE_RANK"]["valueFrom"] == {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    values = {n: e.get("value") for n, e in env.items()}
    assert values["PET_MASTER_ADDR"] == values["DDPDEPLOY_RDZV_HOST"] == "llm-0.llm"
    assert values["PET_MASTER_PORT"] == "23456"
    default = render_one({"image": "t:1", "nodes": 2, "target": "indexed-job"}, "Job")
    assert default["spec"]["backoffLimit"] == 4  # about two retries of the whole job


def refused(*args: str) -> str:
    res = run_main("render", "--image", "t:1", *args)
    assert res.returncode == 2 and res.stdout == "", res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--target", "trainjob", "--elastic", "1:2"], "Trainer v2 has no elastic training"),
        (["--target", "indexed-job", "--elastic", "1:2"], "parallelism is fixed"),
        (["--target", "argo"], "--target: must be 'pytorchjob', 'trainjob' or 'indexed-job'"),
        (["--runtime", "x"], "runtime applies only to target trainjob"),
        (["--target", "trainjob", "--runtime", "Bad_Name"], "--runtime: must be a DNS-1123"),
        (["--target", "trainjob", "--name", "a" * 56, "--nodes", "10"], "at most 54 characters"),
        (["--target", "indexed-job", "--name", "a" * 62, "--nodes", "10"], "at most 61"),
        (["--name", "a" * 55, "--nodes", "10"], "at most 54 characters"),
    ],
)
def test_one_line_refusals(args, expected):
    assert expected in refused(*args)


@pytest.mark.parametrize(
    ("target", "text", "expected"),
    [
        ("trainjob", "env: {PET_MASTER_ADDR: x}", "PET_MASTER_ADDR is set by ddpdeploy's launch"),
        ("trainjob", "env: {PET_NODE_RANK: '1'}", "PET_NODE_RANK is set by ddpdeploy's launch"),
        ("trainjob", "priorityClass: high", "cannot set the pod's priorityClassName"),
        ("trainjob", "runPolicy: {backoffLimit: 1}", "runPolicy.backoffLimit has no TrainJob"),
        ("trainjob", "rendezvous: {port: 29500}", "fixed at 29400"),
        ("indexed-job", "runPolicy: {cleanPodPolicy: All}", "cleanPodPolicy has no Job field"),
        ("trainjob", "scheduling: {scheduler: volcano}", "cannot set the pod's schedulerName"),
        ("trainjob", "network: {hostNetwork: true}", "cannot set the pod's hostNetwork"),
    ],
)
def test_spec_fields_a_target_cannot_carry(tmp_path, target, text, expected):
    path = tmp_path / "job.yaml"
    path.write_text(text + "\n")
    assert expected in refused("-f", str(path), "--target", target)


def test_target_field_in_the_file_and_the_flag_wins(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("target: indexed-job\nnodes: 2\n")
    res = run_main("render", "--image", "t:1", "-f", str(path))
    assert res.returncode == 0 and kinds(res.stdout) == ["Service", "Job"]
    res = run_main("render", "--image", "t:1", "-f", str(path), "--target", "trainjob")
    assert res.returncode == 0 and kinds(res.stdout) == ["TrainJob"]


def kinds(text: str) -> list[str]:
    return [k for k in re.findall(r"^kind: (\w+)", text, re.M) if k != "NetworkPolicy"]


@pytest.mark.parametrize("target", TARGETS)
def test_out_dir_is_byte_stable_and_kustomize_builds_it(tmp_path, target):
    args = ["--image", "t:1", "--nodes", "2", "--gpus", "8", "--target", target]
    out = tmp_path / "deploy"
    assert run_main("render", *args, "--out-dir", str(out)).returncode == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert run_main("render", *args, "--out-dir", str(out)).returncode == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    built = kustomize_load_all(out)
    spec = JobSpec.model_validate({"image": "t:1", "nodes": 2, "gpus": 8, "target": target})
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    assert sorted(built, key=key) == sorted(render_objects(spec), key=key)


@pytest.mark.parametrize("example", ["static-2x8", "trainjob-2x8", "indexed-job-2x8"])
def test_committed_examples_build_with_kustomize(example):
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "k8s" / "examples" / example
    built = kustomize_load_all(folder)
    assert built and all(errors(o) == [] for o in built)


@pytest.mark.parametrize("target", TARGETS)
def test_cluster_facts_read_the_rendered_job_back(target):
    from ddpdeploy.targets import layout_for_kind, layout_of

    spec = JobSpec.model_validate({"image": "t:1", "nodes": 3, "gpus": 4, "target": target})
    job = render_objects(spec)[-1]
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    assert layout is layout_of(target)
    assert layout.job_size(job) == (3, 4)
    assert layout.pod_selector("x") == {layout.pod_label: "x"}


@pytest.mark.parametrize("doc", CASES)
def test_a_dumped_spec_validates_again(doc):
    # Cluster commands save the spec as JSON on the objects and read it back.
    spec = JobSpec.model_validate(doc)
    assert JobSpec.model_validate(spec.model_dump(mode="json", by_alias=True)) == spec


def test_cluster_commands_find_a_targets_pods_by_hostname():
    from ddpdeploy.cluster.jobstate import pod_view
    from ddpdeploy.cluster.watch import node_pod, rank0_pod
    from ddpdeploy.targets import layout_for_kind

    doc = {"image": "t:1", "nodes": 2, "target": "indexed-job", "rendezvous": {"mode": "static"}}
    job = render_objects(JobSpec.model_validate(doc))[-1]
    job["metadata"]["namespace"] = "default"
    pods = [
        {
            "metadata": {
                "name": f"ddp-train-{i}-x7k2{i}",
                "labels": {"batch.kubernetes.io/job-completion-index": str(i)},
            },
            "spec": {"hostname": f"ddp-train-{i}"},
            "status": {"phase": "Running"},
        }
        for i in (1, 0)
    ]
    assert rank0_pod(None, job, pods) == "ddp-train-0-x7k20"  # type: ignore[arg-type]
    assert node_pod(job, pods, None, 1) == "ddp-train-1-x7k21"
    assert node_pod(job, pods, None, None) is None
    assert node_pod(job, pods[1:], None, 1) is None  # not there (yet): no made-up name
    view = pod_view(pods[0], layout_for_kind(job["apiVersion"], job["kind"]))
    assert (view.replica, view.index) == ("node", 1)


def test_indexed_job_gang_and_queue():
    gang = render_objects(JobSpec.model_validate({**GANG, "target": "indexed-job"}))
    group, job = [o for o in gang if o["kind"] in ("PodGroup", "Job")]
    assert group["spec"]["minMember"] == 2 and group["spec"]["queue"] == "q"
    pod = job["spec"]["template"]
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "ddp-train"
    for target in ("indexed-job", "trainjob"):
        doc = {"image": "t:1", "nodes": 2, "scheduling": {"queue": "team-a"}, "target": target}
        job = render_objects(JobSpec.model_validate(doc))[-1]
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert job["spec"]["suspend"] is True


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("nodes", [1, 2, 10, 11, 100])
def test_rules_name_budget_matches_the_layouts_longest_name(target, nodes):
    # The spec checks names against rules.TARGET_RULES; the layout makes the names: the
    # rule is never looser than the layout, and exact where the layout reaches it.
    from ddpdeploy.rules import MAX_DNS_LABEL, TARGET_RULES
    from ddpdeploy.targets import layout_of

    rules = TARGET_RULES[target]
    doc: dict[str, Any] = {"name": "j", "nodes": nodes, "target": target}
    if target == "pytorchjob":  # elastic: Worker replicas 0..maxNodes-1, the longest names
        doc["rendezvous"] = {"mode": "elastic", "minNodes": 1, "maxNodes": nodes}
    spec = JobSpec.model_validate(doc)
    longest = max((n.hostname for n in layout_of(target).nodes(spec)), key=len)
    assert len(longest) == len("j" + rules.label_suffix.format(index=nodes - 1))
    static = JobSpec.model_validate({**doc, "rendezvous": {}})
    assert all(len(n.hostname) <= len(longest) for n in layout_of(target).nodes(static))
    budget = MAX_DNS_LABEL - len(longest) + 1
    JobSpec.model_validate({**doc, "name": "j" * budget})
    with pytest.raises(ValueError, match=f"shorten name to at most {budget} characters"):
        JobSpec.model_validate({**doc, "name": "j" * (budget + 1)})
