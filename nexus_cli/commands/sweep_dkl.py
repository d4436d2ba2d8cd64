"""nexus sweep dkl: Fig. 1 (bare-splice KL and top-1 against placement offset, the floor, and the LegoLink point)."""

from __future__ import annotations

from typing import Optional

import typer

from . import options
from ._progress import parse_int_list, stage_progress
from ._report import env_line, finish, fmt_ci, fmt_kl, fmt_pct

DEFAULT_OFFSETS = "0,16,32,64,128,256,512,1024,1536,2048"


def command(
    model: Optional[str] = options.model(),
    offsets: Optional[str] = typer.Option(None, "--offsets", help=f"Placement offsets n_past - m0 (0 = compile anchor; default {DEFAULT_OFFSETS})."),
    queries: Optional[int] = typer.Option(None, "--queries", min=1, max=10, help="User turns per offset (1-10, default 10)."),
    tool: str = options.tool(),
    registry_dir: Optional[str] = options.registry_dir(),
    legolink_offset: Optional[int] = typer.Option(None, "--legolink-offset", help="Offset of the LegoLink point (default 1024); -1 skips it."),
    legolink_k: int = typer.Option(16, "--legolink-k", min=1, help="Chunk-head tokens LegoLink recomputes (EPIC: 16)."),
    flash_attn: bool = options.flash_attn(),
    seed: int = options.seed(),
    quick: bool = options.quick("CI smoke run: SmolLM2, offsets 0,64,256, 2 queries (unless given)."),
    out: str = options.results_out("dkl"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import sweep_dkl as stage  # lazy: `nexus --help` stays fast

    s = options.settings(dict(model=model, offsets=parse_int_list(offsets, "--offsets") if offsets else None,
                              queries=queries, legolink_offset=legolink_offset), stage.DEFAULTS, quick, stage.QUICK)
    ll = None if s["legolink_offset"] < 0 else s["legolink_offset"]
    with stage_progress("dkl") as prog:
        doc = stage.run(model=s["model"], offsets=s["offsets"], queries=s["queries"], tool=tool,
                        registry_dir=registry_dir, legolink_offset=ll, legolink_k=legolink_k, flash_attn=flash_attn, seed=seed, out_dir=out,
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
            f"{fmt_kl(ll['bare_kl_mean_same_offset'])}; floor with a second block's cells in the cache "
            f"{fmt_kl(ll.get('layout_floor_mean'))}; paper: {ll['paper_kl']} nats",
            highlight=False,
        )
        sc = ll.get("scattered")
        if sc:
            console.print(f"Scattered recompute ({len(sc['indices'])} block tokens spread evenly) at offset "
                          f"{ll['offset']}: KL {fmt_ci(sc['kl_mean'], 4)} nats, top-1 {fmt_pct(sc['top1'], 0)} %",
                          highlight=False)
    pl = s["plateau"]
    console.print(f"off-anchor mean KL range {fmt_kl(pl['kl_mean_min'])}–{fmt_kl(pl['kl_mean_max'])} nats "
                  f"(paper 0.008–0.038); top-1 = 100 % everywhere: {'yes' if pl['top1_all'] else 'NO'}", highlight=False)
    console.print(f"[dim]{env_line(doc)}[/]", highlight=False)
