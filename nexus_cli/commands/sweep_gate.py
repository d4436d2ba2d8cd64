"""nexus sweep gate: Table II (reference-free drift proxy against true per-head drift, Spearman rho per cell)."""

from __future__ import annotations

from typing import Optional

import typer

from ._progress import parse_int_list, stage_progress
from ._report import env_line, finish, fmt_ci


def command(
    model: str = typer.Option("qwen2.5-0.5b", "--model", "-m", help="LLM name or GGUF path."),
    depths: str = typer.Option("256,1024,2048", "--depths", help="Cursor positions n_past (compile prefix included)."),
    tool: str = typer.Option("github/create_pull_request", "--tool", help="The schema to splice (server/name)."),
    registry_dir: Optional[str] = typer.Option(None, "--registry-dir", help="Registries folder (default ../shared/registries)."),
    flash_attn: bool = typer.Option(False, "--flash-attn/--no-flash-attn", help="Row-major V cache (on) or transposed (off)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap over heads."),
    quick: bool = typer.Option(False, "--quick", help="CI smoke run: SmolLM2, n_past 256 (unless given)."),
    out: str = typer.Option("results", "--out", help="Results folder (writes <out>/gate/)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results document as JSON."),
) -> None:
    from ..stages import sweep_gate as stage

    dl = parse_int_list(depths, "--depths")
    if quick:
        model = stage.QUICK["model"] if model == "qwen2.5-0.5b" else model
        dl = stage.QUICK["depths"] if depths == "256,1024,2048" else dl
    with stage_progress("gate") as prog:
        doc = stage.run(model=model, depths=dl, tool=tool, registry_dir=registry_dir, flash_attn=flash_attn, seed=seed,
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
