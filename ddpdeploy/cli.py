"""The `ddpdeploy` command line: a thin Typer app whose commands load only when named.

`ddpdeploy --help` and shell completion read the table below and import no command; a
command's module (and what it needs) loads when that command is parsed, for its --help too.
Help is click's plain text (no rich): it prints in the time Python starts.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from ddpdeploy import __version__
from ddpdeploy.errors import DdpdeployError
from ddpdeploy.signals import aborted, catch_signals
from ddpdeploy.signals import untold as untold_interrupt
from ddpdeploy.text import plain, plain_lines

SUMMARY = "Take a PyTorch DDP job from a laptop smoke test to N GPU nodes on Kubernetes."

# name -> ("module:function" under ddpdeploy.commands, its line in `ddpdeploy --help`: the
# first sentence of the command's own help, which tests/test_cli.py checks it matches).
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("init:init", "Write a commented ddpdeploy.yaml and its JSON Schema."),
    "build": ("build:build", "Build the training image and print its reference on stdout."),
    "render": ("render:render", "Render the job's Kubernetes objects for its target."),
    "smoke": ("smoke:smoke", "Run the job as a CPU smoke test (gloo) on this host."),
    "compose": ("compose:compose", "Render the job as a docker-compose file."),
    "schema": ("schema:schema", "Print the JSON Schema of ddpdeploy.yaml."),
    "up": ("up:up", "Submit the job to the cluster as its target's objects."),
    "status": ("status:status", "Show a job's state, its pods and its training."),
    "logs": ("logs:logs", "Print a job's training log, every line with its global rank."),
    "list": ("list:list_jobs", "List the jobs labelled managed-by ddpdeploy."),
    "down": ("down:down", "Delete a job; its checkpoints stay for `resume` unless --purge."),
    "scale": ("scale:scale", "Set an elastic job's node (Worker) count."),
    "resume": ("resume:resume", "Recreate a finished or deleted job as it was last submitted."),
    "collect": ("collect:collect", "Copy a job's newest intact checkpoint into a folder."),
}


class TrainArgsCommand(TyperCommand):
    """A command whose training arguments must follow ``--``.

    Without this, a stray word among the flags (`render --image x deploy/`) would silently
    join the training command; with it, that word is refused by name."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        head = args[: args.index("--")] if "--" in args else args
        if {"-h", "--help"} & set(head) and not ctx.resilient_parsing:
            # Straight to the text: typer would first build a pydantic adapter per option.
            typer.echo(self.get_help(ctx), color=ctx.color)
            ctx.exit()
        if any(p.name == "train_args" for p in self.params):
            # The command's own parser tells option values from stray words.
            values, _, _ = self.make_parser(ctx).parse_args(args=list(head))
            stray = values.get("train_args")
            if stray:
                ctx.fail(
                    f"unexpected argument {stray[0]!r} before `--`; training arguments go "
                    f"after it: {ctx.command_path} [OPTIONS] -- {' '.join(stray)}"
                )
        return super().parse_args(ctx, args)


def _one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DdpdeployError as exc:
            # Its text may quote the outside (a job's last lines): plain, line by line.
            typer.echo(f"error: {plain_lines(str(exc))}", err=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


@functools.cache
def load_command(name: str) -> Any:
    """The click command of ``name``, its module imported now."""
    target, _ = COMMANDS[name]
    module_name, func_name = target.split(":")
    fn = getattr(importlib.import_module(f"ddpdeploy.commands.{module_name}"), func_name)
    one = typer.Typer(rich_markup_mode=None, add_completion=False)
    one.command(
        name,
        cls=TrainArgsCommand,
        context_settings={"allow_interspersed_args": True, "help_option_names": ["-h", "--help"]},
    )(_one_line_errors(fn))
    return typer.main.get_command(one)


class _Commands(TyperGroup):
    """The command table, each command loaded when it is named."""

    # ctx and formatter are typer's vendored click types, which it does not export.
    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        # Shell completion (resilient parsing) on a Tab before any command: nothing to parse.
        tab_first = ctx.resilient_parsing and not args
        if tab_first or (args and args[0] in COMMANDS):
            # A command named first leaves every root option at its default: set them as
            # such, not through typer's per-option pydantic coercion (which would import
            # pydantic before `CMD --help` prints a line, or a Tab lists the commands).
            ctx.params.update({p.name: p.default for p in self.get_params(ctx) if p.expose_value})
            ctx._protected_args, ctx.args = args[:1], args[1:]
            return list(ctx.args)
        return super().parse_args(ctx, args)

    def shell_complete(self, ctx: Any, incomplete: str) -> list[Any]:
        # A Tab offers the table's names and lines; typer's own loads each matching command.
        from typer._click.shell_completion import CompletionItem  # typer exports none

        found = [
            CompletionItem(name, help=line)
            for name, (_, line) in COMMANDS.items()
            if name.startswith(incomplete)
        ]
        return found + super(TyperGroup, self).shell_complete(ctx, incomplete)  # the options

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        with formatter.section("Commands"):  # from the table: no command is imported
            formatter.write_dl([(name, line) for name, (_, line) in COMMANDS.items()])


app = typer.Typer(
    name="ddpdeploy",
    cls=_Commands,
    help=SUMMARY,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
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


def _refuse_undecodable(args: list[Any]) -> None:
    """Python hands bytes of an argument that are not UTF-8 on as lone surrogates, which
    every output then writes differently (U+FFFD in YAML, an escape in JSON): refused, a
    file name of such bytes too (it could not be shown either)."""
    for arg in map(str, args):
        bad = next((ch for ch in arg if "\udc80" <= ch <= "\udcff"), None)
        if bad is not None:
            shown = plain(arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
            typer.echo(
                f"error: argument {shown!r} is not UTF-8 text (byte 0x{ord(bad) - 0xDC00:02x}); "
                "give it as UTF-8",
                err=True,
            )
            sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors become one line on stderr with exit code 2."""
    catch_signals()  # SIGTERM, like Ctrl-C, ends every command with one line
    _refuse_undecodable(sys.argv[1:] if argv is None else argv)
    try:
        # Without standalone mode, click returns typer.Exit's code instead of exiting.
        code = app(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # the usage errors of typer's (vendored) click
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
        # SIGTERM arrives as signals.Interrupted: exit 143, not 130.
        line, exit_code = aborted(exc)
        typer.echo(line, err=True)
        sys.exit(exit_code)
    if code == 130 and (untold := untold_interrupt()) is not None:
        # Typer made an interrupt that escaped the command (during its import, its flags'
        # parsing) a silent exit 130: say it, with its own code (143 for SIGTERM).
        line, exit_code = aborted(untold)
        typer.echo(line, err=True)
        sys.exit(exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
