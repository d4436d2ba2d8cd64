"""nexus sweep dkl: Fig. 1 (bare-splice KL and top-1 against placement offset, the floor, and the LegoLink point)."""

from __future__ import annotations

from typing import Optional

import typer

from ._progress import parse_int_list, stage_progress
from ._report import env_line, finish, fmt_ci, fmt_kl, fmt_pct

DEFAULT_OFFSETS = "0,16,32,64,128,256,512,1024,1536,2048"


def command(
    model: str = typer.Option("qwen2.5-0.5b", "--model", "-m", help="LLM name or GGUF path."),
    offsets: str = typer.Option(DEFAULT_OFFSETS, "--offsets", help="Placement offsets n_past - m0 (0 = compile anchor)."),
    queries: int = typer.Option(10, "--queries", min=1, max=10, help="User turns per offset (1-10)."),
    tool: str = typer.Option("github/create_pull_request", "--tool", help="The schema to splice (server/name)."),
    registry_dir: Optional[str] = typer.Option(None, "--registry-dir", help="Registries folder (default ../shared/registries)."),
    legolink_offset: int = typer.Option(1024, "--legolink-offset", help="Offset of the LegoLink point; -1 skips it."),
    legolink_k: int = typer.Option(16, "--legolink-k", min=1, help="Chunk-head tokens LegoLink recomputes (EPIC: 16)."),
    flash_attn: bool = typer.Option(False, "--flash-attn/--no-flash-attn", help="Row-major V cache (on) or transposed (off)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap."),
    quick: bool = typer.Option(False, "--quick", help="CI smoke run: SmolLM2, offsets 0,64,256, 2 queries (unless given)."),
    out: str = typer.Option("results", "--out", help="Results folder (writes <out>/dkl/)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results document as JSON."),
) -> None:
    from ..stages import sweep_dkl as stage

    offs = parse_int_list(offsets, "--offsets")
    ll = None if legolink_offset < 0 else legolink_offset
    if quick:
        q = stage.QUICK
        model = q["model"] if model == "qwen2.5-0.5b" else model
        offs = q["offsets"] if offsets == DEFAULT_OFFSETS else offs
        queries = q["queries"] if queries == 10 else queries
        ll = q["legolink_offset"] if legolink_offset == 1024 else ll
    with stage_progress("dkl") as prog:
        doc = stage.run(model=model, offsets=offs, queries=queries, tool=tool, registry_dir=registry_dir,
                        legolink_offset=ll, legolink_k=legolink_k, flash_attn=flash_attn, seed=seed, out_dir=out,
                        quick=quick, progress=prog)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    s = doc["summary"]
    p = doc["params"]
    t = Table(title=f"Bare-splice KL vs offset (Fig. 1) · {p['model']} · {p['queries']} queries/offset · S={s['S']}, m0={s['m0']}",
              title_justify="left")
    for col in ("offset", "n_past", "KL mean [95% CI]", "KL median", "KL max", "top-1 % [95% CI]", "floor mean", "floor max"):
        t.add_column(col, justify="right")
    for r in s["rows"]:
        t.add_row(str(r["offset"]), str(r["n_past"]), fmt_ci(r["kl_mean"], 4), fmt_kl(r["kl_median"]), fmt_kl(r["kl_max"]),
                  fmt_pct(r["top1"], 0), fmt_kl(r["floor_mean"]), fmt_kl(r["floor_max"]))
    console.print(t)
    ll = s.get("legolink")
    if ll:
        console.print(
            f"LegoLink (recompute first k={ll['k']} block tokens, scratch sequence) at offset {ll['offset']}: "
            f"KL {fmt_ci(ll['kl_mean'], 4)} nats, top-1 {fmt_pct(ll['top1'], 0)} %; bare splice at the same offset "
            f"{fmt_kl(ll['bare_kl_mean_same_offset'])}; paper: {ll['paper_kl']} nats",
            highlight=False,
        )
    pl = s["plateau"]
    console.print(f"off-anchor mean KL range {fmt_kl(pl['kl_mean_min'])}–{fmt_kl(pl['kl_mean_max'])} nats "
                  f"(paper 0.008–0.038); top-1 = 100 % everywhere: {'yes' if pl['top1_all'] else 'NO'}", highlight=False)
    console.print(f"[dim]{env_line(doc)}[/]", highlight=False)
