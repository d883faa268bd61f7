"""`ddpdeploy collect NAME --to DIR`: copy a run's newest intact checkpoint to local disk."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ddpdeploy.commands.options import (
    ContextOpt,
    KubeconfigOpt,
    NameArg,
    NamespaceOpt,
    count_option,
    grammar_error,
    number_option,
    seconds_above_0,
)
from ddpdeploy.errors import UserError
from ddpdeploy.formats import size

if TYPE_CHECKING:
    from ddpdeploy.collect.checkpoint import Collected
    from ddpdeploy.collect.source import Source
    from ddpdeploy.commands.console import ConsoleReport

    pass


SOURCES = ("local", "compose", "cluster")


def collect(
    name: NameArg,
    to_: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="DIR",
            help="Folder to copy the checkpoint into.",
        ),
    ],
    step: Annotated[
        int | None,
        count_option("--step", minimum=0, help="This step instead of the newest."),
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
        str | None,
        typer.Option(
            "--volume", help="--from compose: the checkpoint volume (implies --from compose)."
        ),
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
        float,
        number_option(
            "--timeout",
            callback=seconds_above_0,
            help="Seconds to wait for the helper pod to start.",
        ),
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
    from ddpdeploy.collect.debug import check_debug_folder
    from ddpdeploy.collect.destination import Destination
    from ddpdeploy.commands.console import ConsoleReport
    from ddpdeploy.paths import local_checkpoints

    to = _checked_flags(to_, source, files or [], volume, image)
    local_rel = local_checkpoints(name)
    report = ConsoleReport()
    source = _source("compose" if source is None and volume else source, local_rel, report)
    _check_not_ours(to)
    Destination(to, overwrite).check()  # before anything is read or started
    if debug:
        check_debug_folder(to)  # --to/debug: a folder or nothing, before a helper pod starts
    copy = _copier(report, to, step, files or (), overwrite, debug)
    if source == "local":
        got = _from_local(local_rel, copy)
    elif source == "compose":
        got = _from_compose(volume, image, to, copy, report, debug)
    else:
        got = _from_cluster(name, namespace, kubeconfig, context, timeout, image, copy, report.warn)
    if got.no_checkpoint:
        report.say(f"no checkpoint in {got.where} yet: collected the diagnostics only")
    else:
        report.say(f"collected {got.describe()} into {to}")
    if debug:
        _say_debug(report, got, to)


def _checked_flags(
    to: str, source: str | None, files: list[str], volume: str | None, image: str | None
) -> Path:
    """The flags no source reads alike, checked before anything is read: --to as a Path."""
    if not to.strip():
        # Path("") is the current folder: collect would fill it without being asked to.
        raise UserError("--to: give the folder to collect into (e.g. --to ./ckpt)")
    if any(not f for f in files):
        raise UserError("--file: an empty name; give a file name of the checkpoint folder")
    if source is not None and source not in SOURCES:
        raise UserError(f"--from: {source!r} is not a source; use local, compose or cluster")
    if volume is not None and source not in (None, "compose"):
        raise UserError(f"--volume: only --from compose reads a volume, not --from {source}")
    if image is not None and source == "local":
        raise UserError("--image: --from local starts no container; drop --image")
    if image is not None and source == "cluster":
        _check_image(image)  # else the helper pod is made, then waits on an unpullable name
    return Path(to)


def _check_image(image: str) -> None:
    """--image for the cluster's helper pod: the spec's own image-reference rule, as `up`."""
    from ddpdeploy.spec import ImageRef

    if (reason := grammar_error(ImageRef, image)) is not None:
        raise UserError(f"--image: {reason}")


def _check_not_ours(to: Path) -> None:
    """--to may not be in ddpdeploy's own folder here: smoke --local empties the checkpoint
    folders in it (the local source among them) and sets files aside there."""
    from ddpdeploy.paths import OWN_DIR

    own = os.path.realpath(OWN_DIR)
    if os.path.commonpath([own, os.path.realpath(to)]) == own:
        raise UserError(
            f"--to: {to} is inside ddpdeploy's own folder {OWN_DIR}, which smoke --local "
            "empties; collect into a folder outside it (e.g. --to ./ckpt)"
        )


def _source(source: str | None, local_rel: Path, report: ConsoleReport) -> str:
    """--from as given, else local when the local run's folder is here (said in a line)."""
    if source is None:
        if not local_rel.resolve().is_dir():
            raise UserError(
                f"--from: no local run's folder {local_rel} here; pass --from cluster for a "
                "job on the cluster, or --from compose --volume VOLUME for a compose run"
            )
        source = "local"
        report.say(f"collect: reading the local run's folder {local_rel} (--from local)")
    if source not in SOURCES:
        raise UserError(f"--from: {source!r} is not a source; use local, compose or cluster")
    return source


