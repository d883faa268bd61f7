"""`ddpdeploy compose`: the job as a docker-compose project, to stdout or a file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ddpdeploy.commands.options import spec_command

if TYPE_CHECKING:
    from ddpdeploy.spec import JobSpec


# Its --cpu/--gpu picks the devices; the spec's cpu (a pod's CPU request) means nothing to
# a compose project, so the spec flag --cpu is not taken here.
@spec_command(without=("cpu",))
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
    from ddpdeploy.adapters.stdout import write_stdout
    from ddpdeploy.fs import write_atomic
    from ddpdeploy.render.output import to_yaml
    from ddpdeploy.smoke.compose import render_compose, secret_env_note

    text = to_yaml(render_compose(spec, cpu))
    note = secret_env_note(spec)
    if note:
        typer.echo(f"compose: {note}", err=True)
    if out is None:
        write_stdout(text)
        return
    write_atomic(out, text.encode("utf-8"), "--out")
    typer.echo(f"wrote {out}", err=True)
