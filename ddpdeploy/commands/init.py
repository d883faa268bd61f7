"""`ddpdeploy init`: a commented starter ddpdeploy.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ddpdeploy.errors import UserError
from ddpdeploy.spec import DEFAULT_FILE

STARTER = """\
# ddpdeploy job spec. CLI flags override these fields (e.g. --nodes 4 --gpus 8).
# Every field is optional; the values shown are the defaults unless marked "example".

name: ddp-train            # DNS-1035 label; pods are <name>-master-0, <name>-worker-<i>
namespace: default
# image: ghcr.io/team/train:v1    # example; `ddpdeploy build` prints one
nodes: 2                   # example: nodes (pods); default 1
gpus: 0                    # GPUs per node; 0 = CPU job with gloo
# procs: 1                 # processes per node; default = gpus (one per GPU), or 1 on CPU
# cpu: "8"                 # per node, a Kubernetes quantity (requests)
# memory: 64Gi             # per node (requests and limits)
backend: auto              # auto (nccl on GPU, gloo on CPU) | nccl | gloo

command:                   # neither script nor module: the built-in trainer
  # script: train.py       # a script in your workspace, run by torchrun
  # module: mypkg.train    # or a module
  args: ["--steps", "100"] # example; `ddpdeploy render -- --lr 0.1` appends more

rendezvous:
  mode: static             # static: fixed nodes, rank 0 on master-0 | elastic: c10d
  # minNodes: 1            # elastic only (--elastic MIN:MAX)
  # maxNodes: 4
  # maxRestarts: 3         # elastic only: torchrun worker-group restarts
  port: 23456
  joinTimeout: 900         # seconds to wait for every peer (and its DNS)

# checkpoint:              # a volume every pod mounts; rank 0 writes there
#   size: 100Gi            # a new PVC <name>-checkpoints ... or claimName: an existing one
#   storageClass: standard
#   accessMode: ReadWriteMany
#   mountPath: /checkpoints

shmSize: 2Gi               # /dev/shm as a memory emptyDir; null = no mount (64 MB default)
terminationGracePeriodSeconds: 120  # SIGTERM -> checkpoint -> exit; torchrun alone takes 30 s
env: {}                    # e.g. {NCCL_DEBUG: INFO}
imagePullSecrets: []
nodeSelector: {}
tolerations: []            # e.g. [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
# serviceAccount: trainer
# priorityClass: high
labels: {}
annotations: {}
runPolicy: {}              # backoffLimit, activeDeadlineSeconds, ttlSecondsAfterFinished,
                           # cleanPodPolicy (None | Running | All)
"""


def init(
    path: Annotated[Path, typer.Argument(help="File to write.")] = Path(DEFAULT_FILE),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter ddpdeploy.yaml.

    Example: ddpdeploy init && ddpdeploy render --image ghcr.io/me/train:v1
    """
    if path.exists() and not force:
        raise UserError(f"{path} exists; pass --force to overwrite it")
    try:
        path.write_text(STARTER, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc}") from None
    typer.echo(f"wrote {path}", err=True)
