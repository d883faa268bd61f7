"""`ddpdeploy compose` over a matrix of options, checked against the Compose Specification's
JSON Schema and Debian 12's `docker-compose` 1.29.2, and against the launch contract."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from cli_runner import run_cli, run_main

from ddpdeploy.render.output import to_yaml
from ddpdeploy.render.pod import pod_only_env
from ddpdeploy.smoke.compose import ROLE_LABEL, quantity_bytes, render_compose
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import launch_contract

SCHEMA = Path(__file__).resolve().parent / "schemas" / "compose-spec.json"
ELASTIC = {"mode": "elastic", "minNodes": 1, "maxNodes": 3}
CKPT = {"size": "10Gi", "mountPath": "/ckpt"}


def case(kind: str, ckpt: bool, gpu: bool) -> tuple[dict[str, Any], bool]:
    """A 2-node job with 4 GPUs per node, rendered with GPUs or with --cpu."""
    doc: dict[str, Any] = {"name": "job", "image": "ghcr.io/t/train:v1", "nodes": 2, "gpus": 4}
    if kind == "elastic":
        doc["rendezvous"] = ELASTIC
    if ckpt:
        doc["checkpoint"] = CKPT
    return doc, not gpu  # the cpu flag


MATRIX = [
    pytest.param(*case(kind, ckpt, gpu), id=f"{kind}-{'ckpt' if ckpt else 'nockpt'}-{dev}")
    for kind in ("static", "elastic")
    for ckpt in (True, False)
    for gpu, dev in ((True, "gpu"), (False, "cpu"))
]
EXTRA = [
    pytest.param({"image": "t:1"}, None, id="one-node-defaults"),
    pytest.param({"image": "t:1", "shmSize": None, "nodes": 3}, None, id="no-shm"),
    *(
        pytest.param({"image": "t:1", "nodes": 2, "gpus": 4, "target": t}, gpu, id=f"{t}-{gpu}")
        for t in ("trainjob", "indexed-job")
        for gpu in (None, True)
    ),
    pytest.param(
        {
            "image": "t:1",
            "nodes": 2,
            "checkpoint": CKPT,
            "security": {"readOnlyRootFilesystem": False, "runAsUser": 1234, "fsGroup": 2000},
            "secretEnv": {"HF_TOKEN": {"secret": "hf", "key": "token"}},
            "network": {"rdma": {"resource": "rdma/hca"}},
        },
        None,
        id="writable-rootfs-secret-rdma",
    ),
    pytest.param(
        {
            "image": "t:1",
            "nodes": 2,
            "command": {"module": "pkg.train", "args": ["--lr", "$HOME", "a b"]},
            "env": {"NCCL_DEBUG": "INFO", "TOKEN": "x$y${z}"},
            "rendezvous": {**ELASTIC, "maxRestarts": 2, "port": 29500},
            "runPolicy": {"backoffLimit": 3},
        },
        None,
        id="module-dollars-backoff",
    ),
]


@cache
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def docker_compose() -> str:
    found = shutil.which("docker-compose")
    if found is None:
        reason = "docker-compose is not installed (.ci/docker-setup.sh installs it)"
        if os.environ.get("DDPDEPLOY_REQUIRE_DOCKER") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


@pytest.mark.parametrize(("doc", "cpu"), MATRIX + EXTRA)
def test_rendered_file_passes_the_schema_and_docker_compose(doc, cpu, tmp_path):
    text = to_yaml(render_compose(JobSpec.model_validate(doc), cpu))
    project = yaml.safe_load(text)
    errors = [e.message for e in validator().iter_errors(project)]
    assert errors == []
    path = tmp_path / "compose.yaml"
    path.write_text(text)
    res = subprocess.run(
        [docker_compose(), "-f", str(path), "-p", "check", "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")},
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # no warnings either: no variable was left to interpolate


def test_validators_reject_what_compose_would():
    project = render_compose(JobSpec.model_validate({"image": "t:1"}))
    bad = json.loads(json.dumps(project))
    bad["services"]["ddp-train-worker-0"]["shm_sizes"] = 1
    assert list(validator().iter_errors(bad))
    bad = json.loads(json.dumps(project))
    bad["services"]["ddp-train-worker-0"]["restart"] = False  # unquoted `no` in YAML 1.1
    assert list(validator().iter_errors(bad))


def unescape(value: str) -> str:
    return value.replace("$$", "$")


@pytest.mark.parametrize("elastic", [False, True])
def test_services_are_the_pods_with_the_operators_env(elastic):
    doc: dict[str, Any] = {"name": "job", "image": "t:1", "nodes": 3, "procs": 2}
    doc["rendezvous"] = ELASTIC if elastic else {"mode": "static"}
    spec = JobSpec.model_validate(doc)
    project = yaml.safe_load(to_yaml(render_compose(spec)))
    contract = launch_contract(spec)
    names = [n.hostname for n in contract.nodes]
    expected = (
        ["job-worker-0", "job-worker-1", "job-worker-2"]
        if elastic
        else [
            "job-master-0",
            "job-worker-0",
            "job-worker-1",
        ]
    )
    assert names == expected
    assert list(project["services"]) == names
    for node, (name, svc) in zip(contract.nodes, project["services"].items(), strict=True):
        assert svc["hostname"] == name
        assert svc["labels"] == {ROLE_LABEL: "node"}
        env = {k: unescape(v) for k, v in svc["environment"].items()}
        # The cluster's hostnames, unmapped, and the pod's own env (temp files, caches).
        assert env == {**pod_only_env(spec), **contract.node_env(node)}
        assert [unescape(a) for a in svc["entrypoint"]] == contract.container_command()
        assert svc["networks"] == ["ddp"]
        assert svc["shm_size"] == 2 * 2**30
        assert "deploy" not in svc and "volumes" not in svc
        if elastic:
            assert env["PET_RDZV_ENDPOINT"] == "job-worker-0:23456"
            assert env["PET_LOCAL_ADDR"] == name  # resolves to the container itself
            assert svc["restart"] == "on-failure"
        else:
            assert env["MASTER_ADDR"] == "job-master-0"
            assert env["PET_NODE_RANK"] == str(node.rank)
            assert svc["restart"] == "no"
    assert project["networks"] == {"ddp": {"driver": "bridge"}}
    assert "volumes" not in project


@pytest.mark.parametrize(
    ("target", "names", "rdzv"),
    [
        ("trainjob", ["job-node-0-0", "job-node-0-1", "job-node-0-2"], "job-node-0-0.job"),
        ("indexed-job", ["job-0", "job-1", "job-2"], "job-0.job"),
    ],
)
def test_services_follow_the_targets_layout(target, names, rdzv):
    doc = {"name": "job", "image": "t:1", "nodes": 3, "target": target}
    spec = JobSpec.model_validate({**doc, "rendezvous": {"mode": "static"}})
    project = yaml.safe_load(to_yaml(render_compose(spec)))
    contract = launch_contract(spec)
    assert list(project["services"]) == names
    for node, (name, svc) in zip(contract.nodes, project["services"].items(), strict=True):
        assert svc["hostname"] == name
        # Peers look the node up as <host>.<subdomain>, as on the cluster.
        assert svc["networks"] == {"ddp": {"aliases": [f"{name}.job"]}}
        env = {k: unescape(v) for k, v in svc["environment"].items()}
        assert env == {**pod_only_env(spec), **contract.node_env(node)}
        assert env["PET_MASTER_ADDR"] == env["DDPDEPLOY_RDZV_HOST"] == rdzv
        assert env["PET_NODE_RANK"] == str(node.index)
    # c10d (the default): the same services meet at node 0's endpoint and restart on failure.
    spec = JobSpec.model_validate(doc)
    project = yaml.safe_load(to_yaml(render_compose(spec)))
    contract = launch_contract(spec)
    for node, svc in zip(contract.nodes, project["services"].values(), strict=True):
        env = {k: unescape(v) for k, v in svc["environment"].items()}
        assert env == {**pod_only_env(spec), **contract.node_env(node)}
        port = 29400 if target == "trainjob" else 23456
        assert env["PET_RDZV_ENDPOINT"] == f"{rdzv}:{port}" and env["PET_RDZV_BACKEND"] == "c10d"
        assert env["PET_LOCAL_ADDR"] == node.address
        assert svc["restart"] == "on-failure"


INIT = ["ddp-train-volume-init"]


def nodes(project: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in project["services"].values() if s["labels"][ROLE_LABEL] == "node"]


def test_gpus_are_reserved_unless_cpu():
    spec = JobSpec.model_validate(
        {"image": "t:1", "nodes": 2, "gpus": 8, "checkpoint": CKPT, "shmSize": "512Mi"}
    )
    gpu = render_compose(spec, cpu=False)
    assert list(gpu["services"]) == ["ddp-train-worker-0", "ddp-train-worker-1", *INIT]
    for svc in nodes(gpu):
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": 8, "capabilities": ["gpu"]}]
        assert "--backend" in svc["entrypoint"] and "nccl" in svc["entrypoint"]
        assert svc["environment"]["PET_NPROC_PER_NODE"] == "8"
        assert svc["volumes"] == [{"type": "volume", "source": "checkpoints", "target": "/ckpt"}]
        assert svc["depends_on"] == {INIT[0]: {"condition": "service_completed_successfully"}}
        assert svc["shm_size"] == 512 * 2**20
    assert gpu["volumes"] == {"checkpoints": {}}
    # The one-shot helper hands the root-owned new volume to the pod's UID and fsGroup.
    init = gpu["services"][INIT[0]]
    assert init["user"] == "0:0" and init["entrypoint"] == ["chown", "10001:10001", "/ckpt"]
    assert init["volumes"] == nodes(gpu)[0]["volumes"] and "deploy" not in init
    assert render_compose(spec) == gpu  # GPUs in the spec: --gpu is the default
    cpu = render_compose(spec, cpu=True)
    for svc in nodes(cpu):
        assert "deploy" not in svc
        assert "gloo" in svc["entrypoint"] and "nccl" not in svc["entrypoint"]
        assert svc["environment"]["PET_NPROC_PER_NODE"] == "8"  # same processes per node


def test_restart_mirrors_backoff_limit_and_dollars_are_escaped():
    doc = next(p.values[0] for p in EXTRA if p.id == "module-dollars-backoff")
    project = render_compose(JobSpec.model_validate(doc))
    svc = project["services"]["ddp-train-worker-0"]
    assert svc["restart"] == "on-failure:3"
    assert svc["environment"]["TOKEN"] == "x$$y$${z}"
    assert svc["entrypoint"][-5:] == ["-m", "pkg.train", "--lr", "$$HOME", "a b"]


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("2Gi", 2**31), ("512Mi", 2**29), ("1G", 10**9), ("1e3", 1000), ("1.5Ki", 1536), ("7", 7)],
)
def test_quantity_bytes(quantity, expected):
    assert quantity_bytes(quantity) == expected


def test_cli_stdout_out_file_and_missing_image(tmp_path):
    args = ["compose", "--image", "t:1", "--nodes", "2", "--elastic", "1:2"]
    first = run_cli(*args, cwd=tmp_path)  # two interpreters (two hash seeds): the same bytes
    assert first.returncode == 0, first.stderr
    assert run_cli(*args, cwd=tmp_path).stdout == first.stdout  # same input, same bytes
    assert list(yaml.safe_load(first.stdout)["services"]) == [
        "ddp-train-worker-0",
        "ddp-train-worker-1",
    ]
    res = run_main(*args, "--out", "c.yaml", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout == ""
    assert (tmp_path / "c.yaml").read_text() == first.stdout
    (tmp_path / "c.yaml").unlink()
    res = run_main("compose", "--out", "c.yaml", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: image: required") and res.stderr.count("\n") == 1
    res = run_main("compose", "--image", "t:1", "--out", "no/such/dir/c.yaml", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: --out: cannot write")
    assert list(tmp_path.iterdir()) == []


def test_compose_out_never_writes_over_the_spec_it_read(tmp_path):
    # Found by the third hostile pass: `init --script train.py; compose --image x:1 --out
    # ddpdeploy.yaml` exited 0 with the spec replaced by the compose file.
    assert run_main("init", "--script", "train.py", cwd=tmp_path).returncode == 0
    spec = (tmp_path / "ddpdeploy.yaml").read_bytes()
    (tmp_path / "other.yaml").write_bytes(spec)
    (tmp_path / "hard.yaml").hardlink_to(tmp_path / "other.yaml")
    for args, shown in [
        (["--out", "ddpdeploy.yaml"], "ddpdeploy.yaml is the spec file this command read"),
        (["--out", "./ddpdeploy.yaml", "--force"], "ddpdeploy.yaml is the spec file"),
        (["-f", "other.yaml", "--out", "other.yaml", "--force"], "other.yaml is the spec"),
        (["-f", "other.yaml", "--out", "hard.yaml"], "hard.yaml is the spec file this "
         "command read (other.yaml)"),
    ]:  # fmt: skip
        res = run_main("compose", "--image", "x:1", *args, cwd=tmp_path)
        assert res.returncode == 2 and res.stdout == "", res.stderr
        assert res.stderr.startswith(f"error: --out: {shown}"), res.stderr
        assert res.stderr.endswith("; name another file, e.g. --out compose.yaml\n")
        assert res.stderr.count("\n") == 1
    assert (tmp_path / "ddpdeploy.yaml").read_bytes() == spec
    assert (tmp_path / "other.yaml").read_bytes() == spec


def test_compose_out_replaces_only_a_compose_file_it_wrote_unless_forced(tmp_path):
    # Found by the third hostile pass: --out replaced any existing file without a word.
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    res = run_main("compose", "--image", "x:1", "--out", "notes.txt", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr == (
        "error: --out: notes.txt exists and is not a compose file ddpdeploy wrote; pass "
        "--force to replace it, or name another file\n"
    )
    assert notes.read_text() == "mine\n"
    forced = run_main("compose", "--image", "x:1", "--out", "notes.txt", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert notes.read_text().startswith("# Written by ddpdeploy compose;")
    # Its own earlier output is replaced as before: from --out, or saved from stdout.
    first = run_main("compose", "--image", "x:1", "--out", "c.yaml", cwd=tmp_path)
    again = run_main("compose", "--image", "x:1", "--nodes", "3", "--out", "c.yaml", cwd=tmp_path)
    assert first.returncode == again.returncode == 0, again.stderr
    assert len(yaml.safe_load((tmp_path / "c.yaml").read_text())["services"]) == 3
    saved = run_main("compose", "--image", "x:1", cwd=tmp_path).stdout
    (tmp_path / "s.yaml").write_text(saved)
    res = run_main("compose", "--image", "x:1", "--nodes", "2", "--out", "s.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert len(yaml.safe_load((tmp_path / "s.yaml").read_text())["services"]) == 2


def test_no_engine_is_one_line_pointing_to_local(tmp_path, monkeypatch):
    from ddpdeploy.errors import OperationError
    from ddpdeploy.smoke.composerun import engine

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(OperationError) as info:
        engine()
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == 1
    assert message.startswith("cannot reach the Docker engine") and "smoke --local" in message


def pod_container(spec: JobSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rendered PyTorchJob's master pod spec and its training container."""
    from ddpdeploy.targets import render_objects

    (job,) = [o for o in render_objects(spec) if o["kind"] == "PyTorchJob"]
    (replica,) = job["spec"]["pytorchReplicaSpecs"].values()  # c10d: the Workers alone
    pod = replica["template"]["spec"]
    return pod, pod["containers"][0]


