"""`ddpdeploy collect NAME --to DIR`: copy the newest intact rank-0 checkpoint to local disk."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ddpdeploy.errors import UserError


def collect(
    name: Annotated[str, typer.Argument(help="The job's name.", show_default=False)],
    to: Annotated[Path, typer.Option("--to", help="Folder to copy the checkpoint into.")],
    step: Annotated[
        int | None, typer.Option("--step", min=0, help="This step instead of the newest.")
    ] = None,
    source: Annotated[
        str,
        typer.Option(
            "--from", help="Where the job ran: local (a `smoke --local` run in this folder)."
        ),
    ] = "local",
) -> None:
    """Copy a job's newest intact checkpoint (sha256 checked) into a folder.

    Example: ddpdeploy collect ddp-train --to ./ckpt
    """
    from rich.console import Console
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    from ddpdeploy.checkpoints import LocalSource
    from ddpdeploy.checkpoints import collect as copy_checkpoint

    if source != "local":
        raise UserError(f"--from: {source!r} is not supported yet; use local")
    src = LocalSource(Path(".ddpdeploy", "checkpoints", name).resolve())
    with Progress(
        *Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("copying", total=None)
        got = copy_checkpoint(
            src,
            to,
            step,
            warn=lambda text: bar.console.print(f"warning: {text}"),
            progress=lambda n: bar.advance(task, n),
        )
    typer.echo(f"collected the checkpoint at step {got} into {to}", err=True)
