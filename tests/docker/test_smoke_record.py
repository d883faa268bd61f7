"""`smoke --docker` records what ran: the compose containers get the spec's sha256, the
image and the engine's ID of the image that ran, and `collect --from compose` writes them
into RUN.json beside the checkpoint."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpdeploy.commands.options import spec_from_flags
from ddpdeploy.smoke.composerun import PROJECT_LABEL
from ddpdeploy.smoke.launch import with_steps
from ddpdeploy.spec import spec_sha256, spec_with

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_collect_from_compose_writes_the_record_of_what_ran(
    torch_image: str,
    engine: Any,
    cli: Callable[..., Any],
    tmp_path: Path,
    cleanup_images: list[str],
) -> None:
    job = f"srec{os.getpid()}"
    repo = f"ddpdeploy-smoke/{job}"
    cleanup_images.append(repo)
    spec_file = tmp_path / "ddpdeploy.yaml"
    spec_file.write_text(
        f"name: {job}\ncheckpoint: {{claimName: local}}\n"
        "command: {args: [--checkpoint-every, '2']}\n"
    )
    flags = ["--nodes", "2", "--procs", "1"]
    res = cli("smoke", "--docker", "--base-image", torch_image, "--keep-volume", *flags,
              "--steps", "4", cwd=tmp_path)  # fmt: skip
    volumes = [
        v
        for v in engine.volumes.list()
        if (v.attrs.get("Labels") or {}).get(PROJECT_LABEL, "").startswith(f"ddpdeploy-{job}-")
    ]
    try:
        assert res.returncode == 0, res.stderr[-3000:]
        assert len(volumes) == 1, [v.name for v in volumes]
        (built,) = engine.images.list(name=repo)  # ask the engine which image ran
        (ref,) = built.tags
        dest = tmp_path / "out"
        out = cli("collect", job, "--from", "compose", "--volume", volumes[0].name,
                  "--image", ref, "--to", str(dest), cwd=tmp_path)  # fmt: skip
        assert out.returncode == 0, out.stderr
        run = json.loads((dest / "RUN.json").read_text())
    finally:
        for volume in volumes:
            volume.remove(force=True)
    # The spec as smoke ran it: the file, its flags, --steps, and the image it built.
    asked = spec_from_flags(spec_file, {"--nodes": 2, "--procs": 1})
    ran = spec_with(with_steps(asked, 4), image=ref)
    assert run["spec_sha256"] == spec_sha256(ran)
    assert run["image"] == ref
    assert run["image_digest"] == built.id and built.id.startswith("sha256:")
    assert run["world_size"] == 2 and run["seed"] == 0 and run["step"] == 4
    assert run["torch"].startswith("2.") and run["python"]
    assert run["argv"][0].endswith("ddptrain.py") and "--steps" in run["argv"]
