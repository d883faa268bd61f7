"""`ddpdeploy build`: the training image (base + requirements + trainer + your code)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ddpdeploy.commands.options import spec_command

if TYPE_CHECKING:
    from ddpdeploy.spec import JobSpec


@spec_command
def build(
    spec: JobSpec,
    workspace: Annotated[
        Path,
        typer.Option(
            "-w", "--workspace", help="Folder with your code (the build context).", file_okay=False
        ),
    ] = Path("."),
    base_image: Annotated[
        str | None,
        typer.Option(
            "--base-image",
            help="Base image with Python and torch "
            "(default: pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime).",
        ),
    ] = None,
    push: Annotated[
        bool, typer.Option("--push", help="Push to the registry; print repo@sha256:… instead.")
    ] = False,
    system_packages: Annotated[
        str | None,
        typer.Option(
            "--system-packages",
            metavar="'PKG ...'",
            help="apt packages to install in the image (needs network in the build).",
        ),
    ] = None,
    network: Annotated[
        str | None,
        typer.Option("--network", help="Network for RUN steps, e.g. none or host."),
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every layer.")] = False,
) -> None:
    """Build the training image and print its reference on stdout.

    The tag comes from the content (git revision + context hash): same inputs, same tag.

    Progress goes to stderr; with --push, stdout gets repo@sha256:… to pin in manifests.

    Example: ddpdeploy render --image "$(ddpdeploy build --image ghcr.io/me/train --push)"
    """
    from ddpdeploy.adapters.stdout import write_stdout
    from ddpdeploy.commands.console import ConsoleReport
    from ddpdeploy.image.build import build_image

    built = build_image(
        spec,
        workspace=workspace,
        base_image=base_image,
        push=push,
        system_packages=system_packages,
        network=network,
        no_cache=no_cache,
        report=ConsoleReport(),
    )
    write_stdout(built.reference + "\n")
