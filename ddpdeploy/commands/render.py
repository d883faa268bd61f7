"""`ddpdeploy render`: the job's Kubernetes manifests, to stdout or a GitOps folder."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ddpdeploy.commands.options import ObjectsOutput, spec_command
from ddpdeploy.formats import counted

if TYPE_CHECKING:
    from ddpdeploy.spec import JobSpec


@spec_command
def render(
    spec: JobSpec,
    output: ObjectsOutput = "yaml",
    out_dir: Annotated[
        str | None,
        typer.Option(
            "--out-dir",
            metavar="DIR",
            help="Write one file per object plus kustomization.yaml here; files you keep "
            "beside them are left alone.",
        ),
    ] = None,
) -> None:
    """Render the job's Kubernetes objects for its target (PyTorchJob, TrainJob, or Indexed
    Job and headless Service), its NetworkPolicy and the checkpoint PVC.

    Example: ddpdeploy render --image ghcr.io/me/train:v1 --nodes 2 --gpus 8 -- --steps 1000
    """
    from ddpdeploy.adapters.out_dir import write_folder
    from ddpdeploy.adapters.stdout import write_stdout
    from ddpdeploy.render.output import folder_files, to_text
    from ddpdeploy.targets import render_objects

    objects = render_objects(spec)
    if out_dir is not None:
        files = folder_files(objects)
        write_folder(out_dir, files)
        typer.echo(f"wrote {counted(len(files), 'file')} to {out_dir}", err=True)
        return
    write_stdout(to_text(objects, output))
