"""torchrun's tee copies of every worker's output are bounded (issue 24 §6): they go to a
volume of their own on every pod (PET_LOG_DIR), an emptyDir with a sizeLimit (logSize,
default 4Gi; past it the kubelet evicts the pod instead of the node's disk filling up over
a chatty job of days), whatever the root file system; the job's /tmp stays its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from k8s_schema import trainjob_pod_template
from pydantic import ValidationError

from ddpdeploy.rules import TARGET_NAMES
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import render_objects

LOG_DIR = "/var/log/torchrun"


def pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = JobSpec.model_validate({"image": "r.invalid/t:1", "nodes": 2, **doc})
    out = []
    for obj in render_objects(spec):
        if obj["kind"] == "PyTorchJob":
            out += [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
        elif obj["kind"] == "Job":
            out.append(obj["spec"]["template"])
        elif obj["kind"] == "TrainJob":
            template = trainjob_pod_template(obj)["template"]
            env = obj["spec"]["trainer"]["env"]  # the container's env is the trainer's
            template["spec"]["containers"][0].setdefault("env", env)
            out.append(template)
    assert out
    return [p["spec"] for p in out]


def log_volume(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == LOG_DIR)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    return volume, env


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("writable", [False, True])
def test_every_pod_bounds_torchruns_log_copies(target, writable):
    doc: dict[str, Any] = {"target": target}
    if writable:
        doc["security"] = {"readOnlyRootFilesystem": False}
    for pod in pod_specs(doc):
        volume, env = log_volume(pod)
        assert volume["emptyDir"] == {"sizeLimit": "4Gi"}
        assert env["PET_LOG_DIR"] == LOG_DIR
        # The job's /tmp is not bounded by it (caches, its own temp files).
        tmp = [v for v in pod["volumes"] if v["name"] == "tmp"]
        assert tmp == ([] if writable else [{"name": "tmp", "emptyDir": {}}])


def test_log_size_sets_the_bound_and_null_lifts_it():
    (pod, *_) = pod_specs({"logSize": "16Gi"})
    assert log_volume(pod)[0]["emptyDir"] == {"sizeLimit": "16Gi"}
    (pod, *_) = pod_specs({"logSize": None})
    assert log_volume(pod)[0]["emptyDir"] == {}
    with pytest.raises(ValidationError, match="give a unit"):
        JobSpec.model_validate({"logSize": 4})


def test_a_checkpoint_mount_there_is_refused():
    with pytest.raises(ValidationError, match="where torchrun's log volume mounts"):
        JobSpec.model_validate({"checkpoint": {"size": "1Gi", "mountPath": LOG_DIR}})


@pytest.mark.slow
def test_torchrun_writes_its_tee_copies_under_pet_log_dir(tmp_path: Path):
    pytest.importorskip("torch")
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from', os.environ['RANK'], flush=True)\n")
    logs = tmp_path / "logs"
    env = {
        **os.environ,
        "PET_TEE": "3",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:",
        "PET_LOG_DIR": str(logs),
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "0",
        "TMPDIR": str(tmp_path / "tmp"),
    }
    (tmp_path / "tmp").mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "[rank0]:hello from 0" in res.stdout and "[rank1]:hello from 1" in res.stdout
    copies = sorted(p.name for p in logs.rglob("stdout.log"))
    assert copies == ["stdout.log", "stdout.log"]
    assert not list((tmp_path / "tmp").glob("torchelastic_*"))  # nothing left to /tmp
