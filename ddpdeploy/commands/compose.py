"""`ddpdeploy compose`: the job as a docker-compose project, to stdout or a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ddpdeploy.errors import UserError
from ddpdeploy.options import spec_command
from ddpdeploy.render.compose import render_compose
from ddpdeploy.render.output import to_yaml
from ddpdeploy.spec import JobSpec


@spec_command
def compose(
    spec: JobSpec,
    cpu: Annotated[
        bool | None,
        typer.Option(
            "--cpu/--gpu",
            help="CPU (gloo, no GPU reservations) or GPUs as the spec asks; "
            "default: --cpu when gpus is 0.",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the compose file here instead of stdout.")
    ] = None,
) -> None:
    """Render the job as a docker-compose file: one service per node, named like its pod,
    with the env the cluster's operator would give it.

    Example: ddpdeploy compose --image ghcr.io/me/train:v1 --nodes 2 --procs 2 --out compose.yaml
    """
    text = to_yaml(render_compose(spec, cpu))
    if out is None:
        typer.echo(text, nl=False)
        return
    # Beside the target, then renamed over it: a failed write leaves no half a file.
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"--out: cannot write {out}: {exc}") from None
    typer.echo(f"wrote {out}", err=True)
