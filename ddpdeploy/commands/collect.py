"""`ddpdeploy collect NAME --to DIR`: copy the newest intact rank-0 checkpoint to local disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ddpdeploy.errors import UserError
from ddpdeploy.kubeopts import ContextOpt, KubeconfigOpt, NamespaceOpt

SOURCES = ("local", "compose", "cluster")


def collect(
    name: Annotated[str, typer.Argument(help="The job's name.", show_default=False)],
    to: Annotated[Path, typer.Option("--to", help="Folder to copy the checkpoint into.")],
    step: Annotated[
        int | None, typer.Option("--step", min=0, help="This step instead of the newest.")
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="local (a `smoke --local` run in this folder), compose (a Docker volume: "
            "--volume) or cluster; default: local when .ddpdeploy/checkpoints/NAME exists, "
            "else cluster.",
        ),
    ] = None,
    volume: Annotated[
        str | None, typer.Option("--volume", help="--from compose: the checkpoint volume.")
    ] = None,
    image: Annotated[
        str | None,
        typer.Option("--image", help="--from compose: a local image to mount the volume with."),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for the helper pod to start.")
    ] = 300,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Copy a job's newest intact checkpoint (sha256 checked) into a folder.

    Example: ddpdeploy collect ddp-train --to ./ckpt
    """
    from rich.console import Console
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    from ddpdeploy import checkpoints

    local = Path(".ddpdeploy", "checkpoints", name).resolve()
    source = source or ("local" if local.is_dir() else "cluster")
    if source not in SOURCES:
        raise UserError(f"--from: {source!r} is not a source; use local, compose or cluster")
    with Progress(
        *Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn(),
        console=Console(stderr=True), transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("copying", total=None)

        def copy(src: checkpoints.Source) -> int:
            return checkpoints.collect(
                src,
                to,
                step,
                warn=lambda text: bar.console.print(f"warning: {text}"),
                progress=lambda n: bar.advance(task, n),
            )

        if source == "local":
            got = copy(checkpoints.LocalSource(local))
        elif source == "compose":
            got = _from_compose(volume, image, to, copy)
        else:
            got = _from_cluster(name, namespace, kubeconfig, context, timeout, copy)
    typer.echo(f"collected the checkpoint at step {got} into {to}", err=True)


def _from_compose(
    volume: str | None, image: str | None, to: Path, copy: Callable[[Any], int]
) -> int:
    """Stage the volume's files beside the target folder, then collect from there."""
    import tempfile

    from ddpdeploy.adapters.docker_volume import copy_out
    from ddpdeploy.checkpoints import LocalSource

    if not volume:
        raise UserError("--volume: name the compose run's checkpoint volume (docker volume ls)")
    to.resolve().parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".collect-", dir=to.resolve().parent) as staging:
        copy_out(volume, ".", Path(staging), image)
        src = LocalSource(Path(staging))
        src.where = f"volume {volume}"
        return copy(src)


def _from_cluster(
    name: str,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    timeout: float,
    copy: Callable[[Any], int],
) -> int:
    from ddpdeploy.clustercollect import pod_source
    from ddpdeploy.deploy import saved_spec_of
    from ddpdeploy.kubeopts import connect

    kube = connect(kubeconfig, context)
    spec = saved_spec_of(kube, name, namespace or kube.default_namespace)
    with pod_source(kube, spec, timeout) as src:
        return copy(src)
