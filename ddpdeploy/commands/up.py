"""`ddpdeploy up`: preflight, server-side dry run, apply, then (optionally) wait and follow."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ddpdeploy.commands.options import CLUSTER_PANEL, ContextOpt, KubeconfigOpt, spec_command
from ddpdeploy.errors import UserError
from ddpdeploy.formats import parse_duration
from ddpdeploy.text import show

if TYPE_CHECKING:
    from ddpdeploy.adapters.kube import Kube
    from ddpdeploy.contract import RunRecord
    from ddpdeploy.spec import JobSpec


@spec_command
def up(
    spec: JobSpec,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    create_namespace: Annotated[
        bool,
        typer.Option(
            "--create-namespace",
            help="Create the namespace when it is missing.",
            rich_help_panel=CLUSTER_PANEL,
        ),
    ] = False,
    replace: Annotated[
        bool,
        typer.Option("--replace", help="Delete and recreate a job of the same name (ours only)."),
    ] = False,
    adopt_pvc: Annotated[
        bool,
        typer.Option(
            "--adopt-pvc",
            help="Use an existing PVC <name>-checkpoints that ddpdeploy did not create, as is "
            "(never relabelled or deleted; like naming it as checkpoint.claimName); the job's "
            "saved spec goes on it as annotations of ours, for `resume` after `down`.",
            rich_help_panel=CLUSTER_PANEL,
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Stop after the server-side dry run; change nothing."),
    ] = False,
    wait: Annotated[
        bool | None,
        typer.Option("--wait/--no-wait", help="Watch the job to its end (default on a terminal)."),
    ] = None,
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout",
            help="Give up waiting after this long (90s, 15m): for the job's end, and with "
            "--replace for the old job to be deleted (default 2m).",
        ),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Stream the logs of the pod hosting global rank 0.")
    ] = False,
    build: Annotated[
        bool,
        typer.Option(
            "--build",
            help="First build the current folder into the spec's image repository and push "
            "it (a cluster cannot pull a local image, so --build always pushes, even with "
            "--dry-run); the job runs the pushed repo@sha256:….",
        ),
    ] = False,
    base_image: Annotated[
        str | None, typer.Option("--base-image", help="With --build: the base image to build on.")
    ] = None,
) -> None:
    """Submit the job to the cluster as its target's objects (PyTorchJob by default).

    Namespace: -n, else the spec's namespace:, else the kubeconfig context's, else default.

    Example: ddpdeploy up --image ghcr.io/me/train:v1 --nodes 2 --gpus 8 -- --steps 1000
    """
    from ddpdeploy.cluster import apply as deploy
    from ddpdeploy.signals import nothing_changed_on_interrupt

    seconds = None if timeout is None else parse_duration(timeout)
    if seconds is not None and seconds <= 0:
        # 0 gave up at once: the job made, then "timed out after 0s" (and with --replace,
        # the old job's deletion too), exit 1.
        raise UserError(
            f"--timeout: {show(timeout)} is no time to wait; give a duration above 0 (90s, "
            "15m), or leave --timeout out for 2m"
        )
    ns_given = "namespace" in spec.model_fields_set  # -n or the spec file; else the context's
    spec, record = _with_image(spec, build, base_image)
    kube, spec = _connect(spec, ns_given, kubeconfig, context)
    with nothing_changed_on_interrupt():
        if adopt_pvc:
            spec = deploy.adopt_pvc(kube, spec, _say)
        checked = deploy.prepare(kube, spec, _say, create_namespace, record)
        if dry_run:
            deploy.dry_run(kube, checked, replace, _say)
            return
        bound = deploy.DELETE_TIMEOUT if seconds is None else seconds
        # Inside: an interrupt before apply's first change changed nothing; one after it,
        # apply says what it left.
        deploy.apply(kube, checked, replace, _say, delete_timeout=bound)
    if wait is None:
        wait = sys.stdout.isatty()
    if not (wait or follow):
        _say(f"submitted; `ddpdeploy status {spec.name} -n {spec.namespace}` shows progress")
        return
    _wait(kube, spec, seconds, follow)


def _say(text: str) -> None:
    """A line of ours on stderr (the views load on first use: start-up time)."""
    from ddpdeploy.commands.views import say

    say(text)


def _with_image(
    spec: JobSpec, build: bool, base_image: str | None
) -> tuple[JobSpec, RunRecord | None]:
    """The spec with the image the job runs, and what is known of it beyond its reference:
    only a build's (--build pushes, and the pods are told the digest and commit)."""
    if base_image is not None and not build:
        raise UserError("--base-image: only used with --build; add --build or drop it")
    if not build:
        return spec, None
    from ddpdeploy.commands.console import ConsoleReport
    from ddpdeploy.image.build import build_image
    from ddpdeploy.spec import spec_with

    built = build_image(
        spec,
        workspace=Path.cwd(),
        base_image=base_image,
        push=True,
        push_flag="--build",
        report=ConsoleReport(),
    )
    return spec_with(spec, image=built.reference), built.record()


def _connect(
    spec: JobSpec, ns_given: bool, kubeconfig: str | None, context: str | None
) -> tuple[Kube, JobSpec]:
    """The kubeconfig read (no request yet), and a spec that names no namespace moved into
    the context's: the spec is final before its objects are rendered, once, by `prepare`
    (whose render errors come before its first request)."""
    from ddpdeploy.cluster.find import connect, in_context_namespace

    kube = connect(kubeconfig, context)
    if not ns_given and spec.namespace != kube.default_namespace:
        spec = in_context_namespace(spec, kube.default_namespace)
    return kube, spec


def _wait(kube: Kube, spec: JobSpec, seconds: float | None, follow: bool) -> None:
    """Watch the submitted job to its end (rank 0's log too with --follow); Ctrl-C stops
    the watching only, and says so."""
    from ddpdeploy.cluster import watch
    from ddpdeploy.commands.views import WaitViews, log_line
    from ddpdeploy.signals import interrupted
    from ddpdeploy.targets import layout_of
    from ddpdeploy.text import plain

    kind = layout_of(spec.target).kind
    views = WaitViews(spec.name)
    try:
        state = watch.follow_and_wait(
            kube, spec.name, spec.namespace, seconds, follow, views, log_line, _say
        )
    except KeyboardInterrupt as exc:
        now = f" (it was {plain(views.last[2].state)})" if views.last is not None else ""
        raise interrupted(
            exc,
            f"stopped watching; {kind} {spec.namespace}/{spec.name} is submitted and goes on"
            f"{now} (`ddpdeploy status {spec.name} -n {spec.namespace}`; `ddpdeploy down` "
            "stops it)",
        ) from None
    _say(f"{kind} {spec.name} succeeded" + (f": {state.reason}" if state.reason else ""))
