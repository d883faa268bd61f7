"""`ddpdeploy scale NAME --nodes N`: resize an elastic job within its MIN:MAX, through the
same apply path as `up` (ownership, preflight, server-side dry run, take-back)."""

from __future__ import annotations

from typing import Annotated

from ddpdeploy.commands.options import (
    ContextOpt,
    KubeconfigOpt,
    NameArg,
    NamespaceOpt,
    count_option,
)
from ddpdeploy.formats import counted


def scale(
    name: NameArg,
    nodes: Annotated[int, count_option("--nodes", minimum=1, help="The new node count.")],
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Set an elastic job's node (Worker) count.

    Example: ddpdeploy scale my-job --nodes 4
    """
    from ddpdeploy.cluster import apply
    from ddpdeploy.cluster.find import open_job
    from ddpdeploy.cluster.saved import scaled_spec
    from ddpdeploy.commands.views import say
    from ddpdeploy.signals import nothing_changed_on_interrupt
    from ddpdeploy.targets import SCALABLE

    with nothing_changed_on_interrupt():  # apply says what an interrupt in it left
        found = open_job(kubeconfig, context, name, namespace, verb="scaled", layouts=SCALABLE)
        job = found.job
        assert job is not None  # required
        spec = scaled_spec(job, nodes)
        # The pods keep the image digest and git facts `up --build` recorded.
        record = apply.carried_record(job, spec, say)
        checked = apply.prepare(found.kube, spec, say, record=record)
        apply.apply(found.kube, checked, False, say, in_place=True)
    say(f"scaled {job['kind']} {found.namespace}/{name} to {counted(nodes, 'node')}")
