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
HASH = re.compile(r"^weights_sha256  ([0-9a-f]{64})$", re.M)
JOB = ["--nodes", "2", "--procs", "2", "--steps", "12"]


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


def test_builds_the_workspace_and_trains_like_local(
    torch_image: str,
    engine: Any,
    cli: Callable[..., Any],
    tmp_path: Path,
    cleanup_images: list[str],
) -> None:
    job = f"sdok{os.getpid()}"
    cleanup_images.append(f"ddpdeploy-smoke/{job}")
    (tmp_path / "README.md").write_text("built-in trainer\n")
    res = cli("smoke", "--docker", "--name", job, "--base-image", torch_image, *JOB, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    docker_hash = HASH.search(res.stdout)
    assert docker_hash is not None, res.stdout
    assert "gloo in docker-compose" in res.stderr
    assert left_behind(engine, job) == []
    local = cli("smoke", "--local", "--name", job, *JOB, cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    assert docker_hash[1] == HASH.search(local.stdout)[1]  # type: ignore[index]


@pytest.fixture(scope="module")
def image(trainer_image: str) -> str:
    return trainer_image


def test_failure_names_the_node_and_leaves_nothing(
    image: str, engine: Any, cli: Callable[..., Any], tmp_path: Path
) -> None:
    job = f"sdfail{os.getpid()}"
    res = cli(
        "smoke", "--docker", "--name", job, "--image", image, *JOB, "--", "--no-such-flag",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 1
    assert f"error: node {job}-" in res.stderr
    assert "unrecognized arguments: --no-such-flag" in res.stderr
    assert left_behind(engine, job) == []


def test_ctrl_c_mid_run_leaves_nothing(image: str, engine: Any, tmp_path: Path) -> None:
    job = f"sdint{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdeploy", "smoke", "--docker", "--name", job, "--image", image,
         "--nodes", "2", "--procs", "2", "--steps", "100000"],
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
def test_own_script_runs_in_its_image_and_failures_name_the_rank(
    torch_image: str,
    engine: Any,
    cli: Callable[..., Any],
    tmp_path: Path,
    cleanup_images: list[str],
) -> None:
    """The workspace's scripts, built into an image: a positional-argument script is green
    with every rank's output prefixed; one that exits 3 on rank 2 is named as the cause."""
    job = f"sdscr{os.getpid()}"
    cleanup_images.append(f"ddpdeploy-smoke/{job}")
    ws = tmp_path / "ws"
    shutil.copytree(SCRIPTS, ws)
    (ws / "ok.yaml").write_text(
        f"name: {job}\nnodes: 2\nprocs: 2\ncommand: {{script: positional.py}}\n"
    )
    base = ["smoke", "--docker", "--base-image", torch_image]
    res = cli(*base, "-f", "ok.yaml", "--ranks", "all", "--", "2", "hi", cwd=ws)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in range(4):
        assert re.search(rf"^\[rank{rank}\] hi epoch 1 sum 10 from rank {rank}$", res.stderr, re.M)
    codes = re.findall(r"^exit code +(\d+)  (\S+)$", res.stdout, re.M)
    assert codes == [("0", f"{job}-worker-0"), ("0", f"{job}-worker-1")], res.stdout
    assert left_behind(engine, job) == []
    (ws / "fail.yaml").write_text(
        f"name: {job}\nnodes: 2\nprocs: 2\ncommand: {{script: exit3_on_rank2.py}}\n"
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
def test_every_rank_is_told_the_checkpoint_mount_and_can_write_there(
    scripts_image: str, engine: Any, cli: Callable[..., Any], tmp_path: Path
) -> None:
    job = f"sdenv{os.getpid()}"
    spec = (
        f"name: {job}\nnodes: 2\nprocs: 2\ncheckpoint: {{size: 1Gi, mountPath: /ck}}\n"
        "command: {script: checkpoint_env.py}\n"
    )
    res = in_image(cli, scripts_image, tmp_path, spec, "--ranks", "all")
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in range(4):  # as the pod's UID, on the volume the volume-init handed to it
        line = rf"^\[rank{rank}\] rank {rank} checkpoint dir /ck writable True$"
        assert re.search(line, res.stderr, re.M), res.stderr[-3000:]
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


@pytest.mark.slow
def test_a_module_entry_and_a_stderr_only_script_are_green_and_shown(
    scripts_image: str, engine: Any, cli: Callable[..., Any], tmp_path: Path
) -> None:
    """`-m package.module` and a script that prints only to stderr, in the image as in the
    pod: green, every rank's lines shown with their rank."""
    job = f"sdmod{os.getpid()}"
    spec = f"name: {job}\nnodes: 2\ncommand: {{module: pkg.train}}\n"
    res = in_image(cli, scripts_image, tmp_path, spec, "--ranks", "all")
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(r"^\[rank1\] module entry on rank 1 of 2$", res.stderr, re.M), res.stderr
    spec = f"name: {job}\nnodes: 2\ncommand: {{script: stderr_only.py}}\n"
    res = in_image(cli, scripts_image, tmp_path, spec, "--ranks", "all")
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        assert re.search(rf"^\[rank{rank}\] stderr line from rank {rank}$", res.stderr, re.M)
    assert left_behind(engine, job) == []
