"""`ddpdeploy collect --from local` on the checkpoints of a real `smoke --local` run."""

from __future__ import annotations

import hashlib
import json

import pytest
from cli_runner import run_cli

pytestmark = pytest.mark.slow  # its fixture trains with `smoke --local`


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A folder in which a 1-node smoke run left checkpoints at steps 2, 4 and 6."""
    path = tmp_path_factory.mktemp("smoke")
    (path / "ddpdeploy.yaml").write_text(
        "name: c\ncheckpoint: {claimName: local}\n"
        "command: {args: [--checkpoint-every, '2', --keep, '3']}\n"
    )
    out = run_cli("smoke", "--local", "--procs", "1", "--steps", "6", cwd=path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return path


def _check(dest, step):
    meta = json.loads((dest / f"ckpt-step-{step:09d}.json").read_text())
    payload = (dest / meta["file"]).read_bytes()
    assert hashlib.sha256(payload).hexdigest() == meta["sha256"]
    record = ["RUN.json"] if "run" in meta else []  # a sidecar without a record: none
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [f"ckpt-step-{step:09d}.json", meta["file"], *record]
    )  # nothing else: no temp files, no half checkpoint
    if record:
        _check_record(dest, meta, step)


def _check_record(dest, meta, step):
    """RUN.json: the sidecar's record of what ran, beside the checkpoint it belongs to."""
    run = json.loads((dest / "RUN.json").read_text())
    assert run["checkpoint"] == meta["file"] and run["step"] == step
    assert run["checkpoint_sha256"] == meta["sha256"] and run == {
        **meta["run"], "checkpoint": meta["file"], "step": step,
        "checkpoint_sha256": meta["sha256"]}  # fmt: skip
    assert len(run["spec_sha256"]) == 64 and run["world_size"] == 1 and run["seed"] == 0
    assert run["torch"] and run["argv"][0].endswith("ddptrain.py") and "git_commit" in run


@pytest.mark.slow  # a real smoke --local run (torchrun processes)
def test_collects_the_newest_then_skips_a_corrupt_one(run_dir, tmp_path):
    out = run_cli("collect", "c", "--to", str(tmp_path / "a"), cwd=run_dir)
    assert out.returncode == 0, out.stderr
    assert "step 6" in out.stderr
    _check(tmp_path / "a", 6)
    assert (tmp_path / "a" / "RUN.json").is_file()  # the trainer's sidecars carry a record
    picked = run_cli("collect", "c", "--to", str(tmp_path / "b"), "--step", "2", cwd=run_dir)
    assert picked.returncode == 0, picked.stderr
    _check(tmp_path / "b", 2)
    # Corrupt the newest payload: it is skipped with a warning, the next one is taken.
    src = run_dir / ".ddpdeploy" / "checkpoints" / "c"
    newest = json.loads((src / "ckpt-step-000000006.json").read_text())["file"]
    data = bytearray((src / newest).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (src / newest).write_bytes(bytes(data))
    out = run_cli("collect", "c", "--to", str(tmp_path / "c"), cwd=run_dir)
    assert out.returncode == 0, out.stderr
    assert "warning: checkpoint at step 6" in out.stderr and "corrupt" in out.stderr
    _check(tmp_path / "c", 4)
    named = run_cli("collect", "c", "--to", str(tmp_path / "d"), "--step", "6", cwd=run_dir)
    assert named.returncode == 1 and "no intact checkpoint" in named.stderr
    assert not (tmp_path / "d").exists()  # created for the copy, removed when none was made
    missing = run_cli("collect", "c", "--to", str(tmp_path / "e"), "--step", "99", cwd=run_dir)
    assert missing.returncode == 2 and "--step: no checkpoint at step 99" in missing.stderr
    other = run_cli("collect", "nope", "--to", str(tmp_path / "f"), "--from", "local", cwd=run_dir)
    assert other.returncode == 2 and "no checkpoint folder" in other.stderr


class _ExecFromFolder:
    """Stands in for the exec API (which needs a kubelet): runs the `sh` programs on a local
    folder and hands the bytes back in small, uneven chunks, as a websocket does."""

    def __init__(self, folder):
        self.folder = folder

    def exec_stream(self, pod, namespace, container, argv):
        import subprocess

        from ddpdeploy.errors import OperationError

        res = subprocess.run(argv, cwd=self.folder, capture_output=True)
        for i in range(0, len(res.stdout), 7):
            yield res.stdout[i : i + 7]
        if res.returncode:  # as Kube.exec_stream reports it
            raise OperationError(f"exit code {res.returncode}: {res.stderr.decode()[-300:]}")


def test_pod_source_reads_through_exec_chunks(tmp_path):
    from ddpdeploy.collect.checkpoint import collect
    from ddpdeploy.collect.pod import PodSource

    folder = tmp_path / "vol"
    folder.mkdir()
    for step in (3, 5):
        payload = bytes(range(256)) * (step * 10)
        (folder / f"ckpt-step-{step:09d}.pt").write_bytes(payload)
        meta = {"step": step, "sha256": hashlib.sha256(payload).hexdigest()}
        meta["file"] = f"ckpt-step-{step:09d}.pt"
        (folder / f"ckpt-step-{step:09d}.json").write_text(json.dumps(meta))
    (folder / "ckpt-step-000000007.pt").write_bytes(b"no sidecar: not a checkpoint")
    source = PodSource(_ExecFromFolder(folder), "j-worker-0", "ns", "pytorch", str(folder))
    warnings: list[str] = []
    assert collect(source, tmp_path / "out", None, warnings.append).step == 5
    assert warnings == []
    _check(tmp_path / "out", 5)


def test_run_record_is_the_sidecars_run_object_or_nothing():
    from ddpdeploy.collect.checkpoint import Sidecar, run_record

    base = {"step": 4, "sha256": "a" * 64}
    for not_a_record in ({}, {"run": "x"}, {"run": [1, 2]}, {"run": None}):
        assert run_record(Sidecar.model_validate({**base, **not_a_record}), "p.pt") is None
    got = run_record(Sidecar.model_validate({**base, "run": {"seed": 3, "step": 99}}), "p.pt")
    assert got is not None and got.endswith(b"\n")
    # Ours win over the record's own fields: the step is the checkpoint's.
    assert json.loads(got) == {"seed": 3, "step": 4, "checkpoint": "p.pt",
                               "checkpoint_sha256": "a" * 64}  # fmt: skip
