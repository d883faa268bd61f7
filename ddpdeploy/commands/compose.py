"""`ddpdeploy compose`: the job as a docker-compose project, to stdout or a file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ddpdeploy.commands.options import spec_command
from ddpdeploy.errors import UserError

if TYPE_CHECKING:
    from ddpdeploy.spec import JobSpec


# Its --cpu/--gpu picks the devices; the spec's cpu (a pod's CPU request) means nothing to
# a compose project, so the spec flag --cpu is not taken here.
@spec_command(without=("cpu",))
def compose(
    spec: JobSpec,
    cpu: Annotated[
        bool | None,
        typer.Option(
            "--cpu/--gpu",
            help="CPU (gloo, no GPU reservations) or GPUs as the spec asks; "
            "default: --cpu when gpus is 0.",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option("--out", help="Write the compose file here instead of stdout (-: stdout)."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Let --out replace a file that is not a compose file ddpdeploy wrote."
        ),
    ] = False,
    spec_file: Path | None = None,
) -> None:
    """Render the job as a docker-compose file: one service per node, named like its pod,
    with the env the cluster's operator would give it.

    Example: ddpdeploy compose --image ghcr.io/me/train:v1 --nodes 2 --procs 2 --out compose.yaml
    """
    from ddpdeploy.adapters.stdout import write_stdout
    from ddpdeploy.render.output import to_yaml, written_by
    from ddpdeploy.smoke.compose import render_compose, secret_env_note

    # The header, on stdout too: a file saved from it is one --out may replace later.
    text = written_by("compose") + to_yaml(render_compose(spec, cpu))
    # `--out -` is stdout, as for most tools; `./-` (as typed, not as a Path reads it) is
    # the file named `-`.
    from ddpdeploy.fs import file_path

    path = None if out in (None, "-") else file_path(out, "--out", "--out compose.yaml")
    if path is not None:
        replace = _may_replace(path, spec_file, force)
    note = secret_env_note(spec)
    if note:
        typer.echo(f"compose: {note}", err=True)
    if path is None:
        write_stdout(text)
        return
    _write(path, text.encode("utf-8"), replace)
    typer.echo(f"wrote {out}", err=True)


def _may_replace(out: Path, spec_file: Path | None, force: bool) -> bool:
    """Whether a file is at ``out`` that --out may replace (False: none is there); one
    line when it may not: the spec this run read (never), or a file that is not a compose
    file ddpdeploy wrote (not without --force)."""
    import os

    from ddpdeploy import fs
    from ddpdeploy.render.output import written_by

    if spec_file is not None:
        try:
            same = os.path.samefile(out, spec_file)
        except OSError:
            same = False  # nothing at --out yet (or the spec is not there to compare)
        if same:
            also = "" if os.path.normpath(out) == os.path.normpath(spec_file) else f" ({spec_file})"
            raise UserError(
                f"--out: {out} is the spec file this command read{also}; name another file, "
                "e.g. --out compose.yaml"
            )
    try:
        ours = fs.starts_with(out, written_by("compose").encode(), "--out")
    except fs.NotRegularFile:
        raise
    except OSError as exc:
        raise fs.write_error(out, exc, "--out", verb="read") from None
    if ours is None:
        return False
    if not ours and not force:
        raise _not_ours(out)
    return True


def _write(out: Path, data: bytes, replace: bool) -> None:
    """``data`` at ``out``, whole; where nothing was, only while nothing is (a file made
    meanwhile is not ddpdeploy's to replace)."""
    from ddpdeploy.fs import Staged

    with Staged(out, "--out") as staged:
        staged.write(data)
        try:
            staged.commit(replace=replace)
        except FileExistsError:  # made since _may_replace looked
            raise UserError(
                f"--out: {out} was made by another process while this one wrote it; run "
                "again to replace it, or name another file"
            ) from None


def _not_ours(out: Path) -> UserError:
    return UserError(
        f"--out: {out} exists and is not a compose file ddpdeploy wrote; pass --force to "
        "replace it, or name another file"
    )
