"""What the spec must know of the launch and of each target, as plain data.

The spec validates against these tables and imports no target: a target's code (its
layout, objects and live jobs, ddpdeploy.targets) sits above the spec and states its own
rules here, so both read one source. tests/test_targets.py checks that each target's
layout keeps the name budget written here. No project imports, no code beyond the tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEFAULT_PORT = 23456  # the operator's default for the port named pytorchjob-port
TRAINER_PORT = 29400  # Trainer v2's PET_MASTER_PORT and container port; not configurable
DEFAULT_RUNTIME = "torch-distributed"  # Trainer v2's default ClusterTrainingRuntime
MAX_DNS_LABEL = 63  # a pod hostname and a Service name are DNS labels

# What ran (ddpkit's run record reads these): the launch contract sets them from the spec and
# from what ddpdeploy knows of the image it built.
SPEC_SHA256_ENV = "DDPDEPLOY_SPEC_SHA256"
IMAGE_ENV = "DDPDEPLOY_IMAGE"
IMAGE_DIGEST_ENV = "DDPDEPLOY_IMAGE_DIGEST"
GIT_COMMIT_ENV = "DDPDEPLOY_GIT_COMMIT"
GIT_DIRTY_ENV = "DDPDEPLOY_GIT_DIRTY"
# ddpkit's diagnostics settings, each set by one spec field (its flag); a user's env value
# for one is refused with the field to use instead.
DIAGNOSTICS_ENV = {
    "DDPDEPLOY_PROBE": "diagnostics.probe (--no-probe)",
    "DDPDEPLOY_PROBE_MIN_BUSBW": "diagnostics.probeMinBusbw (--probe-min-busbw)",
    "DDPDEPLOY_HANG_TIMEOUT_S": "diagnostics.hangTimeoutSeconds (--hang-timeout)",
    "DDPDEPLOY_RANKS_EVERY": "diagnostics.ranksEvery (--ranks-every)",
    "DDPDEPLOY_STRAGGLER_FACTOR": "diagnostics.stragglerFactor (--straggler-factor)",
    "DDPDEPLOY_RDMA": "network.rdma (--rdma)",
}
RECORD_ENV = frozenset(
    {SPEC_SHA256_ENV, IMAGE_ENV, IMAGE_DIGEST_ENV, GIT_COMMIT_ENV, GIT_DIRTY_ENV}
)

# Env the launch contract sets on every node (torchrun's, the operator's and ddpdeploy's own);
# a user value would silently change the topology, break the launch or falsify the record.
RESERVED_ENV = frozenset(
    {
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PYTHONUNBUFFERED",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        *RECORD_ENV,
        *DIAGNOSTICS_ENV,
    }
)
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_", "DDPDEPLOY_")


@dataclass(frozen=True)
class TargetRules:
    """One target as the spec sees it."""

    name: str  # the --target value
    kind: str  # its job object's kind, as refusals name it
    platform: str  # what runs that object, as refusals name it
    # The longest DNS label the target derives from the job name is the name plus this
    # suffix, ``{index}`` being the last index of ``index_of`` (nodes or rendezvous maxNodes).
    label_suffix: str
    index_of: Literal["nodes", "max_nodes"] = "nodes"
    no_elastic: str | None = None  # why it cannot run elastic rendezvous; None: it can
    fixed_port: int | None = None  # the rendezvous port the platform fixes
    takes_runtime: bool = False  # spec.runtime applies (a ClusterTrainingRuntime)
    # runPolicy fields (camelCase) its object has no home for, and the refusal's reason and
    # fix; "*" refuses every field but those in run_policy_kept.
    run_policy_refused: tuple[str, ...] = ()
    run_policy_kept: tuple[str, ...] = ()
    run_policy_why: str = ""
    run_policy_fix: str = "remove it"


TARGET_RULES: dict[str, TargetRules] = {
    t.name: t
    for t in (
        TargetRules(
            name="pytorchjob",
            kind="PyTorchJob",
            platform="the training operator",
            label_suffix="-worker-{index}",
            index_of="max_nodes",
        ),
        TargetRules(
            name="trainjob",
            kind="TrainJob",
            platform="Trainer v2",
            label_suffix="-node-0-{index}",
            no_elastic="Kubeflow Trainer v2 has no elastic training",
            fixed_port=TRAINER_PORT,
            takes_runtime=True,
            run_policy_refused=("*",),
            run_policy_kept=("activeDeadlineSeconds",),
            run_policy_why="the runtime's JobSet decides it",
            run_policy_fix="remove it or use --target pytorchjob",
        ),
        TargetRules(
            name="indexed-job",
            kind="Job",
            platform="the Job controller",
            label_suffix="-{index}",
            no_elastic="a Job's parallelism is fixed, so it cannot be elastic",
            run_policy_refused=("cleanPodPolicy",),
            run_policy_why="a Job keeps its pods until runPolicy.ttlSecondsAfterFinished",
        ),
    )
}
TARGET_NAMES = tuple(TARGET_RULES)
DEFAULT_TARGET = "pytorchjob"