@pytest.mark.parametrize("writable", [False, True])
def test_every_node_runs_with_the_pods_security_settings(writable):
    doc: dict[str, Any] = {"image": "t:1", "nodes": 2, "checkpoint": CKPT}
    if writable:
        doc["security"] = {"readOnlyRootFilesystem": False}
    spec = JobSpec.model_validate(doc)
    pod, container = pod_container(spec)
    sec, ctx = pod["securityContext"], container["securityContext"]
    emptydirs = sorted(
        m["mountPath"]
        for m in container["volumeMounts"]
        for v in pod["volumes"]
        if v["name"] == m["name"] and "emptyDir" in v and m["mountPath"] != "/dev/shm"
    )
    for svc in nodes(render_compose(spec)):
        assert svc["user"] == f"{sec['runAsUser']}:{sec['runAsGroup']}" == "10001:10001"
        assert "group_add" not in svc  # fsGroup is the primary group already
        assert ctx["capabilities"] == {"drop": svc["cap_drop"]} and svc["cap_drop"] == ["ALL"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert svc["security_opt"] == ["no-new-privileges:true"]
        assert svc.get("read_only", False) is ctx["readOnlyRootFilesystem"] is (not writable)
        tmpfs = sorted(t.split(":")[0] for t in svc.get("tmpfs", []))
        logs = ["/var/log/torchrun"]  # torchrun's tee copies: on every pod
        assert tmpfs == emptydirs == (logs if writable else ["/home/ddp", "/tmp", *logs])
        # The pod's env where its emptyDirs are, the checkpoint mount, and the image's WORKDIR.
        pod_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        for name in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "DDPDEPLOY_CHECKPOINT_DIR"):
            assert svc["environment"].get(name) == pod_env.get(name)
        assert svc["environment"]["DDPDEPLOY_CHECKPOINT_DIR"] == "/ckpt"
        assert "working_dir" not in svc and "workingDir" not in container


