"""nexus sweep gate: Table II (reference-free drift proxy against true per-head drift, Spearman rho per cell)."""

from __future__ import annotations

from typing import Optional

import typer

from . import options
from ._progress import parse_int_list, stage_progress
from ._report import env_line, finish, fmt_ci


def command(
    model: Optional[str] = options.model(),
    depths: Optional[str] = typer.Option(None, "--depths", help="Cursor positions n_past (compile prefix included; default 256,1024,2048)."),
    tool: str = options.tool(),
    registry_dir: Optional[str] = options.registry_dir(),
    flash_attn: bool = options.flash_attn(),
    seed: int = options.seed("Seed of the bootstrap over heads."),
    quick: bool = options.quick("CI smoke run: SmolLM2, n_past 256 (unless given)."),
    out: str = options.results_out("gate"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import sweep_gate as stage  # lazy: `nexus --help` stays fast

    s = options.settings(dict(model=model, depths=parse_int_list(depths, "--depths") if depths else None),
                         stage.DEFAULTS, quick, stage.QUICK)
    with stage_progress("gate") as prog:
        doc = stage.run(model=s["model"], depths=s["depths"], tool=tool, registry_dir=registry_dir, flash_attn=flash_attn, seed=seed,
                        out_dir=out, quick=quick, progress=prog)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    s = doc["summary"]
    t = Table(title=f"Reference-free drift gate (Table II) · {doc['params']['model']} · {s['heads']}", title_justify="left")
    for col in ("n_past", "ctx", "max drift", "mean drift", "Spearman ρ [95% CI]", "paper ρ", "ρ (V drift)"):
        t.add_column(col, justify="right")
    for r in s["rows"]:
        paper = r.get("paper")
        t.add_row(str(r["n_past"]), r["ctx"], f"{r['max_drift']:.3f}", f"{r['mean_drift']:.3f}", fmt_ci(r["rho"], 3),
                  f"{paper['rho']:.3f}" if paper else "—", fmt_ci(r["rho_v"], 3))
    console.print(t)
    mr = s["mean_rho"]
    console.print(f"mean Spearman ρ = {mr:.3f} (target ≥ {s['target_rho']:.2f}; paper {s['paper_mean_rho']:.3f}) → "
                  f"{'go' if s['gate_go'] else 'no-go'}" if mr is not None else "mean ρ undefined", highlight=False)
    console.print(f"[dim]{env_line(doc)}[/]", highlight=False)
