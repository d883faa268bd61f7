"""`ddpdeploy init`: a commented starter ddpdeploy.yaml, and its JSON Schema for editors."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Annotated

import typer

from ddpdeploy.errors import UserError
from ddpdeploy.paths import DEFAULT_FILE, SCHEMA_FILE
from ddpdeploy.text import plain

# The modeline yaml-language-server (VS Code's YAML extension, Neovim's yamlls, …) reads; the
# path is relative to the spec file, so completion and validation work offline.
MODELINE = f"# yaml-language-server: $schema=./{SCHEMA_FILE}\n"

STARTER = (
    MODELINE
    + """\
# ddpdeploy job spec. CLI flags override these fields (e.g. --nodes 4 --gpus 8).
# Every field is optional; the values shown are the defaults unless marked "example".

name: ddp-train            # DNS-1035 label; pods are <name>-worker-<i> (static: -master-0)
# namespace: team-a       # example; unset: -n, else the kubeconfig context's, else default
target: pytorchjob         # pytorchjob | trainjob (Trainer v2) | indexed-job (no operator)
# runtime: torch-distributed  # trainjob only: the ClusterTrainingRuntime
# image: ghcr.io/team/train:v1    # example; `ddpdeploy build` prints one
nodes: 2                   # example: nodes (pods); default 1
gpus: 0                    # GPUs per node; 0 = CPU job with gloo
# procs: 1                 # processes per node; default = gpus (one per GPU), or 1 on CPU
# cpu: "8"                 # per node, requested (default 1 per process); never limited:
                           # CFS throttling stalls collectives
# memory: 64Gi             # per node, requested and limited (default 4Gi per process)
backend: auto              # auto (nccl on GPU, gloo on CPU) | nccl | gloo

@COMMAND@

rendezvous:
  mode: c10d               # c10d: fixed nodes, a restart safe for any script | static: rank 0
                           # on master-0, restarts only for scripts that handle them |
                           # elastic: c10d between minNodes and maxNodes
  # minNodes: 1            # elastic only (--elastic MIN:MAX)
  # maxNodes: 4
  # maxRestarts: 3         # c10d and elastic: torchrun worker-group restarts
  port: 23456
  joinTimeout: 900         # seconds to wait for every peer (and its DNS)

# checkpoint:              # a volume every pod mounts; rank 0 writes there
#   size: 100Gi            # a new PVC <name>-checkpoints ... or claimName: an existing one
#   storageClass: standard
#   accessMode: ReadWriteMany
#   mountPath: /checkpoints

shmSize: 2Gi               # /dev/shm as a memory emptyDir; null = no mount (64 MB default)
logSize: 4Gi               # bound on torchrun's copies of every worker's output; past it
                           # the pod is evicted (null = no bound)
terminationGracePeriodSeconds: 120  # SIGTERM -> checkpoint -> exit; torchrun alone takes 30 s
env: {}                    # e.g. {OMP_NUM_THREADS: "4"}
secretEnv: {}              # by reference only, e.g. {HF_TOKEN: {secret: hf, key: token}}
imagePullSecrets: []
nodeSelector: {}
tolerations: []            # e.g. [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
# serviceAccount: trainer
# priorityClass: high
labels: {}
annotations: {}
runPolicy: {}              # backoffLimit, activeDeadlineSeconds, ttlSecondsAfterFinished,
                           # cleanPodPolicy (None | Running | All)

security:                  # hardened by default; loosen one setting at a time
  runAsUser: 10001         # non-root; the image `ddpdeploy build` makes runs as 10001
  runAsGroup: 10001
  fsGroup: 10001           # volumes (a new, root-owned checkpoint PVC) get this group
  readOnlyRootFilesystem: true   # /tmp and HOME are emptyDirs; false = --writable-rootfs
  automountServiceAccountToken: false  # true only for code that calls the Kubernetes API

scheduling:
  scheduler: default       # default | volcano (gang of all nodes; --scheduler)
  # queue: team-a          # Kueue LocalQueue (job starts suspended), or the Volcano queue

