"""nexus bench deep-splice: Table III (splice + repair TTFT against text prefill, per K and depth) and Fig. 4."""

from __future__ import annotations

from typing import List, Optional

import typer

from . import options
from ._progress import parse_int_list, stage_progress
from ._report import env_line, finish, fmt_ci, fmt_kl, fmt_speedup


def command(
    model: Optional[str] = options.model(),
    k: Optional[List[float]] = typer.Option(None, "--K", help="Recompute curve K of eq. (2); repeat for several. Default 4 and 16."),
    depths: Optional[str] = typer.Option(None, "--depths", help="History depths (tokens after the compile prefix; default 256,512,1024,2048)."),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, help="Timed trials per cell (default 15; one warm-up round is added)."),
    tool: str = options.tool(),
    registry_dir: Optional[str] = options.registry_dir(),
    flash_attn: bool = options.flash_attn(),
    seed: int = options.seed("Seed of the bootstrap and of the K order."),
    quick: bool = options.quick("CI smoke run: SmolLM2, depth 256, 3 trials (unless given)."),
    out: str = options.results_out("deep-splice"),
    fresh: bool = typer.Option(False, "--fresh", help="Measure every depth again, ignoring what a stopped run of "
                                                     "the same settings kept (it resumes by default)."),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import bench_deep_splice as stage  # lazy: `nexus --help` stays fast

    s = options.settings(dict(model=model, depths=parse_int_list(depths, "--depths") if depths else None,
                              trials=trials), stage.DEFAULTS, quick, stage.QUICK)
    with stage_progress("deep-splice") as prog:
        doc = stage.run(model=s["model"], ks=k or None, depths=s["depths"], trials=s["trials"], tool=tool,
                        registry_dir=registry_dir, flash_attn=flash_attn, seed=seed, out_dir=out, quick=quick,
                        progress=prog, fresh=fresh)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    s = doc["summary"]
    p = doc["params"]
    t = Table(title=f"Deep splice TTFT (Table III) · {p['model']} · S={s['S']} schema tokens, Q={s['Q']} query tokens · "
                    f"n={p['trials']} trials/cell", title_justify="left")
    for col in ("K", "depth", "R %", "cold prefill ms", "cold splice ms", "cold speedup", "paper",
                "warm prefill ms", "warm splice ms", "warm speedup", "top-1", "KL max", "floor"):
        t.add_column(col, justify="right")
    for key, c in sorted(s["cells"].items(), key=lambda kv: (kv[1]["K"], kv[1]["depth"])):
        paper = c.get("paper")
        t.add_row(
            f"{c['K']:g}", str(c["depth"]), f"{c['R_pct']:.1f}",
            fmt_ci(c["cold"]["prefill_ms"], 0), fmt_ci(c["cold"]["splice_ms"], 0), fmt_speedup(c["cold"]["speedup"]),
            f"{paper['speedup']:.2f}x" if paper else "—",
            fmt_ci(c["warm"]["prefill_ms"], 1), fmt_ci(c["warm"]["splice_ms"], 1), fmt_speedup(c["warm"]["speedup"]),
            "OK" if c["top1_all"] else f"{c['top1']['value'] * 100:.0f}%",
            fmt_kl(c["kl_max"]), fmt_kl(c["floor_kl"]),
        )
    console.print(t)
    tg = s["targets"]
    console.print(
        f"targets: warm speedup at depth 256 >= 3x with top-1 kept: {_yn(tg['warm_speedup_d256_ge_3x']['met'])}; "
        f"KL <= floor where R = 100 %: {_yn(tg['kl_le_floor_where_R100']['met'])}; "
        f"cold speedup >= paper in every cell: {_yn(tg['cold_speedup_ge_paper']['met'])}"
        + (f" (short: {tg['cold_speedup_ge_paper']['shortfall']})" if tg['cold_speedup_ge_paper']['shortfall'] else ""),
        highlight=False,
    )
    console.print(f"[dim]{env_line(doc)}[/]", highlight=False)


def _yn(v) -> str:
    return "n/a" if v is None else ("yes" if v else "NO")
