"""`ddpdeploy collect NAME --to DIR`: copy a run's newest intact checkpoint to local disk."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ddpdeploy.commands.options import ContextOpt, KubeconfigOpt, NameArg, NamespaceOpt
from ddpdeploy.errors import UserError
from ddpdeploy.formats import size

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from ddpdeploy.checkpoints import Collected, Source

SOURCES = ("local", "compose", "cluster")


def collect(
    name: NameArg,
    to: Annotated[Path, typer.Option("--to", help="Folder to copy the checkpoint into.")],
    step: Annotated[
        int | None, typer.Option("--step", min=0, help="This step instead of the newest.")
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="local (a `smoke --local` run's .ddpdeploy/checkpoints/NAME), compose (a "
            "Docker volume: --volume) or cluster; default: local when that folder exists.",
        ),
    ] = None,
    files: Annotated[
        list[str] | None,
        typer.Option(
            "--file",
            help="Collect only this plain file of the folder (repeatable); default: the "
            "newest ddpdeploy checkpoint, else every regular file.",
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace files in --to that differ (default: refuse)."),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Also (with no checkpoint yet: only) bring the diagnostics files into "
            "--to/debug/: hang stacks, NCCL flight recorder dumps, NCCL debug logs.",
        ),
    ] = False,
    volume: Annotated[
        str | None, typer.Option("--volume", help="--from compose: the checkpoint volume.")
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            help="--from compose: a local image to mount the volume with; --from cluster: "
            "the helper pod's image (default: the job's own).",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for the helper pod to start.")
    ] = 300,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Copy a job's newest intact checkpoint (sha256 checked) into a folder.

    A folder without ddpdeploy checkpoints (any script's own files) is collected as plain
    files, each checked complete, with a SHA256SUMS beside them. Nothing in --to is replaced
    unless --overwrite. --debug brings the run's hang stacks, flight recorder dumps and
    NCCL debug logs too, into --to/debug/ (each at most 32 MiB).

    Example: ddpdeploy collect ddp-train --to ./ckpt --debug
    """
    from rich.console import Console

    from ddpdeploy import checkpoints
    from ddpdeploy.paths import local_checkpoints

    local_rel = local_checkpoints(name)
    err = Console(stderr=True, highlight=False)
    source = _source(source, local_rel, err)
    checkpoints.Destination(to, overwrite).check()  # before anything is read or started
    with _copy_bar(err) as bar:
        warn = _warner(bar)
        copy = _copier(bar, to, step, files or (), overwrite, debug, warn)
        if source == "local":
            got = copy(checkpoints.LocalSource(local_rel.resolve(), str(local_rel)))
        elif source == "compose":
            got = _from_compose(volume, image, to, copy, warn, debug)
        else:
            got = _from_cluster(name, namespace, kubeconfig, context, timeout, image, copy)
    if got.no_checkpoint:
        _say(err, f"no checkpoint in {got.where} yet: collected the diagnostics only")
    else:
        _say(err, f"collected {got.describe()} into {to}")
    if debug:
        _say_debug(err, got, to)


def _source(source: str | None, local_rel: Path, err: Console) -> str:
    """--from as given, else local when the local run's folder is here (said in a line)."""
    if source is None:
        if not local_rel.resolve().is_dir():
            raise UserError(
                f"--from: no local run's folder {local_rel} here; pass --from cluster for a "
                "job on the cluster, or --from compose --volume VOLUME for a compose run"
            )
        source = "local"
        err.print(
            f"collect: reading the local run's folder {local_rel} (--from local)", markup=False
        )
    if source not in SOURCES:
        raise UserError(f"--from: {source!r} is not a source; use local, compose or cluster")
    return source


def _copy_bar(err: Console) -> Progress:
    """The copy's progress bar on stderr: bytes and speed, gone when done."""
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    return Progress(
        *Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn(),
        console=err, transient=True, disable=not err.is_terminal,  # no bar into a log
    )  # fmt: skip


def _warner(bar: Progress) -> Callable[[str], None]:
    """A warning line above the bar."""

    def warn(text: str) -> None:
        # markup=False: names and reasons come from the folder, which may hold `[`.
        bar.console.print(f"warning: {text}", markup=False, soft_wrap=True)

    return warn


def _copier(
    bar: Progress,
    to: Path,
    step: int | None,
    files: Sequence[str],
    overwrite: bool,
    debug: bool,
    warn: Callable[[str], None],
) -> Callable[[Source], Collected]:
    """Collect from a source into --to, its bytes counted on ``bar``."""
    from ddpdeploy import checkpoints

    task = bar.add_task("copying", total=None)

    def copy(src: Source) -> Collected:
        return checkpoints.collect(
            src,
            to,
            step,
            warn=warn,
            progress=lambda n: bar.advance(task, n),
            files=files,
            overwrite=overwrite,
            debug=debug,
        )

    return copy


def _say(err: Any, text: str) -> None:
    # markup=False, soft_wrap: names and text come from the folder, which may hold `[`.
    err.print(text, markup=False, soft_wrap=True)


def _say_debug(err: Any, got: Any, to: Path) -> None:
    """One line per diagnostics file (a hang stack's header shown), then the count."""
    from ddpdeploy.checkpoints import DEBUG_DIR, DEBUG_PATTERNS, HANG_STACK, MAX_DEBUG, shown
    from ddpdeploy.text import plain

    folder = to / DEBUG_DIR
    if not got.debug:
        _say(err, f"debug: no diagnostics files in {got.where} ({DEBUG_PATTERNS})")
        return
    for f in got.debug:
        line = f"debug: {folder / shown(f.name)}  {size(f.size)}  {f.kind}"
        if f.cut:
            line += f" (cut at {MAX_DEBUG >> 20} MiB)"
        if f.kind == HANG_STACK and f.first_line:
            head = plain(f.first_line)
            line += f": {head if len(head) <= 160 else head[:150] + '…'}"
        _say(err, line)
    _say(err, f"debug: {got.debug_summary()} into {folder}")


def _from_compose(
    volume: str | None,
    image: str | None,
    to: Path,
    copy: Callable[[Source], Collected],
    warn: Callable[[str], None],
    debug: bool,
) -> Collected:
    """Collect from the compose run's checkpoint volume, staged beside --to."""
    from ddpdeploy.volumecollect import volume_source

    if not volume:
        raise UserError("--volume: name the compose run's checkpoint volume (docker volume ls)")
    with volume_source(volume, image, to, debug, warn) as src:
        return copy(src)


def _from_cluster(
    name: str,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    timeout: float,
    image: str | None,
    copy: Callable[[Source], Collected],
) -> Collected:
    from ddpdeploy.cluster.apply import saved_spec_of
    from ddpdeploy.cluster.collect import pod_source
    from ddpdeploy.cluster.find import open_job

    found = open_job(kubeconfig, context, name, namespace, verb="read", required=False)
    spec = saved_spec_of(found)
    with pod_source(found.kube, spec, timeout, image) as src:
        return copy(src)
