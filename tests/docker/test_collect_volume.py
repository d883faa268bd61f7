"""`ddpdeploy collect --from compose`: checkpoints out of a Docker named volume, through a
real engine."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _link(tar: tarfile.TarFile, name: str, kind: bytes, target: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    tar.addfile(info)


def _checkpoint_tar(hostile: bool = False) -> bytes:
    """Steps 2 and 4 in the trainer's layout; step 4's payload fails its sha256. ``hostile``
    adds what a volume may hold and collect must neither follow nor crash on: symlinks
    (absolute, relative, one posing as step 6's payload), a FIFO, a hard link, a subfolder."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if hostile:
            _link(tar, "etc-passwd", tarfile.SYMTYPE, "/etc/passwd")
            _link(tar, "latest", tarfile.SYMTYPE, "ckpt-step-000000002.pt")
            _link(tar, "ckpt-step-000000006.pt", tarfile.SYMTYPE, "/etc/hostname")
            meta6 = {"step": 6, "sha256": "0" * 64}
            info = tarfile.TarInfo("ckpt-step-000000006.json")
            info.size = len(json.dumps(meta6))
            tar.addfile(info, io.BytesIO(json.dumps(meta6).encode()))
            _link(tar, "pipe", tarfile.FIFOTYPE)
            info = tarfile.TarInfo("sub/inner.pt")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
        for step in (2, 4):
            payload = os.urandom(300_000)
            meta = {"step": step, "sha256": hashlib.sha256(payload).hexdigest()}
            meta["file"] = f"ckpt-step-{step:09d}.pt"
            if step == 4:
                payload = payload[:-1] + bytes([payload[-1] ^ 1])
            for name, data in (
                (meta["file"], payload),
                (f"ckpt-step-{step:09d}.json", json.dumps(meta).encode()),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        if hostile:
            _link(tar, "hard", tarfile.LNKTYPE, "ckpt-step-000000002.json")
    return buf.getvalue()


@pytest.fixture(params=[False, True], ids=["plain", "hostile"])
def volume(engine, base_image, request):
    """A named volume holding checkpoints, and the stopped container that wrote them (as a
    finished compose run leaves them)."""
    name = f"ddpdeploy-test-collect-{os.getpid()}-{int(request.param)}"
    vol = engine.volumes.create(name)
    writer = engine.containers.create(base_image, command=["true"], volumes={name: {"bind": "/v"}})
    try:
        assert writer.put_archive("/v", _checkpoint_tar(request.param))
        yield name
    finally:
        writer.remove(force=True)
        vol.remove(force=True)


def test_collect_from_a_compose_volume(cli, engine, volume, tmp_path):
    def users() -> set[str]:  # the engine is shared: look only at our volume's containers
        return {c.id for c in engine.containers.list(all=True, filters={"volume": volume})}

    before = users()
    dest = tmp_path / "out"
    out = cli("collect", "job", "--from", "compose", "--volume", volume, "--to", str(dest))
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "warning: checkpoint at step 4 in volume" in out.stderr
    if volume.endswith("-1"):  # the hostile one: each odd entry said in one line, skipped
        for entry in ("etc-passwd", "latest", "ckpt-step-000000006.pt", "pipe", "hard"):
            assert f"warning: skipping {entry} in volume {volume}: a " in out.stderr
        assert "checkpoint at step 6 in volume" in out.stderr
    assert "step 2" in out.stderr.strip().splitlines()[-1]
    meta = json.loads((dest / "ckpt-step-000000002.json").read_text())
    payload = (dest / meta["file"]).read_bytes()
    assert hashlib.sha256(payload).hexdigest() == meta["sha256"]
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [meta["file"], "ckpt-step-000000002.json"]
    )
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the staging folder is gone
    assert users() == before  # the reader container is removed
    missing = cli("collect", "job", "--from", "compose", "--volume", "no-such-vol", "--to", "x")
    assert missing.returncode == 2 and "no Docker volume named no-such-vol" in missing.stderr
    args = ["--volume", volume, "--image", "ddpdeploy-test/no-such-image:1", "--to", str(dest)]
    no_image = cli("collect", "job", "--from", "compose", *args)
    assert no_image.returncode == 2, no_image.stderr
    assert no_image.stderr.strip().splitlines() == [
        "error: --image: no local image ddpdeploy-test/no-such-image:1; name an image this "
        "engine has (`docker images`)"
    ]


def test_collect_plain_files_from_a_volume(cli, engine, base_image, tmp_path):
    """A script's own snapshot (no sidecars): copied as a plain file with SHA256SUMS."""
    name = f"ddpdeploy-test-collect-plain-{os.getpid()}"
    vol = engine.volumes.create(name)
    writer = engine.containers.create(base_image, command=["true"], volumes={name: {"bind": "/v"}})
    payload = os.urandom(200_000)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("snapshot.pt")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    try:
        assert writer.put_archive("/v", buf.getvalue())
        dest = tmp_path / "out"
        out = cli("collect", "job", "--from", "compose", "--volume", name, "--to", str(dest))
        assert out.returncode == 0, out.stderr
        assert f"collected 1 plain file (with SHA256SUMS) from volume {name}" in out.stderr
        assert (dest / "snapshot.pt").read_bytes() == payload
        sums = (dest / "SHA256SUMS").read_text()
        assert sums == f"{hashlib.sha256(payload).hexdigest()}  snapshot.pt\n"
    finally:
        writer.remove(force=True)
        vol.remove(force=True)


def test_collect_debug_from_a_volume(cli, engine, base_image, tmp_path):
    """--debug: the stacks, a dump and an NCCL log come into --to/debug/; a 40 MB stack is cut
    at the bound (and staged no further), a symlink posing as a stack is refused."""
    from ddpdeploy.collect.debug import MAX_DEBUG

    name = f"ddpdeploy-test-collect-debug-{os.getpid()}"
    vol = engine.volumes.create(name)
    writer = engine.containers.create(base_image, command=["true"], volumes={name: {"bind": "/v"}})
    files = {
        "hang-rank0.txt": b"# ddpkit hang watchdog: rank 0 on [red]n0[/]\nThread 0x1\n",
        "hang-rank1.txt": b"# ddpkit hang watchdog: rank 1 on n0\nThread 0x2\n",
        "nccl_trace_rank_1": os.urandom(4000),
        "ddpkit-nccl.n0.77.log": b"n0:77 NCCL INFO Bootstrap : Using eth0\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for entry, data in {**files, "hang-rank2.txt": b"# big\n" * (7 << 20)}.items():
            info = tarfile.TarInfo(entry)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        _link(tar, "hang-rank3.txt", tarfile.SYMTYPE, "/etc/passwd")
    try:
        assert writer.put_archive("/v", buf.getvalue())
        dest = tmp_path / "out"
        args = ["--from", "compose", "--volume", name, "--to", str(dest), "--debug"]
        out = cli("collect", "job", *args)
        assert out.returncode == 0, out.stderr
        err = out.stderr
        assert f"warning: skipping hang-rank3.txt in volume {name}: a symlink" in err
        assert f"hang-rank2.txt in volume {name} is over 32 MiB: cut there" in err
        assert f"no checkpoint in volume {name} yet: collected the diagnostics only" in err
        assert "hang stack: # ddpkit hang watchdog: rank 0 on [red]n0[/]" in err
        assert err.strip().splitlines()[-1] == (
            f"debug: 3 hang stacks, 1 flight recorder dump, 1 NCCL debug log into {dest}/debug"
        )
        got = {p.name: p.read_bytes() for p in (dest / "debug").iterdir()}
        cut = got.pop("hang-rank2.txt")
        assert got == files
        assert len(cut) > MAX_DEBUG and cut.startswith(b"# big\n") and b"cut here" in cut[-80:]
        assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the staging folder is gone
    finally:
        writer.remove(force=True)
        vol.remove(force=True)
