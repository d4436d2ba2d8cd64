"""nexus bench card-splice: the argument step in sessions with the tool's card spliced against re-prefilled, and the
card repair calibrated per model (lab/bench_cards.py)."""

from __future__ import annotations

from typing import Optional

import typer

from . import options
from ._progress import parse_int_list, stage_progress
from ._report import env_line, finish, fmt_ci, fmt_kl, fmt_speedup


def command(
    model: Optional[str] = options.model(),
    depths: Optional[str] = typer.Option(None, "--depths", help="Card depths in tokens; 0 is the product's history window (default 0,512,1024,2048)."),
    dev_cases: Optional[int] = typer.Option(None, "--dev-cases", min=1, help="Development conversations per case file (default 3)."),
    test_cases: Optional[int] = typer.Option(None, "--test-cases", min=0, help="Test conversations per case file (default 6; 0: calibrate on the development ones only)."),
    write_repair: bool = typer.Option(False, "--write-repair", help="Record the calibrated repair as the model's default (nexus_cli/arguments/card_repair.json)."),
    registry_dir: Optional[str] = options.registry_dir(),
    seed: int = options.seed("Seed of the bootstrap and of the path order."),
    quick: bool = options.quick("CI smoke run: SmolLM2, depths 0 and 512, one conversation per file and part."),
    out: str = options.results_out("card-splice"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import bench_cards as stage  # lazy: `nexus --help` stays fast

    s = options.settings(dict(model=model, depths=parse_int_list(depths, "--depths") if depths else None,
                              dev_cases=dev_cases, test_cases=test_cases), stage.DEFAULTS, quick, stage.QUICK)
    with stage_progress("card-splice") as prog:
        doc = stage.run(model=s["model"], depths=s["depths"], dev_cases=s["dev_cases"], test_cases=s["test_cases"],
                        registry_dir=registry_dir, seed=seed, out_dir=out, quick=quick, write_repair=write_repair,
                        progress=prog)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    s = doc["summary"]
    p = doc["params"]
    bands = ", ".join(f"{'≤' + str(b) if b is not None else 'deeper'}: {h:g} %" for b, h in s["repair"]["bands"])
    console.print(f"repair chosen on {s['dev_conversations']} development conversations (card share decoded after "
                  f"the conversation, per depth): {bands}", highlight=False)
    for band, d in s["repair"]["dev"].items():
        by = d.get("by_choice")
        if by:  # which card tokens to recompute, on the development conversations
            console.print(f"  band {band} (floor {fmt_kl(d['floor_kl_mean'])}): " + "; ".join(
                f"{name} " + " / ".join(fmt_kl(v) for v in by[name]["kl_mean"].values())
                + f" (2x floor from {by[name]['smallest_within']:g} %)" for name in ("first", "deviation", "layer1"))
                + f" at {' / '.join(by['first']['kl_mean'])} %", highlight=False)
    t = Table(title=f"Cards in sessions · {p['model']} · test part, {s['test_conversations']} conversations",
              title_justify="left")
    for col in ("depth", "n", "card depth", "card tok", "repair %", "re-prefill ms", "splice ms", "speedup",
                "same args", "KL", "KL bare", "floor"):
        t.add_column(col, justify="right")
    for depth, c in s["test"].items():
        if depth == "targets":
            continue
        t.add_row("window" if depth == "0" else depth, str(c["n"]), f"{c['head_median']:.0f}",
                  f"{c['card_tokens_median']:.0f}", "/".join(f"{h:g}" for h in c["head_pct"]),
                  fmt_ci(c["reprefill_ms"], 0), fmt_ci(c["splice_ms"], 0), fmt_speedup(c["speedup"]),
                  f"{c['same_arguments']['value'] * 100:.0f} %", fmt_kl(c["kl_mean"]), fmt_kl(c["kl_bare_mean"]),
                  fmt_kl(c["floor_kl_mean"]))
    console.print(t)
    alt = [(d, c["alt"]) for d, c in s["test"].items() if d != "targets"]
    if alt:
        console.print(f"with {alt[0][1]['head_pct']:g} % of the card decoded at every depth instead: " + "; ".join(
            f"{'window' if d == '0' else d}: {fmt_speedup(a['speedup'])}, same args "
            f"{a['same_arguments']['value'] * 100:.0f} %, KL {fmt_kl(a['kl_mean'])}" for d, a in alt), highlight=False)
    tg = s["test"]["targets"]["depth_ge_512"]
    console.print(f"targets at depth >= 512 (n={tg['n']}): speedup >= 2x: {_yn(tg['speedup_ge_2x'])}; same arguments "
                  f">= 98 %: {_yn(tg['same_arguments_ge_98pct'])}; KL <= 2x floor: {_yn(tg['kl_le_2x_floor'])}"
                  + ("" if tg.get("spliced", True) else " (the repair decodes every card: nothing was spliced)"),
                  highlight=False)
    console.print(f"[dim]{env_line(doc)}[/]", highlight=False)


def _yn(v) -> str:
    return "yes" if v else "NO"
