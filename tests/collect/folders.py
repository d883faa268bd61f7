"""What a run leaves in a folder, made for collect's tests: checkpoints in the trainer's
layout, the diagnostics files `--debug` brings, a disk to fill; and the stand-ins for what a
test cannot have here (a pod's exec API, a folder changed between two reads)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from itertools import cycle
from pathlib import Path
from typing import Any

from reports import Recorded

from ddpdeploy.collect.checkpoint import Collected, collect, payload_name, sidecar_name
from ddpdeploy.collect.debug import MAX_DEBUG
from ddpdeploy.collect.source import LocalSource
from ddpdeploy.errors import OperationError

# Where a local run of job `j` leaves its checkpoints, from its project folder (paths).
RUN = Path(".ddpdeploy", "checkpoints", "j")

# What ends a text diagnostics file cut at the bound (collect.debug).
CUT_NOTE = f"\n# ddpdeploy collect: cut here at {MAX_DEBUG} bytes; the file was longer\n".encode()

# The fields the trainer's sidecars carry besides step and sha256 (train/ddptrain_ckpt.py).
TRAINER_FIELDS = {"world_size": 2, "host": "node-0", "rank": 0, "restart_count": 0, "time": 1.5}


def put_checkpoint(
    folder: Path,
    step: int,
    payload: bytes | None = None,
    *,
    size: int = 5000,
    meta: dict[str, Any] | None = None,
) -> bytes:
    """Step ``step``: its payload (``size`` random bytes unless given) and its sidecar, written
    last as the trainer does: {step, sha256} and ``meta`` (which may override either)."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(size) if payload is None else payload
    (folder / payload_name(step)).write_bytes(payload)
    doc = {"step": step, "sha256": hashlib.sha256(payload).hexdigest(), **(meta or {})}
    (folder / sidecar_name(step)).write_text(json.dumps(doc))
    return payload


def put_trainer_checkpoint(
    folder: Path, step: int, payload: bytes | None = None, meta: dict[str, Any] | None = None
) -> bytes:
    """The same with a sidecar as the trainer writes it (its fields and `file`); ``meta``
    overrides sidecar fields."""
    fields = {**TRAINER_FIELDS, "file": payload_name(step), **(meta or {})}
    return put_checkpoint(folder, step, payload, meta=fields)


def put_diagnostics(folder: Path) -> dict[str, bytes]:
    """One file of each kind `--debug` brings (two hang stacks); name -> bytes."""
    files = {
        "hang-rank0.txt": b"# ddpkit hang watchdog: rank 0 on h, pid 1, last step 4\nThread 0x1\n",
        "hang-rank1.txt": b"# ddpkit hang watchdog: rank 1 on h, pid 2, last step 4\nThread 0x2\n",
        "nccl_trace_rank_0": os.urandom(3000),  # a pickle, as torch writes it
        "ddpkit-nccl.node-1.4242.log": b"node-1:4242 NCCL INFO NET/Socket : Using [0]eth0\n",
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def run(folder: Path, dest: Path, **kw: Any) -> tuple[Collected, list[str]]:
    """collect from the local folder ``folder`` into ``dest``: (what it says, its warnings)."""
    said = Recorded()
    warnings = said.warnings
    got = collect(LocalSource(folder), dest, report=said, **kw)
    return got, warnings


def check_collected(dest: Path, step: int) -> None:
    """--to holds step ``step`` whole (its payload matches its sidecar) and nothing else: no temp
    file, no half checkpoint; and the run record (RUN.json) when the sidecar has one."""
    meta = json.loads((dest / f"ckpt-step-{step:09d}.json").read_text())
    payload = (dest / meta["file"]).read_bytes()
    assert hashlib.sha256(payload).hexdigest() == meta["sha256"]
    record = ["RUN.json"] if "run" in meta else []  # a sidecar without a record: none
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [f"ckpt-step-{step:09d}.json", meta["file"], *record]
    )  # nothing else: no temp files, no half checkpoint
    if record:
        check_record(dest, meta, step)


def check_record(dest: Path, meta: dict[str, Any], step: int) -> None:
    """RUN.json: the sidecar's record of what ran, beside the checkpoint it belongs to."""
    run = json.loads((dest / "RUN.json").read_text())
    assert run["checkpoint"] == meta["file"] and run["step"] == step
    assert run["checkpoint_sha256"] == meta["sha256"] and run == {
        **meta["run"], "checkpoint": meta["file"], "step": step,
        "checkpoint_sha256": meta["sha256"]}  # fmt: skip
    assert len(run["spec_sha256"]) == 64 and run["world_size"] == 1 and run["seed"] == 0
    assert run["torch"] and run["argv"][0].endswith("ddptrain.py") and "git_commit" in run


def fill(mount: Path, leave: int) -> Path:
    """Fill the tmpfs at ``mount`` up, then free ``leave`` bytes of it: the filler file."""
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        block = b"\0" * (64 << 10)
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return filler


class ExecHere:
    """Stands in for the exec API (which needs a kubelet): runs the pod source's argv (`sh -c
    PROGRAM sh ARG`) here, hands stdout back in small uneven chunks as a websocket does (sizes
    from ``chunks``, in turn), and fails on a non-zero exit as Kube.exec_stream does."""

    def __init__(
        self, before_read: Callable[[str], None] | None = None, chunks: Sequence[int] = (7,)
    ) -> None:
        self.before_read, self.chunks = before_read, chunks

    def exec_stream(
        self, pod: str, namespace: str, container: str, argv: list[str]
    ) -> Iterator[bytes]:
        if self.before_read and "ddpdeploy-refused" in argv[2]:
            self.before_read(argv[-1])
        res = subprocess.run(argv, capture_output=True)
        i, sizes = 0, cycle(self.chunks)
        while i < len(res.stdout):
            size = next(sizes)
            yield res.stdout[i : i + size]
            i += size
        if res.returncode:
            tail = res.stderr.decode(errors="replace").strip()[-300:]
            raise OperationError(f"running sh in pod {pod}: exit code {res.returncode}: {tail}")


class SwapOnOpen:
    """A real folder whose payload is changed (really) between the listing and the open:
    ``swap`` runs on the first open of ``name``."""

    def __init__(self, folder: Path, name: str, swap: Any) -> None:
        self.inner, self.name, self.swap, self.where = LocalSource(folder), name, swap, "swap"

    def entries(self) -> dict[str, str]:
        return self.inner.entries()

    def open(self, name: str) -> contextlib.AbstractContextManager[Any]:
        if name == self.name and self.swap:
            self.swap, swap = None, self.swap
            swap()
        return self.inner.open(name)
