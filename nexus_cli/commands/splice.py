"""nexus splice --block FILE.atb --model M --depth N: one fidelity-and-latency run of the splice engine."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..config import DEFAULT_LLM, SCHEDULE_K, SCHEDULE_M, SCHEDULE_R_BASE
from ..errors import UsageError
from ..output import emit_json, stderr_console, stdout_console
from . import options


def splice_command(
    block: Path = typer.Option(..., "--block", "-b", help="A compiled .atb block."),
    model: str = typer.Option(DEFAULT_LLM, "--model", "-m", help="Model name or GGUF path (must match the block)."),
    depth: int = typer.Option(0, "--depth", "-d", help="Filler tokens of history after the compile prefix (0 = anchor)."),
    recompute: str = typer.Option("auto", "--recompute", help="auto (eq. 2 schedule) or a fixed percentage 0-100."),
    m: int = typer.Option(SCHEDULE_M, "--M", help="Schedule threshold M (tokens)."),
    r_base: float = typer.Option(SCHEDULE_R_BASE, "--R-base", help="Schedule base recompute percentage."),
    k: float = typer.Option(SCHEDULE_K, "--K", help="Schedule slope K (> 1)."),
    flash_attn: str = typer.Option("off", "--flash-attn", help="on|off (must match the block's V layout)."),
    query: Optional[str] = typer.Option(None, "--query", "-q", help="The user turn after the schema."),
    repeat: int = typer.Option(3, "--repeat", help="Timed rounds (after one warm-up); times are medians."),
    json_out: bool = options.as_json(),
) -> None:
    from ..splice.engine import Schedule, open_checked_block, parse_recompute  # lazy: `nexus --help` stays fast
    from ..splice.fidelity import run_fidelity_cli  # lazy: `nexus --help` stays fast

    fa = flash_attn.strip().lower()
    if fa not in ("on", "off"):
        raise UsageError(f"--flash-attn must be 'on' or 'off', not '{flash_attn}'")
    if depth < 0:
        raise UsageError(f"--depth must be >= 0, not {depth}")
    if m <= 0 or k <= 1 or not (0 <= r_base <= 100):
        raise UsageError("the schedule needs --M > 0, --K > 1 and 0 <= --R-base <= 100")
    if repeat < 1:
        raise UsageError("--repeat must be >= 1")
    pct = parse_recompute(recompute)
    blk = open_checked_block(block)
    with stderr_console().status(f"splicing {block.name} at depth {depth}…"):
        report = run_fidelity_cli(blk, model, depth, fa == "on", query=query, recompute=pct,
                                  schedule=Schedule(m=m, r_base=r_base, k=k), repeat=repeat, source=block.name)
    out = report.to_json()
    if json_out:
        emit_json(out)
        return
    from rich.table import Table

    t = Table(title=f"splice {block.name} into {report.model} at n_past {report.n_past}", show_header=True)
    t.add_column("quantity")
    t.add_column("value", justify="right")
    rows = [
        ("schema tokens S / query tokens", f"{report.n_tokens} / {report.n_query}"),
        ("recompute R (%) / tokens", f"{report.R_pct:.2f} / {report.recomputed_tokens}"),
        ("KL(ref || splice) nats", f"{report.kl:.3g}"),
        ("top-1 agreement", "yes" if report.top1 else "NO"),
        ("numerical floor KL", f"{report.floor_kl:.3g}"),
        ("prefill ms (schema + query)", f"{report.t_prefill_ms:.1f}"),
        ("splice ms (splice + repair + query)", f"{report.t_splice_ms:.1f}"),
        ("speedup", f"{report.speedup:.2f}x"),
        ("splice overhead ms (rotate+write+merge)", f"{report.splice_overhead_ms:.3f}"),
        ("V layout", "row-major (flash attn on)" if report.v_layout == 0 else "transposed (flash attn off)"),
    ]
    for a, b in rows:
        t.add_row(a, b)
    stdout_console().print(t)