def _copier(
    report: ConsoleReport,
    to: Path,
    step: int | None,
    files: Sequence[str],
    overwrite: bool,
    debug: bool,
) -> Callable[[Source], Collected]:
    """Collect from a source into --to, its bytes counted on the report's bar."""
    from ddpdeploy.collect import checkpoint

    def copy(src: Source) -> Collected:
        return checkpoint.collect(
            src, to, step, report, files=files, overwrite=overwrite, debug=debug
        )

    return copy


def _say_debug(report: ConsoleReport, got: Collected, to: Path) -> None:
    """One line per diagnostics file (a hang stack's header shown), then the count."""
    from ddpdeploy.collect.debug import DEBUG_DIR, DEBUG_PATTERNS, HANG_STACK, MAX_DEBUG
    from ddpdeploy.collect.source import shown
    from ddpdeploy.text import plain

    folder = to / DEBUG_DIR
    if not got.debug:
        report.say(f"debug: no diagnostics files in {got.where} ({DEBUG_PATTERNS})")
        return
    for f in got.debug:
        line = f"debug: {folder / shown(f.name)}  {size(f.size)}  {f.kind}"
        if f.cut:
            line += f" (cut at {MAX_DEBUG >> 20} MiB)"
        if f.kind == HANG_STACK and f.first_line:
            head = plain(f.first_line)
            line += f": {head if len(head) <= 160 else head[:150] + '…'}"
        report.say(line)
    report.say(f"debug: {got.debug_summary()} into {folder}")


def _from_local(local_rel: Path, copy: Callable[[Source], Collected]) -> Collected:
    """The local run's folder; when it holds nothing to collect, the files the last local
    run wrote in the workspace instead (a tutorial's relative snapshot.pt) are named."""
    from ddpdeploy.collect.source import LocalSource, NoCheckpoint
    from ddpdeploy.smoke.local import recorded
    from ddpdeploy.text import plain

    try:
        return copy(LocalSource(local_rel.resolve(), str(local_rel)))
    except NoCheckpoint as exc:
        there = sorted(p for p in recorded(Path.cwd()) if Path(p).is_file())
        if not there:
            raise
        more = f" and {len(there) - 1} more" if len(there) > 1 else ""
        raise NoCheckpoint(
            f"{exc}; the last smoke --local run wrote {plain(there[0])}{more} in the workspace "
            "instead: save under $DDPDEPLOY_CHECKPOINT_DIR, which is this folder"
        ) from None


def _from_compose(
    volume: str | None,
    image: str | None,
    to: Path,
    copy: Callable[[Source], Collected],
    report: ConsoleReport,
    debug: bool,
) -> Collected:
    """Collect from the compose run's checkpoint volume, staged beside --to."""
    from ddpdeploy.collect.volume import volume_source

    if not volume:
        raise UserError("--volume: name the compose run's checkpoint volume (docker volume ls)")
    with volume_source(volume, image, to, debug, report.warn) as src:
        return copy(src)


def _from_cluster(
    name: str,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    timeout: float,
    image: str | None,
    copy: Callable[[Source], Collected],
    note: Callable[[str], None],
) -> Collected:
    from ddpdeploy.cluster.apply import saved_spec_of
    from ddpdeploy.cluster.find import open_job
    from ddpdeploy.collect.pod import ContainerGone, pod_source

    found = open_job(kubeconfig, context, name, namespace, verb="read", required=False)
    spec = saved_spec_of(found)
    try:
        with pod_source(found.kube, spec, timeout, image, note=note) as src:
            return copy(src)
    except ContainerGone:  # its container ended under the read; --to is as it was
        with pod_source(found.kube, spec, timeout, image, job_pods=False, note=note) as src:
            return copy(src)
