"""The docker target of `ddpdeploy smoke`: the job's compose file, run as a project.

`docker_target` returns the callable the smoke runner starts a run with (one fresh compose
project per run, so a --kill-at run and its clean run share nothing). The image is the
spec's (`--image`), or one `ddpdeploy build` makes for the current folder.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from ddpdeploy.adapters.compose import ComposeRun, compose_cli, engine
from ddpdeploy.errors import OperationError
from ddpdeploy.render.compose import render_compose
from ddpdeploy.spec import JobSpec

LOCAL_REPO = "ddpdeploy-smoke"  # where a smoke run's own build is tagged


def build_image(spec: JobSpec, base_image: str | None) -> str:
    """`ddpdeploy build` for this folder, its progress on our stderr; the reference."""
    cmd = [sys.executable, "-m", "ddpdeploy", "build", "--image", f"{LOCAL_REPO}/{spec.name}"]
    if base_image:
        cmd += ["--base-image", base_image]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        # build has said why on stderr, in one line.
        raise OperationError("the image build failed (see above); or pass a ready --image")
    return done.stdout.strip()


def docker_target(
    spec: JobSpec,
    *,
    base_image: str | None = None,
    keep_volume: bool = False,
    env: dict[str, str] | None = None,
    restarts: int | None = None,
) -> Callable[[], ComposeRun]:
    """Check the engine and compose CLI, get the image, and return ``start``.

    ``env`` is added to every node's env (the runner's torchrun output options);
    ``restarts`` sets torchrun's max restarts (a --kill-at run of a static job)."""
    client = engine()  # no engine: one line pointing to --local, before any build
    cli = compose_cli()
    extra = dict(env or {})
    if restarts is not None:
        extra["PET_MAX_RESTARTS"] = str(restarts)
    image = spec.image or build_image(spec, base_image)
    job = spec.model_copy(update={"image": image, "env": {**spec.env, **extra}})
    project = render_compose(job, cpu=True)

    def start() -> ComposeRun:
        return ComposeRun(project, job.name, keep_volume=keep_volume, client=client, cli=cli)

    return start
