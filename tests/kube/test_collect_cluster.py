"""`collect --from cluster` against a real kube-apiserver: the helper pod it creates is the
pod renderer's hardened one, the apiserver accepts it, and it is gone afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from actors import res

from ddpdeploy.collect.pod import collect_helper_pod
from ddpdeploy.spec import JobSpec

pytestmark = pytest.mark.slow  # a real kube-apiserver

IMAGE = "registry.invalid/train:v1"
ROOT = Path(__file__).resolve().parents[2]


def test_the_apiserver_accepts_the_helper_pod(admin, namespace):
    spec = JobSpec.model_validate(
        {"name": "j", "namespace": namespace, "image": IMAGE, "checkpoint": {"size": "1Gi"}}
    )
    body = collect_helper_pod(spec)
    created = res(admin, "v1", "Pod").create(namespace=namespace, body=body).to_dict()
    pod = created["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    box = pod["containers"][0]
    assert box["securityContext"]["readOnlyRootFilesystem"] is True
    assert box["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert box["resources"]["limits"]["memory"] == "256Mi"
    # No token volume was injected: the service account admission honours the opt-out.
    assert [v["name"] for v in pod["volumes"]] == ["checkpoints"]


def test_collect_creates_the_rendered_helper_pod_and_removes_it(
    kube_cli, admin, namespace, tmp_path
):
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")
    up = kube_cli(
        "up", "--image", IMAGE, "--name", "j", "-n", namespace, "-f", str(spec), "--no-wait"
    )
    assert up.returncode == 0, up.stderr
    env = kube_cli.keywords["env"]
    dest = tmp_path / "out"
    args = ["collect", "j", "--from", "cluster", "--to", str(dest), "-n", namespace]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdeploy", *args, "--timeout", "8"],
        cwd=ROOT,
        env={**os.environ, **env},
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = None
    deadline = time.monotonic() + 30
    while seen is None and proc.poll() is None and time.monotonic() < deadline:
        items = res(admin, "v1", "Pod").get(namespace=namespace).to_dict()["items"]
        seen = next((p for p in items if p["metadata"]["name"] == "j-collect"), None)
        time.sleep(0.2)
    _, stderr = proc.communicate(timeout=60)
    assert seen is not None, stderr
    box = seen["spec"]["containers"][0]
    assert box["image"] == IMAGE  # the job's own image
    assert box["securityContext"]["runAsNonRoot"] is True
    assert seen["spec"]["automountServiceAccountToken"] is False
    assert proc.returncode == 1 and "helper pod j-collect" in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert res(admin, "v1", "Pod").get(namespace=namespace).to_dict()["items"] == []
    assert not dest.exists()
