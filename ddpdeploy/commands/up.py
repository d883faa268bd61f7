"""`ddpdeploy up`: preflight, server-side dry run, apply, then (optionally) wait and follow."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ddpdeploy.errors import UserError
from ddpdeploy.kubeopts import CLUSTER_PANEL, ContextOpt, KubeconfigOpt, connect
from ddpdeploy.options import spec_command
from ddpdeploy.spec import JobSpec, spec_with


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
            "(never relabelled or deleted; like naming it as checkpoint.claimName).",
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
        str | None, typer.Option("--timeout", help="Give up waiting after this long (90s, 15m).")
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
    from ddpdeploy.cluster import watch
    from ddpdeploy.commands.views import say as _say
    from ddpdeploy.targets import render_objects

    seconds = watch.parse_duration(timeout) if timeout else None
    ns_given = "namespace" in spec.model_fields_set  # -n or the spec file; else the context's
    record = None  # what is known of the image beyond its reference: only a build's
    if base_image is not None and not build:
        raise UserError("--base-image: only used with --build; add --build or drop it")
    if build:
        from pathlib import Path

        from ddpdeploy.imagebuild import build_image

        built = build_image(
            spec, workspace=Path.cwd(), base_image=base_image, push=True, push_flag="--build"
        )
        spec = spec_with(spec, image=built.reference)
        record = built.record()  # the pods are told the digest and commit it was built from
    from ddpdeploy.kubeopts import in_context_namespace, interrupted

    render_objects(spec, record)  # render errors come first, before connecting
    kube = connect(kubeconfig, context)
    if not ns_given and spec.namespace != kube.default_namespace:
        spec = in_context_namespace(spec, kube.default_namespace)
    try:
        if adopt_pvc:
            spec = deploy.adopt_pvc(kube, spec, _say)
        plan = deploy.plan_job(kube, spec, _say, create_namespace, record)
        if dry_run:
            deploy.dry_run(kube, plan, replace, _say)
            return
    except KeyboardInterrupt as exc:
        raise interrupted(exc, "stopped before any change; nothing was changed") from None
    deploy.apply(kube, plan, replace, _say)  # says itself what an interrupt left
    if wait is None:
        wait = sys.stdout.isatty()
    if not (wait or follow):
        _say(f"submitted; `ddpdeploy status {spec.name} -n {spec.namespace}` shows progress")
        return
    from ddpdeploy.commands.views import WaitViews, log_line
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
