"""`ddpdeploy smoke --docker` as users run it: the CLI and a real engine."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpdeploy.smoke.composerun import PROJECT_LABEL

pytestmark = pytest.mark.docker

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def left_behind(engine: Any, job: str) -> list[str]:
    """Containers, networks and volumes of any compose project of ``job``'s smoke runs."""
    prefix = f"ddpdeploy-{job}-"

    def ours(labels: dict[str, str] | None) -> bool:
        return (labels or {}).get(PROJECT_LABEL, "").startswith(prefix)

    return (
        [c.name for c in engine.containers.list(all=True) if ours(c.labels)]
        + [n.name for n in engine.networks.list() if ours(n.attrs.get("Labels"))]
        + [v.name for v in engine.volumes.list() if ours(v.attrs.get("Labels"))]
    )


def test_ctrl_c_mid_run_leaves_nothing(scripts_image: str, engine: Any, tmp_path: Path) -> None:
    job = f"sdint{os.getpid()}"
    # The built-in trainer (in every image `ddpdeploy build` makes), started and interrupted.
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdeploy", "smoke", "--docker", "--name", job,
         "--image", scripts_image, "--nodes", "2", "--procs", "1", "--steps", "100000",
         "--", "--no-probe"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        assert proc.stderr is not None
        for line in proc.stderr:
            if '"event": "start"' in line:
                break
            assert time.monotonic() < deadline, "training did not start"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert left_behind(engine, job) == []


def test_no_engine_is_one_line_pointing_to_local(cli: Callable[..., Any], tmp_path: Path) -> None:
    dead = f"unix://{tmp_path}/dead.sock"
    res = cli("smoke", "--docker", "--image", "t:1", env={"DOCKER_HOST": dead}, cwd=tmp_path)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("error: cannot reach the Docker engine") and "--local" in lines[-1]
    assert [ln for ln in lines if ln.startswith("error")] == [lines[-1]]


@pytest.mark.slow
def test_own_code_runs_in_its_image_and_failures_name_the_rank(
    torch_image: str,
    engine: Any,
    cli: Callable[..., Any],
    tmp_path: Path,
    cleanup_images: list[str],
) -> None:
    """The workspace's code, built into an image by smoke itself: a module entry
    (`-m pkg.train`, found from the image's working directory as in the pod) is green with
    every rank's output prefixed; a script that exits 3 on rank 2 is named as the cause."""
    job = f"sdscr{os.getpid()}"
    cleanup_images.append(f"ddpdeploy-smoke/{job}")
    ws = tmp_path / "ws"
    shutil.copytree(SCRIPTS, ws)
    (ws / "ok.yaml").write_text(
        f"name: {job}\nnodes: 2\nprocs: 2\ncommand: {{module: pkg.train}}\n"
    )
    base = ["smoke", "--docker", "--base-image", torch_image]
    res = cli(*base, "-f", "ok.yaml", "--ranks", "all", cwd=ws)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "world size 4, gloo in docker-compose" in res.stderr
    for rank in range(4):
        line = rf"^\[rank{rank}\] module entry on rank {rank} of 4$"
        assert re.search(line, res.stderr, re.M), res.stderr[-3000:]
    codes = re.findall(r"^exit code +(\d+)  (\S+)$", res.stdout, re.M)
    assert codes == [("0", f"{job}-worker-0"), ("0", f"{job}-worker-1")], res.stdout
    assert left_behind(engine, job) == []
    # With a checkpoint volume (and its helper), which the failed run's teardown removes too.
    (ws / "fail.yaml").write_text(
        f"name: {job}\nnodes: 2\nprocs: 2\ncheckpoint: {{size: 1Gi}}\n"
        "command: {script: exit3_on_rank2.py}\n"
    )
    res = cli(*base, "-f", "fail.yaml", cwd=ws)
    assert res.returncode == 1, res.stderr[-3000:]
    error = res.stderr[res.stderr.index("error: ") :]
    # c10d (the default) gives node ranks in the order nodes join: either may hold rank 2.
    assert re.match(
        rf"error: node {job}-worker-[01] \(global rank 2\) exited with code 3;", error
    ), error
    assert "rank two: giving up with code 3" in error
    assert left_behind(engine, job) == []


@pytest.fixture(scope="module")
def scripts_image(
    torch_image: str,
    cli: Callable[..., Any],
    tmp_path_factory: pytest.TempPathFactory,
    cleanup_images: list[str],
) -> str:
    """tests/scripts built into one image (`ddpdeploy build`), removed at the module's end."""
    repo = f"ddpdeploy-test/scripts-{os.getpid()}"
    cleanup_images.append(repo)
    ws = tmp_path_factory.mktemp("scripts") / "ws"
    shutil.copytree(SCRIPTS, ws)
    res = cli(
        "build", "-w", str(ws), "--image", repo, "--base-image", torch_image, "--network", "none"
    )
    assert res.returncode == 0, res.stderr
    return str(res.stdout.strip())


def in_image(cli: Callable[..., Any], image: str, tmp_path: Path, spec: str, *args: str) -> Any:
    (tmp_path / "job.yaml").write_text(spec)
    return cli("smoke", "--docker", "-f", "job.yaml", "--image", image, *args, cwd=tmp_path)


@pytest.mark.slow
def test_a_relative_write_is_refused_as_the_pod_would_unless_writable_rootfs(
    scripts_image: str, engine: Any, cli: Callable[..., Any], tmp_path: Path
) -> None:
    job = f"sdro{os.getpid()}"
    spec = f"name: {job}\nnodes: 1\nprocs: 2\ncommand: {{script: relative_write.py}}\n"
    res = in_image(cli, scripts_image, tmp_path, spec)
    assert res.returncode == 1, res.stderr[-3000:]
    error = re.search(r"^error: .*$", res.stderr, re.M)
    assert error is not None and error[0] == (
        f"error: node {job}-worker-0 (global rank 0) exited with code 1: it "
        'wrote a file (/workspace/relative_write.py line 10: torch.save({"w": torch.ones(2)}, '
        '"snapshot.pt")) on the read-only root file system, as the pod would refuse it; write '
        "under $DDPDEPLOY_CHECKPOINT_DIR (or /tmp), or pass --writable-rootfs. Its last lines:"
    ), res.stderr[-3000:]
    assert left_behind(engine, job) == []
    loose = in_image(cli, scripts_image, tmp_path, spec, "--writable-rootfs")
    assert loose.returncode == 0, loose.stderr[-3000:]
    assert re.search(r"^snapshot saved$", loose.stderr, re.M)
    assert left_behind(engine, job) == []


@pytest.mark.slow
def test_a_helper_script_killed_at_a_step_resumes_to_the_clean_weights(
    scripts_image: str, engine: Any, cli: Callable[..., Any], tmp_path: Path
) -> None:
    job = f"sdkill{os.getpid()}"
    spec = (
        f"name: {job}\nnodes: 2\ncheckpoint: {{size: 1Gi}}\n"
        "command: {script: helpers_resume.py}\n"
    )
    res = in_image(cli, scripts_image, tmp_path, spec, "--kill-at", "7")
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(
        rf"^killed +local rank 0 \(pid \d+\) of {job}-worker-[01] at step \d+$", res.stdout, re.M
    ), res.stdout
    assert re.search(r"^clean run +[0-9a-f]{64} \(same\)$", res.stdout, re.M), res.stdout
    assert '"resumed": true' in res.stderr
    assert left_behind(engine, job) == []
