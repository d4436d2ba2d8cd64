"""nexus bench l0: warm-hit rate and copy latency of the L0 exact-token radix arena (paper §VI-D, Table IV)."""

from __future__ import annotations

from typing import Optional

import typer

from ..config import TEST_LLM
from ..errors import UsageError
from . import options
from ._progress import stage_progress
from ._report import env_line, finish, fmt_ci, fmt_num, fmt_pct


def command(
    seeds: Optional[int] = typer.Option(None, "--seeds", help="Workload seeds (default 10; --quick: 2)."),
    turns: Optional[int] = typer.Option(None, "--turns", help="Turns per seed (default 60; --quick: 20)."),
    model: Optional[str] = options.model("LLM whose context holds the arena (default smollm2-135m)."),
    slots: int = typer.Option(32, "--slots", help="Sequence slots in the arena."),
    n_ctx: int = typer.Option(8192, "--n-ctx", help="KV cells of the shared context."),
    quick: bool = options.quick("CI smoke run: 2 seeds x 20 turns."),
    out: str = options.results_out("l0"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import bench_l0 as stage  # lazy: `nexus --help` stays fast

    if seeds is not None and seeds < 1:
        raise UsageError("--seeds must be at least 1")
    if turns is not None and turns < 1:
        raise UsageError("--turns must be at least 1")
    if slots < 1 or slots > 200:
        raise UsageError("--slots must be between 1 and 200")
    if n_ctx < 512:
        raise UsageError("--n-ctx must be at least 512")
    with stage_progress("l0") as prog:
        doc = stage.run(out_dir=out, quick=quick, seeds=seeds, turns=turns, model=model or TEST_LLM, slots=slots, n_ctx=n_ctx,
                        progress=prog)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    s = doc["summary"]
    p = doc["params"]
    paper = s["paper"]
    t = Table(title=f"L0 radix arena · {p['slots']} slots · {p['seeds']} seeds x {p['turns_per_seed']} turns · "
                    f"n_ctx {p['n_ctx']}", title_justify="left")
    t.add_column("metric")
    t.add_column("Nexus", justify="right")
    t.add_column("paper", justify="right")
    t.add_row("warm-hit rate % [95% CI]", fmt_pct(s["hit_rate"]), f"{paper['hit_rate'] * 100:.1f}")
    t.add_row("continuation rate %", fmt_pct(s["continuation_rate"]), "—")
    t.add_row("reused tokens %", fmt_num(s["reused_token_fraction"], 1, 100.0), "—")
    t.add_row("copy P50 µs [95% CI]", fmt_ci(s["copy_us"], 2), f"{paper['copy_p50_us']:.2f}")
    t.add_row("copy P99 µs", fmt_num(s["copy_p99_us"], 2), "—")
    t.add_row("lookup P50 / P99 µs", f"{fmt_num(s['lookup_p50_us'], 1)} / {fmt_num(s['lookup_p99_us'], 1)}", "—")
    rc = s["reference_check"]
    t.add_row("warm vs cold: top-1 / bit-identical", f"{rc['top1_agree']}/{rc['checked']} · {rc['bit_identical']}/{rc['checked']}"
              f" (max KL {rc['max_kl_nats']:.2g})", "—")
    t.add_row("evictions", str(s["evictions"]), "—")
    console.print(t)
    console.print(f"[dim]{env_line(doc)}[/]", highlight=False)