network:
  policy: true             # NetworkPolicy: only the job's own pods may connect to them
  hostNetwork: false       # the node's network (dnsPolicy ClusterFirstWithHostNet)
  # rdma: {resource: rdma/hca_shared_devices_a, count: 1}  # --rdma RES=N; adds IPC_LOCK
  # ncclDebug: INFO        # VERSION | WARN | INFO | TRACE; default WARN on GPU jobs
  # ncclSocketIfname: eth0 # NCCL_SOCKET_IFNAME (default: NCCL chooses)
  # ncclIbHca: mlx5_0      # NCCL_IB_HCA (default: NCCL chooses)
"""
)

BUILTIN_COMMAND = """\
command: {}                # neither script nor module: the built-in trainer
  # script: train.py       # your script in this workspace (ddpdeploy init --script train.py)
  # module: mypkg.train    # or your module, run as torchrun -m (ddpdeploy init --module)
  # args: ["--steps", "100"]  # example: its arguments; `-- ARGS` on the CLI appends more"""

SCRIPT_COMMAND = """\
command:
  {key}: {value}{pad}# your {what}, run by torchrun
  # args: ["--epochs", "2"]  # example: its arguments; `-- ARGS` on the CLI appends more"""

NAME_LINE = "name: ddp-train            #"
CHECKPOINT_BLOCK = """\
# checkpoint:              # a volume every pod mounts; rank 0 writes there
#   size: 100Gi            # a new PVC <name>-checkpoints ... or claimName: an existing one
#   storageClass: standard
#   accessMode: ReadWriteMany
#   mountPath: /checkpoints"""
# Your own code saves and resumes through a volume (docs/own-script.md): on from the start.
LIVE_CHECKPOINT = """\
checkpoint:                # your code saves under $DDPDEPLOY_CHECKPOINT_DIR (this volume)
  size: 20Gi               # a new PVC <name>-checkpoints ... or claimName: an existing one
  # storageClass: standard
  accessMode: ReadWriteMany
  mountPath: /checkpoints"""
DEFAULT_NAME = "ddp-train"
MAX_DERIVED_NAME = 40  # leaves room for every target's pod and Service suffixes


def derived_name(entry: str, module: bool) -> str:
    """A job name (DNS-1035 label) from the script's file name (``src/train_bert.py``:
    ``train-bert``) or the module's path (``pkg.train``: ``pkg-train``)."""
    base = entry if module else entry.rsplit("/", 1)[-1].removesuffix(".py")
    name = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")
    if name and not name[0].isalpha():
        name = f"job-{name}"
    name = name[:MAX_DERIVED_NAME].rstrip("-")
    return name or DEFAULT_NAME


def starter(script: str | None = None, module: str | None = None) -> str:
    """The starter spec: for the built-in trainer, or for the user's script or module (a
    name derived from it, and a live checkpoint volume)."""
    if script is not None and module is not None:
        raise UserError("--script/--module: give one of them, not both")
    if script is None and module is None:
        return STARTER.replace("@COMMAND@", BUILTIN_COMMAND)
    from pydantic import ValidationError

    from ddpdeploy.spec.model import Command

    key, entry = ("script", script) if script is not None else ("module", str(module))
    try:
        Command.model_validate({key: entry})
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise UserError(f"--{key}: {reason}") from None
    value = json.dumps(entry)  # a YAML string whatever the characters
    what = "script, in this workspace" if key == "script" else "module"
    pad = " " * max(1, 25 - len(key) - len(value) - 2)
    name = derived_name(entry, module=key == "module")
    name_line = f"name: {name}" + " " * max(1, len(NAME_LINE) - 1 - len(f"name: {name}")) + "#"
    return (
        STARTER.replace(
            "@COMMAND@", SCRIPT_COMMAND.format(key=key, value=value, pad=pad, what=what)
        )
        .replace(NAME_LINE, name_line, 1)
        .replace(CHECKPOINT_BLOCK, LIVE_CHECKPOINT, 1)
    )


