"""The job matrix the render tests share: FULL (every field a PyTorchJob carries) and MATRIX
(named cases over the options), rendered by tests/test_render_k8s.py for the PyTorchJob and by
tests/test_targets.py for every target."""

from __future__ import annotations

from typing import Any

FULL = {
    "name": "llm",
    "namespace": "team-a",
    "image": "ghcr.io/team/train:v1",
    "nodes": 3,
    "gpus": 8,
    "cpu": "32",
    "memory": "256Gi",
    "command": {"script": "train.py", "args": ["--epochs", "3"]},
    "checkpoint": {"size": "500Gi", "storageClass": "fast-rwx", "mountPath": "/ckpt"},
    "shmSize": "32Gi",
    "env": {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": 4},
    "imagePullSecrets": ["regcred"],
    "nodeSelector": {"nvidia.com/gpu.product": "H100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "serviceAccount": "trainer",
    "priorityClass": "high",
    "labels": {"team": "a"},
    "annotations": {"example.com/owner": "me"},
    "runPolicy": {
        "backoffLimit": 3,
        "activeDeadlineSeconds": 86400,
        "ttlSecondsAfterFinished": 3600,
        "cleanPodPolicy": "Running",
    },
}

MATRIX: dict[str, dict[str, Any]] = {
    "one-node-cpu": {"image": "train:v1"},
    "two-node-gpu": {"image": "train:v1", "nodes": 2, "gpus": 8},
    "cpu-procs": {"image": "train:v1", "nodes": 2, "procs": 4, "backend": "gloo"},
    "elastic": {
        "image": "train:v1",
        "nodes": 3,
        "gpus": 4,
        "rendezvous": {"mode": "elastic", "minNodes": 2, "maxNodes": 6, "maxRestarts": 3},
    },
    "elastic-no-restarts": {
        "image": "train:v1",
        "nodes": 1,
        "rendezvous": {"mode": "elastic", "minNodes": 1, "maxNodes": 2, "port": 29500},
    },
    "existing-claim": {"image": "train:v1", "checkpoint": {"claimName": "shared-ckpt"}},
    "no-shm": {"image": "train:v1", "shmSize": None},
    "module": {"image": "train:v1", "command": {"module": "pkg.train", "args": ["-x"]}},
    "full": FULL,
    "volcano-elastic": {
        "image": "train:v1",
        "nodes": 3,
        "gpus": 8,
        "priorityClass": "high",
        "rendezvous": {"mode": "elastic", "minNodes": 2, "maxNodes": 4},
        "scheduling": {"scheduler": "volcano", "queue": "research"},
    },
    "kueue": {"image": "train:v1", "nodes": 2, "scheduling": {"queue": "team-a"}},
    "rdma-host-network": {
        "image": "train:v1",
        "nodes": 2,
        "gpus": 8,
        "network": {
            "rdma": {"resource": "rdma/hca_shared_devices_a", "count": 2},
            "hostNetwork": True,
            "ncclDebug": "INFO",
            "ncclSocketIfname": "^lo,docker",
            "ncclIbHca": "mlx5_0,mlx5_1",
        },
    },
    "loosened": {
        "image": "train:v1",
        "nodes": 2,
        "network": {"policy": False},
        "security": {
            "readOnlyRootFilesystem": False,
            "automountServiceAccountToken": True,
            "runAsUser": 2000,
            "runAsGroup": 0,
            "fsGroup": 3000,
        },
        "secretEnv": {"HF_TOKEN": {"secret": "hf", "key": "token"}},
    },
}
