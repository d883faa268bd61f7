"""`ddpdeploy collect --from compose`: checkpoints out of a Docker named volume, through a
real engine."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

pytestmark = pytest.mark.docker


def _checkpoint_tar() -> bytes:
    """Steps 2 and 4 in the trainer's layout; step 4's payload fails its sha256."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
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
    return buf.getvalue()


@pytest.fixture
def volume(engine, base_image):
    """A named volume holding checkpoints, and the stopped container that wrote them (as a
    finished compose run leaves them)."""
    name = f"ddpdeploy-test-collect-{os.getpid()}"
    vol = engine.volumes.create(name)
    writer = engine.containers.create(base_image, command=["true"], volumes={name: {"bind": "/v"}})
    try:
        assert writer.put_archive("/v", _checkpoint_tar())
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
    assert "warning: checkpoint at step 4 in volume" in out.stderr
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
