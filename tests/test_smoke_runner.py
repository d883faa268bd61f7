"""The smoke runner's target-neutral parts and the local target's launch, without torch."""

from __future__ import annotations

import sys

import pytest

from ddpdeploy.adapters.local import LocalRun
from ddpdeploy.errors import UserError
from ddpdeploy.render.local import plan
from ddpdeploy.smoke_runner import (
    MAX_WORKERS_PER_CORE,
    SmokeTarget,
    WorkerFailure,
    check_cpu_budget,
    root_cause,
    split_rank,
    summary_failures,
)
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import launch_contract


def test_launcher_is_a_parameter_of_the_contract():
    contract = launch_contract(JobSpec.model_validate({"nodes": 2}))
    launcher = ["/venv/bin/python", "-m", "torch.distributed.run"]
    command = contract.container_command("/src/train/ddptrain.py", "/tmp/ck", launcher)
    assert command[4:] == [*launcher, *contract.entry_argv("/src/train/ddptrain.py", "/tmp/ck")]
    assert "torchrun" not in command
    assert contract.container_command()[4] == "torchrun"  # the image's, by default


def test_local_nodes_run_this_interpreters_torchrun():
    nodes = plan(JobSpec.model_validate({"nodes": 2}), 29400, "/src/train/ddptrain.py")
    for node in nodes:
        assert node.argv[4:8] == [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "/src/train/ddptrain.py",
        ]
        assert "PET_MAX_RESTARTS" not in node.env
    restarting = plan(JobSpec.model_validate({"nodes": 2}), 29400, "/t.py", max_restarts=1)
    assert all(n.env["PET_MAX_RESTARTS"] == "1" for n in restarting)


def test_local_run_is_a_smoke_target():
    assert issubclass(LocalRun, SmokeTarget)


def test_cpu_budget_lets_the_readme_job_run_on_two_cores():
    check_cpu_budget(2, 2, force=False, cores=2)
    check_cpu_budget(2, MAX_WORKERS_PER_CORE, force=False, cores=2)
    with pytest.raises(UserError, match="--force"):
        check_cpu_budget(3, 3, force=False, cores=2)
    check_cpu_budget(50, 50, force=True, cores=2)


def test_rank_prefix_and_summary_are_read_from_torchrun_lines():
    # The shape of torch 2.13's agent summary, as the truth test produces it for real.
    tail = [
        "[rank2]:[rank2]: RuntimeError: Connection closed by peer",
        "Failures:",
        "[1]:",
        "  rank      : 2 (local_rank: 0)",
        "  exitcode  : -15 (pid: 24818)  (SIGTERM)",
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 3 (local_rank: 1)",
        "  exitcode  : 1 (pid: 24819) ",
    ]
    assert split_rank(tail[0]) == (2, "[rank2]: RuntimeError: Connection closed by peer")
    assert split_rank("plain") == (None, "plain")
    got = [(f.rank, f.local_rank, f.code, f.root) for f in summary_failures("n", tail)]
    assert got == [(2, 0, -15, False), (3, 1, 1, True)]


def test_root_cause_is_the_failed_worker_whose_output_ended_first():
    peer = WorkerFailure("a", 0, 0, 1, root=False)
    killed = WorkerFailure("b", 2, 0, -15, root=False)  # SIGTERMed by its own agent
    cause = WorkerFailure("b", 3, 1, 1, root=True)
    times = {("a", 0): 10.5, ("b", 0): 1.0, ("b", 1): 10.0}
    assert root_cause([peer, killed, cause], times) == cause
    # Without times, torchrun's own pick; with only SIGTERMed workers, one of those.
    assert root_cause([peer, cause], {}) == cause
    assert root_cause([killed], times) == killed