def test_other_ids_fsgroup_rdma_and_secret_env():
    doc = next(p.values[0] for p in EXTRA if p.id == "writable-rootfs-secret-rdma")
    project = render_compose(JobSpec.model_validate(doc))
    for svc in nodes(project):
        assert svc["user"] == "1234:10001" and svc["group_add"] == ["2000"]
        assert svc["cap_add"] == ["IPC_LOCK"]  # as the pod's, for RDMA
        # By name only: compose takes the value from the environment it runs in.
        assert "HF_TOKEN" in svc["environment"] and svc["environment"]["HF_TOKEN"] is None
    assert project["services"][INIT[0]]["entrypoint"] == ["chown", "1234:2000", "/ckpt"]


def test_secret_env_is_passed_by_name_and_said_so(tmp_path):
    (tmp_path / "ddpdeploy.yaml").write_text(
        "image: t:1\nsecretEnv: {HF_TOKEN: {secret: hf, key: token}}\n"
    )
    res = run_main("compose", cwd=tmp_path, env={"HF_TOKEN": "s3cret"})
    assert res.returncode == 0, res.stderr
    assert res.stderr == (
        "compose: secretEnv HF_TOKEN: not read from Kubernetes Secrets here; compose passes "
        "each from the environment `docker compose up` runs in\n"
    )
    assert "s3cret" not in res.stdout  # never written into the file
    env = yaml.safe_load(res.stdout)["services"]["ddp-train-worker-0"]["environment"]
    assert "HF_TOKEN" in env and env["HF_TOKEN"] is None
    (tmp_path / "plain").mkdir()
    assert run_main("compose", "--image", "t:1", cwd=tmp_path / "plain").stderr == ""


def test_secret_env_note_for_a_run_says_what_is_set_here():
    from ddpdeploy.smoke.compose import secret_env_note

    refs = {n: {"secret": "s", "key": "k"} for n in ("B_KEY", "A_TOKEN")}
    spec = JobSpec.model_validate({"secretEnv": refs})
    assert secret_env_note(spec, {"A_TOKEN": "x"}) == (
        "secretEnv A_TOKEN, B_KEY: not read from Kubernetes Secrets here; passed from this "
        "environment, where B_KEY is not set"
    )
    assert secret_env_note(spec, {"A_TOKEN": "x", "B_KEY": "y"}).endswith(
        "passed from this environment"
    )
    assert secret_env_note(JobSpec.model_validate({}), {}) is None
