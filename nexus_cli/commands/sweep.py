"""nexus sweep: fidelity sweeps. Each sweep's command lives in its own module; its logic in lab/."""

import typer

from . import sweep_dkl, sweep_gate

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None)
app.command("dkl", help="Bare-splice KL and top-1 against placement offset, with the numerical floor (Fig 1).")(
    sweep_dkl.command
)
app.command("gate", help="Reference-free drift proxy against true per-head drift (Spearman rho, Table II).")(
    sweep_gate.command
)
