"""The launch contract gives non-cluster targets exactly the env the training operator
(v1.9, envvar.go/elastic.go) would give each pod of the rendered PyTorchJob."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpdeploy.render.pod import pod_only_env
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import launch_contract, render_objects


def operator_env(job: dict[str, Any], rtype: str, index: int) -> dict[str, str]:
    """What the operator adds to the `pytorch` container of pod <job>-<rtype>-<index>,
    written from the operator's contract, independently of ddpdeploy.contract."""
    name = job["metadata"]["name"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    nproc = job["spec"].get("nprocPerNode", "auto")
    total = sum(s["replicas"] for s in specs.values())

    def port_of(replica: str) -> int:
        (c,) = [
            c for c in specs[replica]["template"]["spec"]["containers"] if c["name"] == "pytorch"
        ]
        (p,) = [p for p in c["ports"] if p["name"] == "pytorchjob-port"]
        return p["containerPort"]

    env = {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": nproc}
    if "Master" in specs:
        rank = index + 1 if rtype == "Worker" else index
        env |= {
            "MASTER_ADDR": f"{name}-master-0",
            "PET_MASTER_ADDR": f"{name}-master-0",
            "MASTER_PORT": str(port_of("Master")),
            "PET_MASTER_PORT": str(port_of("Master")),
            "WORLD_SIZE": str(total * int(nproc)) if nproc.isdigit() else str(total),
            "RANK": str(rank),
            "PET_NODE_RANK": str(rank),
        }
    policy = job["spec"].get("elasticPolicy")
    if policy is None:
        env["PET_NNODES"] = str(total)
    else:
        host = policy.get("rdzvHost", f"{name}-worker-0")
        port = policy.get("rdzvPort") or port_of("Worker")
        env |= {
            "PET_RDZV_ENDPOINT": f"{host}:{port}",
            "PET_RDZV_BACKEND": policy.get("rdzvBackend", "c10d"),
            "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}",
        }
        if "maxRestarts" in policy:
            env["PET_MAX_RESTARTS"] = str(policy["maxRestarts"])
        if "rdzvId" in policy:
            env["PET_RDZV_ID"] = policy["rdzvId"]
        if policy.get("rdzvConf"):
            env["PET_RDZV_CONF"] = ",".join(f"{c['key']}={c['value']}" for c in policy["rdzvConf"])
    container = specs[rtype]["template"]["spec"]["containers"][0]
    own = {}
    for e in container.get("env", []):
        if "valueFrom" in e:
            # The downward API's pod IP; the pod's name stands for its address here.
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
            own[e["name"]] = f"{name}-{rtype.lower()}-{index}"
        else:
            own[e["name"]] = e["value"]
    return {**own, **env}


STATIC = {"rendezvous": {"mode": "static"}}
CASES = {
    "static-1": {"image": "t:1", **STATIC},
    "static-3x8": {"image": "t:1", "nodes": 3, "gpus": 8, "env": {"NCCL_DEBUG": "INFO"}, **STATIC},
    "static-cpu": {"image": "t:1", "nodes": 2, "procs": 2, **STATIC},
    # The default: c10d with a fixed node count.
    "c10d-1": {"image": "t:1"},
    "c10d-3x8": {"image": "t:1", "nodes": 3, "gpus": 8, "env": {"NCCL_DEBUG": "INFO"}},
    "c10d-cpu": {"image": "t:1", "nodes": 2, "procs": 2, "rendezvous": {"maxRestarts": 2}},
    "elastic": {
        "image": "t:1",
        "nodes": 2,
        "gpus": 2,
        "rendezvous": {"mode": "elastic", "minNodes": 1, "maxNodes": 4, "maxRestarts": 3},
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_node_env_matches_what_the_operator_injects(case):
    spec = JobSpec.model_validate(CASES[case])
    contract = launch_contract(spec)
    (job,) = [o for o in render_objects(spec) if o["kind"] == "PyTorchJob"]
    pods = [
        (r, i) for r, s in job["spec"]["pytorchReplicaSpecs"].items() for i in range(s["replicas"])
    ]
    assert [(n.replica, n.index) for n in contract.nodes] == pods
    own = pod_only_env(spec)  # the pod's file system and NCCL settings, not the launch
    for node in contract.nodes:
        env = operator_env(job, node.replica, node.index)
        assert contract.node_env(node) == {k: v for k, v in env.items() if k not in own}


def test_static_rank_zero_is_master_zero():
    contract = launch_contract(JobSpec.model_validate({"nodes": 3, **STATIC}))
    ranks = {n.hostname: contract.node_env(n)["PET_NODE_RANK"] for n in contract.nodes}
    assert ranks == {
        "ddp-train-master-0": "0",
        "ddp-train-worker-0": "1",
        "ddp-train-worker-1": "2",
    }


def test_host_mapping_for_local_targets():
    contract = launch_contract(
        JobSpec.model_validate(
            {"nodes": 2, "rendezvous": {"mode": "elastic", "minNodes": 1, "maxNodes": 2}}
        )
    )
    hosts = {"ddp-train-worker-0": "127.0.0.1", "ddp-train-worker-1": "127.0.0.2"}
    env = contract.node_env(contract.nodes[1], hosts)
    assert env["PET_RDZV_ENDPOINT"] == "127.0.0.1:23456"
    assert env["DDPDEPLOY_RDZV_HOST"] == "127.0.0.1"
    assert env["PET_LOCAL_ADDR"] == "127.0.0.2"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_torchrun_gets_no_topology_flags():
    # A flag would override the operator's PET_* env; the command must carry none.
    contract = launch_contract(JobSpec.model_validate({"nodes": 2, "gpus": 4}))
    assert contract.torchrun_argv() == ["torchrun", *contract.entry_argv()]
    assert contract.entry_argv()[0] == "/opt/ddpdeploy/train/ddptrain.py"


def trainer_env(job: dict[str, Any], index: int) -> dict[str, str]:
    """What Kubeflow Trainer v2's torch plugin gives the `node` container of pod
    <job>-node-0-<index>, plus the TrainJob's own trainer.env; written from Trainer's
    contract, independently of ddpdeploy."""
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    env = {}
    for e in trainer.get("env", []):
        if "valueFrom" in e:  # the pod's IP (PET_LOCAL_ADDR): its address stands for it here
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
            env[e["name"]] = f"{name}-node-0-{index}.{name}"
        else:
            env[e["name"]] = e["value"]
    return env | {
        "PET_NNODES": str(trainer["numNodes"]),
        "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
        "PET_NODE_RANK": str(index),  # the completion index
        "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
        "PET_MASTER_PORT": "29400",
    }


def indexed_pod_env(job: dict[str, Any], index: int) -> dict[str, str]:
    """The env of the Indexed Job's pod with completion index ``index``, the downward API
    resolved as the kubelet would."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {}
    name = job["metadata"]["name"]
    for e in container["env"]:
        if "valueFrom" in e:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            if path == "status.podIP":  # the pod's address stands for its IP here
                env[e["name"]] = f"{name}-{index}.{name}"
                continue
            assert path == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
            env[e["name"]] = str(index)
        else:
            env[e["name"]] = e["value"]
    return env


@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith("elastic")])
def test_node_env_matches_trainer_v2_and_the_indexed_job_pod(case):
    for target, expected in (("trainjob", trainer_env), ("indexed-job", indexed_pod_env)):
        spec = JobSpec.model_validate({**CASES[case], "target": target})
        contract = launch_contract(spec)
        (job,) = [o for o in render_objects(spec) if o["kind"] in ("TrainJob", "Job")]
        assert [n.index for n in contract.nodes] == list(range(spec.nodes))
        own = pod_only_env(spec)  # the pod's file system and NCCL settings, not the launch
        for node in contract.nodes:
            env = expected(job, node.index)
            assert contract.node_env(node) == {k: v for k, v in env.items() if k not in own}


@pytest.mark.parametrize("mode", ["static", "c10d"])
def test_rendezvous_host_is_node_zero_of_each_layout(mode):
    names = {
        "pytorchjob": (
            f"ddp-train-{'master' if mode == 'static' else 'worker'}-0",
            "ddp-train-worker-1" if mode == "static" else "ddp-train-worker-2",
        ),
        "trainjob": ("ddp-train-node-0-0.ddp-train", "ddp-train-node-0-2.ddp-train"),
        "indexed-job": ("ddp-train-0.ddp-train", "ddp-train-2.ddp-train"),
    }
    for target, (rdzv, last) in names.items():
        doc = {"nodes": 3, "target": target, "rendezvous": {"mode": mode}}
        contract = launch_contract(JobSpec.model_validate(doc))
        assert contract.rdzv_host == rdzv == contract.nodes[0].address
        assert contract.nodes[-1].address == last
        # The container's DNS wait looks up the very host torchrun connects to.
        env = contract.node_env(contract.nodes[-1])
        assert env["DDPDEPLOY_RDZV_HOST"] == rdzv
        if mode == "static":
            assert env["PET_MASTER_ADDR"] == rdzv
        else:  # every node meets at node 0's c10d endpoint, a fresh store each round
            assert env["PET_RDZV_ENDPOINT"] == f"{rdzv}:{contract.port}"
            assert env["PET_RDZV_BACKEND"] == "c10d"
            assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_run_env_is_added_after_the_specs_env_without_the_user_env_checks():
    # ddpdeploy's own run-only env (a smoke run's) may use reserved names; the user's may not.
    spec = JobSpec.model_validate({"nodes": 2, "env": {"A": "spec", "B": "spec"}})
    run_env = {"B": "run", "PET_EXTRA": "1", "DDPDEPLOY_SMOKE": "yes"}
    contract = launch_contract(spec, run_env=run_env)
    for node in contract.nodes:
        env = contract.node_env(node)
        assert (env["A"], env["B"], env["PET_EXTRA"], env["DDPDEPLOY_SMOKE"]) == (
            "spec",
            "run",
            "1",
            "yes",
        )
    assert contract.pod_env()["B"] == "run"
    assert launch_contract(spec).base_env["B"] == "spec"  # the spec itself is unchanged
    with pytest.raises(ValueError, match="PET_EXTRA is set by ddpdeploy's launch contract"):
        JobSpec.model_validate({"env": {"PET_EXTRA": "1"}})


def test_the_contract_takes_its_layout_as_a_parameter():
    from ddpdeploy import contract as launch
    from ddpdeploy.targets import layout_of

    spec = JobSpec.model_validate({"nodes": 2})
    on_trainjob = launch.launch_contract(spec, layout_of("trainjob"))
    assert [n.hostname for n in on_trainjob.nodes] == ["ddp-train-node-0-0", "ddp-train-node-0-1"]
    assert on_trainjob.port == 29400
    assert launch_contract(spec).layout is layout_of("pytorchjob")


def test_a_script_or_module_runs_through_the_runner_beside_the_trainer():
    # ddprun.py skips the interpreter teardown in which torch aborts finished runs; it sits
    # beside the trainer in the image and in the package, so a local path maps to it too.
    from ddpdeploy.image_layout import RUNNER_IN_IMAGE
    from ddpdeploy.paths import trainer_dir, trainer_script

    script = JobSpec.model_validate({"command": {"script": "t.py", "args": ["--lr", "1"]}})
    module = JobSpec.model_validate({"command": {"module": "pkg.train", "args": ["x"]}})
    assert launch_contract(script).entry_argv() == [RUNNER_IN_IMAGE, "t.py", "--lr", "1"]
    assert launch_contract(module).entry_argv() == [RUNNER_IN_IMAGE, "-m", "pkg.train", "x"]
    local = launch_contract(script).entry_argv(str(trainer_script()))
    assert local[0] == str(trainer_dir() / "ddprun.py") and Path(local[0]).is_file()


@pytest.mark.parametrize(
    ("doc", "threads"),
    [
        ({"cpu": "400m"}, "1"),  # at least one
        ({"cpu": "32", "gpus": 8}, "4"),  # the request shared by the node's processes
        ({"cpu": "7", "procs": 2}, "3"),
        ({}, None),  # no cpu: torch and torchrun decide (torchrun: 1 for several processes)
        ({"cpu": "8", "env": {"OMP_NUM_THREADS": "2"}}, "2"),  # the spec's env wins
    ],
)
def test_each_process_gets_its_share_of_the_cpu_request_as_threads(doc, threads):
    contract = launch_contract(JobSpec.model_validate({"nodes": 2, **doc}))
    for node in contract.nodes:
        assert contract.node_env(node).get("OMP_NUM_THREADS") == threads


def test_a_secret_omp_num_threads_is_left_to_the_secret():
    spec = {"cpu": "8", "secretEnv": {"OMP_NUM_THREADS": {"secret": "s", "key": "k"}}}
    contract = launch_contract(JobSpec.model_validate(spec))
    assert "OMP_NUM_THREADS" not in contract.node_env(contract.nodes[0])
