"""nexus bench drafts: argument generation with drafted tokens verified in batches against one token at a time."""

from __future__ import annotations

from typing import List, Optional

import typer

from . import options
from ._progress import stage_progress
from ._report import env_line, finish, fmt_ci, fmt_pct


def command(
    cases: Optional[List[str]] = typer.Option(None, "--cases", help="Cases JSONL (repeatable; default: benchmarks/queries/args_cases_{g,h,i}.jsonl)."),
    registry_dir: Optional[str] = options.registry_dir(),
    model: Optional[str] = options.model(help="LLM for arguments (default qwen2.5-1.5b, the product's)."),
    max_cases: Optional[int] = typer.Option(None, "--max-cases", help="Use only the first N cases."),
    seed: int = options.seed(),
    quick: bool = options.quick("CI smoke run: the first 4 cases."),
    out: str = options.results_out("drafts"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import bench_drafts as stage  # lazy: `nexus --help` stays fast

    s = options.settings(dict(model=model, max_cases=max_cases), stage.DEFAULTS, quick, stage.QUICK)
    with stage_progress("drafts", enabled=not as_json) as prog:
        doc = stage.run(cases=cases or None, registry_dir=registry_dir, seed=seed, out_dir=out, quick=quick,
                        progress=prog, **s)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    s = doc["summary"]
    t = Table(title=f"Drafted argument decoding · {doc['params']['model']} · {s['n_cases']} cases",
              title_justify="left", caption=env_line(doc), caption_justify="left")
    for col in ("quantity", "one token a step", "drafted"):
        t.add_column(col, justify="right" if col != "quantity" else "left")
    t.add_row("specified argument values right %", fmt_pct(s["plain"]["specified_args"]),
              fmt_pct(s["drafted"]["specified_args"]))
    t.add_row("valid argument objects %", fmt_pct(s["plain"]["valid"]), fmt_pct(s["drafted"]["valid"]))
    t.add_row("argument call ms (median)", fmt_ci(s["plain"]["ms"], 0), fmt_ci(s["drafted"]["ms"], 0))
    sp = s["speedup_paired"]
    t.add_row("speedup (median of paired ratios)", "", f"{sp['value']:.2f}x [{sp['lo']:.2f}, {sp['hi']:.2f}]")
    t.add_row("identical arguments %", "", fmt_pct(s["identical_arguments"]))
    kept = s["draft_kept_share"]
    t.add_row("draft tokens kept", "", f"{s['draft_tokens_kept']} of {s['draft_tokens']}"
              + (f" ({kept * 100:.0f} %)" if kept is not None else ""))
    console.print(t)
