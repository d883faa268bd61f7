"""The `ddpdeploy` command line: a thin Typer app; every command is registered here."""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ddpdeploy import __version__
from ddpdeploy.commands.options import TrainArgsCommand
from ddpdeploy.errors import DdpdeployError
from ddpdeploy.signals import catch_signals

app = typer.Typer(
    name="ddpdeploy",
    help="Take a PyTorch DDP job from a laptop smoke test to N GPU nodes on Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# name -> "module:function" under ddpdeploy.commands. One module per command; each imports
# its heavy dependencies (torch, kubernetes, docker) inside the function, not at the top.
COMMANDS: dict[str, str] = {
    "init": "init:init",
    "build": "build:build",
    "render": "render:render",
    "smoke": "smoke:smoke",
    "compose": "compose:compose",
    "schema": "schema:schema",
    "up": "up:up",
    "status": "status:status",
    "logs": "logs:logs",
    "list": "list:list_jobs",
    "down": "down:down",
    "scale": "scale:scale",
    "resume": "resume:resume",
    "collect": "collect:collect",
}


def _one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DdpdeployError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def _register() -> None:
    for name, target in COMMANDS.items():
        module_name, func_name = target.split(":")
        module = importlib.import_module(f"ddpdeploy.commands.{module_name}")
        fn = getattr(module, func_name)
        app.command(name, cls=TrainArgsCommand, context_settings={"allow_interspersed_args": True})(
            _one_line_errors(fn)
        )


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddpdeploy {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Take a PyTorch DDP job from a laptop smoke test to N GPU nodes on Kubernetes."""


_register()


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors become one line on stderr with exit code 2."""
    catch_signals()  # SIGTERM, like Ctrl-C, ends every command with one line
    try:
        # Without standalone mode, click returns typer.Exit's code instead of exiting.
        code = app(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:
        ctx = getattr(exc, "ctx", None)
        if exc.__class__.__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
            sys.exit(0)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        # Typer's Literal check words it as pydantic does ("Value error, ... .").
        message = message.replace("Value error, ", "").rstrip(".")
        hint = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
        typer.echo(f"error: {message}{hint}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except (typer.Abort, KeyboardInterrupt) as exc:
        # A cluster command's SIGTERM arrives as signals.Interrupted: exit 143, not 130.
        name = getattr(exc, "name", None)
        typer.echo(f"aborted ({name}); nothing more was done" if name else "aborted", err=True)
        sys.exit(getattr(exc, "exit_code", 130))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
