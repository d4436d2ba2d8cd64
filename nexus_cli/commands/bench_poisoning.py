"""nexus bench poisoning: one hostile server at a time among the 955 shared tools; requests stolen, with the
defences (nexus index --quarantine) off and on, and whether an argument prompt carries its instructions."""

from __future__ import annotations

from typing import Optional

import typer

from ..config import DEFAULT_EMBEDDER, DEFAULT_LLM
from ..errors import UsageError
from . import options
from ._progress import stage_progress
from ._report import env_line, finish, fmt_pct


def command(
    attacks: Optional[str] = typer.Option(None, "--attacks", help="Comma-separated attacks (default: all)."),
    registry_dir: Optional[str] = options.registry_dir(),
    embedder: str = typer.Option(DEFAULT_EMBEDDER, "--embedder", help="Embedder of the indexes."),
    reranker: str = typer.Option("auto", "--reranker", help="The router's reranker (auto: what users get)."),
    model: str = typer.Option(DEFAULT_LLM, "--model", "-m", help="LLM of the reranker."),
    max_queries: Optional[int] = typer.Option(None, "--max-queries", help="Only the first N requests (a smoke run)."),
    out: str = options.results_out("poisoning"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import bench_poisoning as stage  # lazy: `nexus --help` stays fast

    chosen = tuple(a.strip() for a in attacks.split(",") if a.strip()) if attacks else stage.ATTACKS
    unknown = [a for a in chosen if a not in stage.ATTACKS]
    if unknown or not chosen:
        raise UsageError(f"unknown attack '{unknown[0] if unknown else attacks}' ({', '.join(stage.ATTACKS)})")
    if max_queries is not None and max_queries < 1:
        raise UsageError("--max-queries must be at least 1")
    with stage_progress("poisoning") as prog:
        doc = stage.run(out_dir=out, registry_dir=registry_dir, attacks=chosen, embedder=embedder, reranker=reranker,
                        model=model, max_queries=max_queries, progress=prog)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    s = doc["summary"]
    p = doc["params"]
    base = s["baseline"]
    t = Table(title=f"Hostile servers among {p['n_tools']} tools · {p['n_queries']} routing requests · reranker "
                    f"{base['reranker']} · baseline top-1 {fmt_pct(base['top1'])} %", title_justify="left")
    for col in ("attack", "hostile tools", "quarantined", "stolen off", "stolen on", "top-1 off", "top-1 on",
                "prompt leaks off / on"):
        t.add_column(col, justify="left" if col == "attack" else "right")
    for attack, c in s["attacks"].items():
        off, on = c["off"], c["on"]
        t.add_row(attack, str(len(c["hostile_tools"])), str(len(c["quarantined"])),
                  f"{off['stolen']} ({off['stolen_rate']['value'] * 100:.1f} %)",
                  f"{on['stolen']} ({on['stolen_rate']['value'] * 100:.1f} %)",
                  fmt_pct(off["top1"]), fmt_pct(on["top1"]), f"{len(off['prompt_leaks'])} / {len(on['prompt_leaks'])}")
    console.print(t)
    legit = sorted({k for c in s["attacks"].values() for k in c["legit_flagged"]})
    if legit:
        console.print(f"[dim]real tools flagged (warnings only, never quarantined): {escape(', '.join(legit))}[/]")
    console.print(f"[dim]{env_line(doc)}[/]", highlight=False)
