"""Counts with an upper bound that says why: nodes (Kubernetes' limit on an Indexed Job's
pods at once), processes and GPUs per node, and compose's nodes on one Docker host. A count
past them is one line naming the field and the limit, before any rendering work."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from typing import Any

import pytest
from cli_runner import run_main
from pydantic import ValidationError

from ddpdeploy.smoke.compose import MAX_COMPOSE_NODES
from ddpdeploy.spec import JobSpec
from ddpdeploy.spec.fields import MAX_NODES, MAX_PER_NODE

BIG = 2**31 - 1  # the int32 the bounds used to stop at


def spec(**fields: Any) -> JobSpec:
    return JobSpec.model_validate({"image": "x:1", **fields})


# Found by the third hostile pass: counts were bounded only by int32, so `--nodes 2147483647`
# passed and then compose and the indexed-job render ate GBs for minutes, and
# `--nodes/--procs/--gpus 2147483647` rendered a job of world size ~4.6e18 (exit 0).
@pytest.mark.parametrize(
    ("fields", "where", "limit"),
    [
        ({"nodes": MAX_NODES + 1}, "nodes", MAX_NODES),
        ({"nodes": BIG}, "nodes", MAX_NODES),
        ({"nodes": BIG + 1}, "nodes", MAX_NODES),
        ({"procs": MAX_PER_NODE + 1}, "procs", MAX_PER_NODE),
        ({"gpus": MAX_PER_NODE + 1}, "gpus", MAX_PER_NODE),
        (
            {"rendezvous": {"mode": "elastic", "minNodes": 1, "maxNodes": BIG}},
            "rendezvous.maxNodes",
            MAX_NODES,
        ),
    ],
    ids=["nodes", "nodes-int32", "nodes-past-int32", "procs", "gpus", "elastic-max"],
)
def test_counts_past_their_bound_are_refused_naming_the_limit(fields, where, limit):
    with pytest.raises(ValidationError) as info:
        spec(**fields)
    (error,) = info.value.errors()
    assert ".".join(map(str, error["loc"])) == where
    assert f"must be at most {limit}" in error["msg"], error["msg"]


def test_the_bounds_themselves_are_allowed():
    job = spec(nodes=MAX_NODES, gpus=MAX_PER_NODE, procs=MAX_PER_NODE)
    assert job.nodes * job.procs_per_node < 2**31  # torch's ranks are int32


def test_the_flags_line_names_the_flag_and_the_limit():
    res = run_main(
        "render", "--image", "x:1", "--nodes", str(BIG), "--procs", str(BIG), "--gpus", str(BIG)
    )
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith(
        f"error: --nodes: must be at most {MAX_NODES}, Kubernetes' limit on the pods an "
        f"Indexed Job runs at once (got {BIG})"
    ), res.stderr
    assert res.stderr.count("\n") == 1


def test_compose_has_its_own_smaller_bound(tmp_path):
    over = run_main("compose", "--image", "x:1", "--nodes", str(MAX_COMPOSE_NODES + 1))
    assert over.returncode == 2 and over.stdout == ""
    assert over.stderr == (
        f"error: nodes: compose runs every node on this host, at most {MAX_COMPOSE_NODES} "
        f"(got {MAX_COMPOSE_NODES + 1}); use fewer nodes (--nodes), or render the job for "
        "the cluster\n"
    )
    at = run_main("compose", "--image", "x:1", "--nodes", str(MAX_COMPOSE_NODES))
    assert at.returncode == 0, at.stderr


def _capped() -> None:
    # Without the bounds these ran for minutes towards 4 GB: a cap ends them at once.
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize(
    "args",
    [
        ("compose", "--image", "x:1", "--nodes", str(BIG)),
        ("render", "--image", "x:1", "--target", "indexed-job", "--nodes", str(BIG)),
    ],
    ids=["compose", "indexed-job"],
)
def test_huge_node_counts_fail_fast_in_a_fresh_interpreter(args):
    started = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "ddpdeploy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_capped,
    )
    assert res.returncode == 2, res.stderr[-500:]
    assert res.stderr.startswith(f"error: --nodes: must be at most {MAX_NODES}"), res.stderr
    assert time.monotonic() - started < 30  # seconds on a busy machine; ~0.5 s alone
