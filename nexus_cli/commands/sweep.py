"""nexus sweep: a group of suites, one module each under stages/."""

import typer

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