def init(
    file: Annotated[str, typer.Argument(help="File to write.", metavar="PATH")] = DEFAULT_FILE,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    script: Annotated[
        str | None,
        typer.Option("--script", help="A spec for your own script (e.g. train.py), not ours."),
    ] = None,
    module: Annotated[
        str | None,
        typer.Option("--module", help="A spec for your own module (e.g. pkg.train), not ours."),
    ] = None,
) -> None:
    """Write a commented starter ddpdeploy.yaml, and beside it the JSON Schema editors use.

    Example: ddpdeploy init --script train.py && ddpdeploy smoke --local
    """
    from ddpdeploy.fs import file_path
    from ddpdeploy.spec import json_schema

    path = file_path(file, "PATH", DEFAULT_FILE)
    text = starter(script, module)
    schema_path = path.parent / SCHEMA_FILE
    if path.name == SCHEMA_FILE:  # the spec would replace the schema, and name itself in it
        raise UserError(f"{path} is where init writes the JSON Schema; give the spec another name")
    if not path.parent.is_dir():
        raise UserError(f"{path.parent} is not a folder; create it first, or give another PATH")
    _check_target(path, force)
    _check_schema(schema_path, force)
    schema_existed = schema_path.exists()
    _write(schema_path, json.dumps(json_schema(), indent=2) + "\n")
    try:
        _write(path, text, replace=force)
    except _MadeMeanwhile:
        raise  # by another init: the schema beside it is that one's too
    except BaseException:
        if not schema_existed:
            schema_path.unlink(missing_ok=True)  # nothing half-written
        raise
    chose = ""
    if script is not None or module is not None:
        from ddpdeploy.spec import load_spec

        spec = load_spec(path)
        entry = f"script {script}" if script is not None else f"module {module}"
        size = spec.checkpoint.size if spec.checkpoint else "no"
        where = spec.checkpoint.mount_path if spec.checkpoint else ""
        chose = (
            f" for your {entry}: job name {spec.name} (from its name), a {size} checkpoint "
            f"volume at {where} ($DDPDEPLOY_CHECKPOINT_DIR)"
        )
    # Not an error: the spec may come first; smoke and build refuse the run until it is there.
    missing = script is not None and not Path(script).is_file()
    yet = f"; {script} is not a file in this folder yet" if missing else ""
    # Names as typed may hold escapes or bidi overrides (U+202E): shown plain.
    typer.echo(
        plain(f"wrote {path}{chose} (and {schema_path} for editor completion){yet}"), err=True
    )


def _mode(path: Path, what: str) -> int | None:
    """The lstat mode of what is at ``path`` (None: nothing), else one line naming ``what``."""
    try:
        return path.lstat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"cannot write {what}: {exc.strerror}") from None


def _check_target(path: Path, force: bool) -> None:
    mode = _mode(path, str(path))
    if mode is None:
        return
    if stat.S_ISDIR(mode):
        raise UserError(f"{path} is a directory; give a file path, e.g. {path / DEFAULT_FILE}")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise UserError(f"{path} exists and is not a regular file; move it away")
    if not force:
        raise UserError(f"{path} exists; pass --force to overwrite it")


def _check_schema(path: Path, force: bool) -> None:
    """The schema beside the spec is replaced when init wrote it (an older one, refreshed)
    or with --force: a file of that name may be the user's own."""
    what = f"{path} (the JSON Schema init writes beside the spec)"
    mode = _mode(path, what)
    if mode is None:
        return
    if stat.S_ISDIR(mode):
        raise UserError(f"cannot write {what}: it is a folder; move it away")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise UserError(f"cannot write {what}: it is not a regular file; move it away")
    if not force and not (stat.S_ISREG(mode) and _our_schema(path, what)):
        raise UserError(f"{what} exists and is not one ddpdeploy wrote; move it or pass --force")


def _our_schema(path: Path, what: str) -> bool:
    from ddpdeploy.fs import read_regular

    try:
        data = read_regular(path, limit=16 << 20, follow_symlinks=False)
    except (OSError, UserError):  # unreadable: whose it is cannot be told
        raise UserError(
            f"cannot read {what}; fix its permissions, or pass --force to replace it"
        ) from None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("title") == DEFAULT_FILE and "properties" in doc


def _write(path: Path, text: str, replace: bool = True) -> None:
    """Replace ``path`` whole: never a half-written file. --force may replace a symlink (the
    link itself, never the file it points to). Without ``replace`` only where nothing is
    yet, at the moment of writing: a file made since `_check_target` is not replaced."""
    from ddpdeploy.fs import Staged

    with Staged(path, replace_link=True) as out:
        out.write(text.encode("utf-8"))
        try:
            out.commit(replace=replace)
        except FileExistsError:
            raise _MadeMeanwhile(f"{path} exists; pass --force to overwrite it") from None


class _MadeMeanwhile(UserError):
    """The file was made between `_check_target` and the write."""
