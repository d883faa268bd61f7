"""Restarts on real pods (issue 23 §2e), a user's own scripts (§2b), with `status`, `logs -f`
and `collect` during such a run (§2c, §2d) and the static job's env (§2h).

Four jobs of 2 nodes x 1 process, each killed three times while it trains: the worker
process inside a running container (`kubectl exec` + SIGKILL: torchrun sees its worker
die), the training container of the other pod (SIGKILL to its PID 1 through Docker: the
kubelet starts it again), then a pod deleted through the API (the stand-in operator makes
it again). The built-in trainer and the tutorial-style script
(tests/e2e/scripts/plain_ddp.py), each under c10d (the default) and static rendezvous.
Beside them, the ddpkit script (tests/e2e/scripts/ddpkit_train.py, 2 x 2) runs clean. Two
jobs run at a time (c10d and static of one script; the ddpkit one beside the first two), so
every time here is one under that load and the other engineers' on the machine. Every
trial's time from the kill to the first training step of the run that started after it is
measured (the kubelet's timestamps on the log lines), printed, and written to
$DDPDEPLOY_E2E_RESTARTS (JSON) when that is set: docs/benchmarks.md keeps the table.

A job that resumes ends with the weights of a run that was never killed (`smoke --local` of
the same training): for the plain script that is also §2b's check. On this cluster static
rendezvous has no in-place restart (torchrun's maxRestarts is c10d's; a static job restarts
through its containers, whose fresh agents make a fresh store), so the plain script is not
expected to fail there: what it does is recorded, and that it never ends Succeeded with
other weights is asserted.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from e2ejob import (
    BUILTIN,
    DDPKIT,
    PLAIN,
    Breaker,
    Trial,
    apis,
    assert_env_of_the_launch_contract,
    cli_process,
    done_event,
    job_condition,
    slowed,
    wait_for,
    write_spec,
)
from realcluster import Cluster, fresh_namespace

# The restart jobs are 2 nodes x 1 process (four jobs of 2 x 2, each restarting twice a
# minute, keep a shared 2-core node too busy to time anything): clean runs of their own.
BUILTIN_2X1 = {**BUILTIN, "procs": 1}
PLAIN_2X1 = slowed({**PLAIN, "procs": 1}, "--batch-size", "32")  # 8 steps an epoch, 48 in all
# Slower steps (so that kills land mid-run), a straggler and frequent `ranks` events for
# `status`: timing only, the weights stay those of the clean run.
BUILTIN_SLOW = slowed(
    BUILTIN_2X1, "--debug-step-delay", "0.5", "--debug-slow-rank", "1:0.05", "--ranks-every", "5"
)
PLAIN_SLOW = slowed(PLAIN_2X1, "--step-delay", "0.5")
KILLS = ("worker process", "container", "pod")
RECOVERY_WAIT = 150.0  # seconds a trial waits for the next step


@dataclass
class RestartRun:
    script: str
    mode: str
    name: str
    namespace: str = ""
    trials: list[Trial] = field(default_factory=list)
    condition: str | None = None
    done: dict[str, Any] | None = None
    restarts: dict[str, int] = field(default_factory=dict)  # pod -> container restarts
    status: Any = None  # `status` during the run
    follow: tuple[int, str, str] | None = None  # `logs -f`: exit code, stdout, stderr
    collect: Any = None  # `collect --from cluster` during the run
    collected: dict[str, bool] = field(default_factory=dict)  # file -> same bytes as the PV
    env_pods: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


def _nodes(name: str, mode: str) -> tuple[str, str]:
    """The pods of node 0 and node 1."""
    if mode == "static":
        return f"{name}-master-0", f"{name}-worker-0"
    return f"{name}-worker-0", f"{name}-worker-1"


def _run(
    cluster: Cluster,
    e2e_cli: Any,
    image: str,
    folder: Path,
    script: str,
    mode: str,
    ns: str,
) -> RestartRun:
    name = f"rs-{script}-{mode}"
    run = RestartRun(script, mode, name, ns)
    base = BUILTIN_SLOW if script == "builtin" else PLAIN_SLOW
    rendezvous = {"mode": mode} | ({"maxRestarts": 10} if mode == "c10d" else {})
    spec = {**base, "name": name, "image": image, "rendezvous": rendezvous}
    spec_file = write_spec(folder / name, spec)
    core, custom = apis(cluster)
    start = time.monotonic()
    up = e2e_cli("up", "-f", str(spec_file), "-n", ns, "--no-wait")
    assert up.returncode == 0, up.stderr
    watched = script == "builtin" and mode == "c10d"
    follow = None
    if watched:  # `logs -f` from the start, through every restart, to the job's end
        follow = cli_process(cluster.env, "logs", name, "-n", ns, "-f", cwd=folder)
    breaker = Breaker(cluster, ns, name, mode, script)
    status = None
    try:
        breaker.wait_steps(8, since=0, timeout=300)  # a `ranks` event (every 5) is out
        # Past the plain script's first snapshot (saved after step 8, its first epoch): a
        # kill just after step 8 on a loaded node came before it, and the run started over.
        wait_for(f"a step of {name} past 8", lambda: breaker.last_step() > 8, 300)
        if watched:  # beside the first kill: it takes a while to start on a loaded node
            status = cli_process(cluster.env, "status", name, "-n", ns, cwd=folder)
        node0, node1 = _nodes(name, mode)
        for kind, pod in zip(KILLS, (node1, node0, node1), strict=True):
            trial = breaker.trial(kind, pod, RECOVERY_WAIT)
            print(f"{name}: {kind} of {pod} at step {trial.killed_at_step}: "
                  f"{trial.seconds if trial.seconds is not None else trial.note}")  # fmt: skip
            if trial.seconds is None:
                break
            breaker.wait_steps(2, since=time.time() - 0.1, timeout=120)
        run.trials = breaker.trials
        if watched:
            run.collect = e2e_cli(
                "collect", name, "-n", ns, "--from", "cluster", "--to", str(folder / "out")
            )
            run.collected = _same_as_volume(cluster, ns, name, folder / "out")
        run.condition = wait_for(
            f"{name} to end", lambda: job_condition(custom, ns, name), 300, every=1
        )
    except AssertionError as exc:
        run.trials = breaker.trials
        run.error = str(exc)
    run.seconds = time.monotonic() - start
    if status is not None:
        out, err = status.communicate(timeout=120)
        run.status = (status.returncode, out, err)
    run.done = done_event(core, ns, name)
    for pod in core.list_namespaced_pod(ns).items:
        statuses = pod.status.container_statuses or []
        run.restarts[pod.metadata.name] = sum(s.restart_count for s in statuses)
    if follow is not None:
        try:
            out, err = follow.communicate(timeout=90)
        except Exception:
            follow.kill()
            out, err = follow.communicate()
        run.follow = (follow.returncode, out, err)
    if mode == "static" and script == "builtin":
        with contextlib.suppress(AssertionError):
            run.env_pods = assert_env_of_the_launch_contract(cluster, ns, name)
    return run


def _same_as_volume(cluster: Cluster, ns: str, name: str, out: Path) -> dict[str, bool]:
    """Each collected file against the one on the local volume (when it is still there:
    the trainer keeps its newest three)."""
    if cluster.state is None or not out.is_dir():
        return {}
    core, _ = apis(cluster)
    pvc = core.read_namespaced_persistent_volume_claim(f"{name}-checkpoints", ns)
    folder = Path(core.read_persistent_volume(pvc.spec.volume_name).spec.local.path)
    return {
        f.name: f.read_bytes() == (folder / f.name).read_bytes()
        for f in out.iterdir()
        if f.name.startswith("ckpt-") and (folder / f.name).exists()
    }


def _clean(cluster: Cluster, e2e_cli: Any, image: str, folder: Path, ns: str) -> RestartRun:
    """The ddpkit script, run clean (§2b)."""
    name = "rs-ddpkit"
    run = RestartRun("ddpkit", "c10d", name, ns)
    spec_file = write_spec(folder / name, {**DDPKIT, "name": name, "image": image, "cpu": "100m"})
    start = time.monotonic()
    up = e2e_cli("up", "-f", str(spec_file), "-n", ns, "--wait", "--timeout", "10m")
    run.seconds = time.monotonic() - start
    run.condition = "Succeeded" if up.returncode == 0 else up.stderr[-2000:]
    core, _ = apis(cluster)
    run.done = done_event(core, ns, name)
    run.status = up
    return run


@pytest.fixture(scope="module")
def runs(
    cluster: Cluster,
    trainer_image: str,
    e2e_cli: Any,
    clean_weights: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[tuple[str, str], RestartRun]]:
    for spec in (BUILTIN_2X1, PLAIN_2X1, DDPKIT):
        clean_weights.start(spec)  # smoke --local beside the cluster jobs
    folder = tmp_path_factory.mktemp("restarts")
    out: dict[tuple[str, str], RestartRun] = {}
    with contextlib.ExitStack() as stack, concurrent.futures.ThreadPoolExecutor(3) as pool:
        # Two at a time (c10d and static of one script), the ddpkit script beside the first.
        for script in ("builtin", "plain"):
            futures = {}
            for mode in ("c10d", "static"):
                ns = stack.enter_context(fresh_namespace(cluster))
                futures[(script, mode)] = pool.submit(
                    _run, cluster, e2e_cli, trainer_image, folder, script, mode, ns
                )
            if script == "builtin":
                ns = stack.enter_context(fresh_namespace(cluster))
                futures[("ddpkit", "c10d")] = pool.submit(
                    _clean, cluster, e2e_cli, trainer_image, folder, ns
                )
            for key, future in futures.items():
                out[key] = future.result()
        rows = [
            t.row() | {"job_seconds": round(r.seconds, 1)} for r in out.values() for t in r.trials
        ]
        print("\nkill -> next training step:")
        for row in rows:
            print(json.dumps(row))
        if os.environ.get("DDPDEPLOY_E2E_RESTARTS"):
            Path(os.environ["DDPDEPLOY_E2E_RESTARTS"]).write_text(json.dumps(rows, indent=1))
        yield out


def _explain(run: RestartRun) -> str:
    trials = "; ".join(f"{t.kind}: {t.seconds or t.note}" for t in run.trials)
    return f"{run.name}: {run.condition} {run.error} trials [{trials}] restarts {run.restarts}"


@pytest.mark.parametrize("script", ["builtin", "plain"])
def test_c10d_resumes_after_every_kill_with_the_clean_runs_weights(
    runs: dict[tuple[str, str], RestartRun], clean_weights: Any, script: str
) -> None:
    run = runs[(script, "c10d")]
    assert [t.kind for t in run.trials] == list(KILLS), _explain(run)
    assert all(t.seconds is not None for t in run.trials), _explain(run)
    assert run.condition == "Succeeded", _explain(run)
    assert run.done is not None
    assert run.done["weights_sha256"] == clean_weights(
        BUILTIN_2X1 if script == "builtin" else PLAIN_2X1
    )
    # Each run resumed from a checkpoint, not from the start.
    assert all((t.resumed_from or 0) > 0 for t in run.trials), _explain(run)


def test_static_resumes_the_builtin_trainer_through_container_restarts(
    runs: dict[tuple[str, str], RestartRun], clean_weights: Any
) -> None:
    """Static has no in-place restart: a killed worker ends its torchrun, the kubelet starts
    the container again, the other pod's agent fails and restarts too; the built-in
    trainer (ddpkit's init_process_group) resumes every time."""
    run = runs[("builtin", "static")]
    assert all(t.seconds is not None for t in run.trials) and len(run.trials) == 3, _explain(run)
    assert run.condition == "Succeeded", _explain(run)
    assert run.done is not None and run.done["weights_sha256"] == clean_weights(BUILTIN_2X1)


def test_static_never_ends_a_plain_script_with_other_weights(
    runs: dict[tuple[str, str], RestartRun], clean_weights: Any
) -> None:
    """What static does to the plain script is recorded (the table); whatever it is, it
    does not end Succeeded with weights a clean run would not have."""
    run = runs[("plain", "static")]
    print(_explain(run))
    if run.condition == "Succeeded" and run.done is not None:
        assert run.done["weights_sha256"] == clean_weights(PLAIN_2X1), _explain(run)


def test_status_during_the_run_reads_the_real_pods(
    runs: dict[tuple[str, str], RestartRun],
) -> None:
    """§2c: step and ETA, the probe, the ranks event with the straggler (rank 1 sleeps in
    its data loading), from rank 0's log through the real kubelet, wherever rank 0 is."""
    status = runs[("builtin", "c10d")].status
    assert status is not None
    code, out, err = status
    assert code == 0, err
    lines = out.splitlines()
    (training,) = [ln for ln in lines if ln.startswith("training: step ")]
    assert "/60" in training and "ETA" in training, out
    assert any(ln.startswith("probe: ") and "world 2" in ln for ln in lines), out
    (ranks,) = [ln for ln in lines if ln.startswith("ranks: ")]
    assert "straggler: rank 1" in ranks, out


def test_logs_follow_merges_every_rank_across_restarts(
    runs: dict[tuple[str, str], RestartRun],
) -> None:
    """§2c: `logs -f` through the real kubelet: every rank's lines, prefixed with rank and
    node, the restarted container and the replaced pod followed (one line each on stderr),
    and it ends by itself when the job has."""
    run = runs[("builtin", "c10d")]
    assert run.follow is not None
    code, out, err = run.follow
    assert code == 0, err[-2000:]
    for rank in range(2):
        assert f"[rank{rank} node" in out, f"rank {rank} missing"
    assert "container restarted" in err and "following the new one" in err, err
    assert "replaced (a new pod); following it" in err, err
    assert '"event": "done"' in out


def test_collect_during_the_run_finds_the_checkpoints(
    runs: dict[tuple[str, str], RestartRun],
) -> None:
    """§2d: `collect --from cluster` while the c10d job runs reads the volume through a
    running pod of the job (rank 0 is on one of them, any will do: they share the volume),
    byte for byte what the trainer wrote."""
    run = runs[("builtin", "c10d")]
    assert run.collect is not None and run.collect.returncode == 0, run.collect
    said = run.collect.stdout + run.collect.stderr
    assert f"from pod {run.name}-worker-" in said, said
    assert all(run.collected.values()), run.collected


def test_the_static_jobs_pods_get_the_env_of_the_launch_contract(
    runs: dict[tuple[str, str], RestartRun],
) -> None:
    """§2h for static: MASTER_ADDR/PORT, WORLD_SIZE, RANK, PET_NODE_RANK and PET_NNODES from
    the operator (Master + Worker), as the launch contract says; the c10d job's is checked
    in test_pytorchjob.py."""
    run = runs[("builtin", "static")]
    assert run.env_pods == [f"{run.name}-master-0", f"{run.name}-worker-0"], _explain(run)


def test_a_ddpkit_script_succeeds_with_the_weights_of_smoke_local(
    runs: dict[tuple[str, str], RestartRun], clean_weights: Any
) -> None:
    """§2b: a user's script on the ddpkit helpers: Succeeded, with smoke --local's weights."""
    run = runs[("ddpkit", "c10d")]
    assert run.condition == "Succeeded", run.condition
    assert run.done is not None and run.done["step"] == 24
    assert run.done["weights_sha256"] == clean_weights(DDPKIT)
