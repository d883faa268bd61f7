"""Flags shared by the cluster commands (kubectl's spellings), declared once."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from ddpdeploy.errors import OperationError

CLUSTER_PANEL = "Cluster"

KubeconfigOpt = Annotated[
    str | None,
    typer.Option(
        "--kubeconfig",
        help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the pod's account).",
        rich_help_panel=CLUSTER_PANEL,
    ),
]
ContextOpt = Annotated[
    str | None,
    typer.Option("--context", help="Kubeconfig context to use.", rich_help_panel=CLUSTER_PANEL),
]
NamespaceOpt = Annotated[
    str | None,
    typer.Option(
        "-n",
        "--namespace",
        help="Namespace (default: the context's, else default).",
        rich_help_panel=CLUSTER_PANEL,
    ),
]


def _job_name(value: str) -> str:
    """NAME is checked like the spec's `name` (a DNS-1035 label): it becomes a label selector
    and a folder name, so `../x` or `a,b=c` never reach either."""
    from pydantic import TypeAdapter, ValidationError

    from ddpdeploy.spec import JobSpec

    field = JobSpec.model_fields["name"]  # the field's own grammar, not the whole spec's rules
    try:
        grammar = (field.annotation, *field.metadata)  # Annotated[str, <its validators>]
        TypeAdapter(Annotated[grammar]).validate_python(value)
    except ValidationError as exc:
        shown = repr(value) if len(value) <= 70 else f"{value[:60]!r}…({len(value)} characters)"
        reason = exc.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        raise typer.BadParameter(f"{shown} {reason} (like the spec's name)") from None
    return value


NameArg = Annotated[
    str,
    typer.Argument(help="The job's name.", show_default=False, metavar="NAME", callback=_job_name),
]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; its exit code is the shell's 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _raise(signum: int, _frame: Any) -> None:
    raise Interrupted(signum)


def catch_signals() -> None:
    """SIGINT and SIGTERM both raise Interrupted, so a cluster command can say what it did
    (without this SIGTERM kills the process mid-change with nothing said)."""
    for sig in _SIGNALS:
        signal.signal(sig, _raise)


def interrupted(exc: KeyboardInterrupt, what: str) -> OperationError:
    """The one line an interrupted command ends with: ``what`` was and was not done."""
    name = getattr(exc, "name", "SIGINT")
    return OperationError(f"interrupted ({name}): {what}", getattr(exc, "exit_code", 130))


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM off for a short section that must not stop half-way; one that
    came meanwhile is raised (as Interrupted) once the section is done."""
    pending: list[int] = []
    old = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    for sig in _SIGNALS:
        signal.signal(sig, lambda signum, _frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if pending:
        raise Interrupted(pending[0])


def connect(kubeconfig: str | None, context: str | None) -> Any:
    """A connected `Kube` adapter (imports the kubernetes client only now)."""
    from ddpdeploy.adapters.kube import Kube

    catch_signals()
    return Kube(kubeconfig, context)


ViewOpt = Annotated[
    str,
    typer.Option("-o", "--output", help="table, json or yaml.", case_sensitive=False),
]
