"""Hardened pods, the NetworkPolicy, gang scheduling/queueing and GPU networking: what the
spec and flags put into the rendered objects, and the one-line refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cli_runner import run_main

from ddpdeploy.spec import IMAGE_UID, JobSpec
from ddpdeploy.targets import render_objects

BASE = {"image": "train:v1", "nodes": 2}


def objects(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {o["kind"]: o for o in render_objects(JobSpec.model_validate({**BASE, **doc}))}
    assert len(out) == len(render_objects(JobSpec.model_validate({**BASE, **doc})))
    return out


def pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    job = objects(doc)["PyTorchJob"]
    return [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_default_pod_is_hardened():
    for template in pods({}):
        pod = template["spec"]
        assert pod["securityContext"] == {
            "fsGroup": IMAGE_UID,
            "fsGroupChangePolicy": "OnRootMismatch",
            "runAsGroup": IMAGE_UID,
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert pod["automountServiceAccountToken"] is False
        assert pod["enableServiceLinks"] is False
        (c,) = pod["containers"]
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
        }
        # No CPU limit (throttling stalls collectives); memory limited; defaults per process.
        assert c["resources"] == {
            "requests": {"cpu": "1", "memory": "4Gi"},
            "limits": {"memory": "4Gi"},
        }
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[mounts["/tmp"]]["emptyDir"] == {}
        assert volumes[mounts["/home/ddp"]]["emptyDir"] == {}
        env = env_of(c)
        assert env["TMPDIR"] == "/tmp" and env["HOME"] == "/home/ddp"
        assert env["XDG_CACHE_HOME"].startswith("/home/ddp/")
        assert env["TORCHINDUCTOR_CACHE_DIR"].startswith("/tmp/")
        assert "NCCL_DEBUG" not in env  # CPU job
        assert "schedulerName" not in pod and "hostNetwork" not in pod


def test_resources_default_per_process_and_devices_requested_as_limited():
    (c,) = pods({"gpus": 4, "network": {"rdma": {"resource": "rdma/ib", "count": 2}}})[0]["spec"][
        "containers"
    ]
    assert c["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 4, "rdma/ib": 2},
        "limits": {"memory": "16Gi", "nvidia.com/gpu": 4, "rdma/ib": 2},
    }
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


def test_loosening_each_setting_by_name():
    doc = {
        "security": {"readOnlyRootFilesystem": False, "automountServiceAccountToken": True},
        "checkpoint": {"claimName": "c", "mountPath": "/tmp"},  # fine once /tmp is not ours
    }
    pod = pods(doc)[0]["spec"]
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is False
    assert pod["automountServiceAccountToken"] is True
    assert {m["name"] for m in c["volumeMounts"]} == {"dshm", "checkpoints", "torchrun-logs"}
    assert not {"TMPDIR", "HOME"} & set(env_of(c))


def test_user_env_wins_over_the_cache_locations():
    (c,) = pods({"env": {"HOME": "/data/home"}})[0]["spec"]["containers"]
    assert env_of(c)["HOME"] == "/data/home"


def test_secret_env_is_a_reference_and_never_a_value():
    doc = {"secretEnv": {"HF_TOKEN": {"secret": "hf-creds", "key": "token"}}}
    (c,) = pods(doc)[0]["spec"]["containers"]
    assert env_of(c)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-creds", "key": "token"}}


def test_network_policy_admits_only_the_jobs_pods():
    rendered = objects({"name": "llm"})
    policy = rendered["NetworkPolicy"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector["app.kubernetes.io/instance"] == "llm"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]
    # The selector picks exactly the pods of this job.
    for template in pods({"name": "llm"}):
        assert selector.items() <= template["metadata"]["labels"].items()
    assert "NetworkPolicy" not in objects({"network": {"policy": False}})


def test_volcano_gang_of_all_nodes_with_queue_and_priority():
    doc = {
        "nodes": 3,
        "priorityClass": "high",
        "scheduling": {"scheduler": "volcano", "queue": "research"},
    }
    job = objects(doc)["PyTorchJob"]
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 3,
        "queue": "research",
        "priorityClass": "high",
    }
    assert "suspend" not in job["spec"]["runPolicy"]
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    assert all(t["spec"]["schedulerName"] == "volcano" for t in pods(doc))
    elastic = {**doc, "rendezvous": {"mode": "elastic", "minNodes": 2, "maxNodes": 4}}
    policy = objects(elastic)["PyTorchJob"]["spec"]["runPolicy"]["schedulingPolicy"]
    assert policy["minAvailable"] == 2  # the gang an elastic job can start with


def test_kueue_queue_label_on_the_job_only_and_suspended():
    job = objects({"scheduling": {"queue": "team-a"}})["PyTorchJob"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["runPolicy"]["suspend"] is True
    assert all("kueue.x-k8s.io/queue-name" not in t["metadata"]["labels"] for t in pods({}))


def test_host_network_and_nccl_knobs():
    doc = {
        "gpus": 8,
        "network": {"hostNetwork": True, "ncclSocketIfname": "eth0", "ncclIbHca": "mlx5_0"},
    }
    pod = pods(doc)[0]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    env = env_of(pod["containers"][0])
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_HCA"] == "mlx5_0"
    assert env["NCCL_DEBUG"] == "WARN"  # the GPU default
    env = env_of(pods({"gpus": 8, "env": {"NCCL_DEBUG": "INFO"}})[0]["spec"]["containers"][0])
    assert env["NCCL_DEBUG"] == "INFO"  # the user's env, not our default


def flags_render(*flags: str) -> dict[str, Any]:
    res = run_main("render", "--image", "t:1", "--nodes", "2", "-o", "json", *flags)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    return {o["kind"]: o for o in data.get("items", [data])}


def test_flags_reach_the_objects():
    out = flags_render(
        "--gpus",
        "8",
        "--scheduler",
        "volcano",
        "--queue",
        "q1",
        "--rdma",
        "rdma/ib=1",
        "--host-network",
        "--nccl-debug",
        "INFO",
        "--no-network-policy",
        "--writable-rootfs",
    )
    assert "NetworkPolicy" not in out
    job = out["PyTorchJob"]
    assert job["spec"]["runPolicy"]["schedulingPolicy"]["queue"] == "q1"
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["hostNetwork"] is True and pod["schedulerName"] == "volcano"
    assert c["resources"]["limits"]["rdma/ib"] == 1
    assert env_of(c)["NCCL_DEBUG"] == "INFO"
    assert c["securityContext"]["readOnlyRootFilesystem"] is False
    assert "NetworkPolicy" in flags_render()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rdma", "rdma/ib"], "--rdma: 'rdma/ib' is not RESOURCE=N"),
        (["--rdma", "ib=1"], "--rdma: resource 'ib' must be a device plugin's"),
        (["--rdma", "kubernetes.io/x=1"], "must be a device plugin's domain-qualified name"),
        (["--rdma", "rdma/ib=0"], "--rdma: "),
        (["--scheduler", "kube-batch"], "--scheduler: "),
        (["--nccl-debug", "LOUD"], "--nccl-debug: "),
        (["--queue", "Team_A"], "--queue: "),
    ],
)
def test_bad_flags_one_line_exit_2(args, expected):
    res = run_main("render", "--image", "t:1", *args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and expected in res.stderr, res.stderr
    assert res.stdout == ""


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"env": {"A": "1"}, "secretEnv": {"A": {"secret": "s", "key": "k"}}}, "A is in both"),
        ({"secretEnv": {"RANK": {"secret": "s", "key": "k"}}}, "RANK is set by ddpdeploy"),
        ({"secretEnv": {"A": {"secret": "s", "key": "k/x"}}}, "secret key 'k/x' is invalid"),
        (
            {"env": {"NCCL_DEBUG": "INFO"}, "network": {"ncclDebug": "WARN"}},
            "NCCL_DEBUG is set by network.ncclDebug and by env",
        ),
        ({"checkpoint": {"claimName": "c", "mountPath": "/tmp"}}, "mountPath /tmp is where"),
        ({"security": {"runAsUser": 0}}, "security.runAsUser"),
        # Found by the second hostile pass: accepted, and refused by the API server at apply.
        ({"security": {"runAsUser": 2**31}}, "security.runAsUser"),
        ({"security": {"fsGroup": 2**32}}, "security.fsGroup"),
    ],
)
def test_spec_refusals_name_the_field(tmp_path, doc, expected):
    path = tmp_path / "ddpdeploy.yaml"
    path.write_text(json.dumps({**BASE, **doc}))
    res = run_main("render", "-f", str(path))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert expected in res.stderr, res.stderr


def test_pod_group_for_targets_without_an_operator():
    from ddpdeploy.render.policy import pod_group

    doc = {**BASE, "nodes": 4, "priorityClass": "high", "scheduling": {"scheduler": "volcano"}}
    group = pod_group(JobSpec.model_validate(doc), "g")
    assert group is not None and group["kind"] == "PodGroup"
    assert group["spec"] == {"minMember": 4, "priorityClassName": "high"}
    assert pod_group(JobSpec.model_validate(BASE), "g") is None
