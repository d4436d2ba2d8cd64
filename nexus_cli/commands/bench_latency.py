"""nexus bench latency: the SLB kernel, the router's scan step, the request encoder, a warm and a one-shot route,
each against its baseline in one run."""

from __future__ import annotations

from typing import Optional

import typer

from . import options
from ._progress import stage_progress
from ._report import env_line, finish, fmt_ci, fmt_num, fmt_speedup


def command(
    small: Optional[int] = typer.Option(None, "--small", help="Tools of the small index (a draw from the shared registries; default 250)."),
    reps: Optional[int] = typer.Option(None, "--reps", help="Rounds over the requests for the scan step (a quarter of them for the encoder and the warm route; default 20)."),
    oneshot_requests: Optional[int] = typer.Option(None, "--oneshot-requests", help="Requests run as one-shot processes (default 8)."),
    oneshot_rounds: Optional[int] = typer.Option(None, "--oneshot-rounds", help="Rounds of one-shot processes (default 3)."),
    demo_rounds: Optional[int] = typer.Option(None, "--demo-rounds", help="Rounds of `make demo`'s request one-shot with arguments, each side once a round (default 5; 0 skips it)."),
    demo_baseline_ref: Optional[str] = typer.Option(None, "--demo-baseline-ref", help="The commit whose `make demo` request is the demo's baseline (default 39f5b35; 'none' to skip)."),
    index_rounds: Optional[int] = typer.Option(None, "--index-rounds", help="Rounds of `nexus index` over a 298-tool registry of ../shared/registries, a fresh process each (default 3; 0 skips it)."),
    index_baseline_ref: Optional[str] = typer.Option(None, "--index-baseline-ref", help="The commit whose `nexus index` is the index builds' baseline (default 4d41b6e, the last that embedded through sentence-transformers; 'none' to skip)."),
    baseline_ref: Optional[str] = typer.Option(None, "--baseline-ref", help="The commit whose one-shot route is the baseline (default: the last one before the native scan step and encoder; 'none' to skip)."),
    queries: Optional[str] = typer.Option(None, "--queries", help="Request JSONL (default benchmarks/queries/routing.jsonl; only the text is used)."),
    registry_dir: Optional[str] = options.registry_dir(),
    seed: int = options.seed(),
    quick: bool = options.quick("CI smoke run: 12 requests, a 50-tool index, few repetitions, no baseline tree."),
    out: str = options.results_out("latency"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import bench_latency as stage  # lazy: `nexus --help` stays fast

    s = options.settings(dict(small=small, reps=reps, oneshot_requests=oneshot_requests, oneshot_rounds=oneshot_rounds,
                              baseline_ref=baseline_ref, demo_rounds=demo_rounds,
                              demo_baseline_ref=demo_baseline_ref, index_rounds=index_rounds,
                              index_baseline_ref=index_baseline_ref), stage.DEFAULTS, quick,
                       stage.QUICK)
    for k in ("baseline_ref", "demo_baseline_ref", "index_baseline_ref"):
        if s[k] in ("none", ""):
            s[k] = None
    for k in ("reps", "oneshot_requests", "oneshot_rounds"):
        if s[k] < 1:
            raise typer.BadParameter("must be at least 1", param_hint=f"--{k.replace('_', '-')}")
    for k in ("demo_rounds", "index_rounds"):
        if s[k] < 0:
            raise typer.BadParameter("must be 0 or more", param_hint=f"--{k.replace('_', '-')}")
    with stage_progress("latency", enabled=not as_json) as prog:
        doc = stage.run(queries=queries, registry_dir=registry_dir, seed=seed, quick=quick, out_dir=out, progress=prog,
                        **s)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    s = doc["summary"]
    t = Table(title=f"latency · simd {doc['params']['simd_level']}", title_justify="left", caption=env_line(doc),
              caption_justify="left")
    for col in ("step", "product", "baseline", "baseline / product"):
        t.add_column(col, justify="right" if col != "step" else "left")
    for n, r in s["kernel"].items():
        t.add_row(f"SLB top-5, {int(n):,} x 384 (µs; agreement {r['top1_agreement']:.3f})", fmt_num(r["cpp_us_p50"], 2),
                  f"NumPy f32 {fmt_num(r['numpy_f32_us_p50'], 1)}", f"{r['speedup_cpp_vs_numpy_f32']:.1f}x")
    for name, r in s["scan_step"].items():
        t.add_row(f"scan step, {r['tools']} tools / {r['vectors']} vectors (µs{'' if r['identical_scores'] else ', SCORES DIFFER'})",
                  fmt_ci(r["product"]["median_ci_us"], 1), f"previous {fmt_ci(r['previous']['median_ci_us'], 1)}",
                  fmt_speedup(r["speedup"]))
    e = s["encoder"]
    t.add_row("request encoder, native f16 layers (ms)", fmt_ci(e["product_native_f16"]["median_ci_ms"], 2),
              f"NumPy f32 {fmt_ci(e['numpy_f32']['median_ci_ms'], 2)}", fmt_speedup(e["speedup_vs_numpy_f32"]))
    t.add_row("", "", f"sentence-transformers {fmt_ci(e['sentence_transformers']['median_ci_ms'], 2)}",
              fmt_speedup(e["speedup_vs_sentence_transformers"]))
    layers = {"native_f16": "native f16", "numpy_f32": "NumPy f32"}.get(e.get("warm_layers"), "native f16")
    for name, r in s["warm_route"].items():
        t.add_row(f"warm request, {r['index_tools']} tools (ms; {layers} layers)", fmt_ci(r["total"]["median_ci_ms"], 2),
                  "—", "—")
    for name, o in s["oneshot"].items():
        base = o.get("baseline")
        t.add_row(f"one-shot route --no-args, {name} index (ms, {o['escalated_share'] * 100:.0f} % escalated)",
                  fmt_ci(o["product"]["all"]["median_ci_ms"], 0),
                  f"{o.get('baseline_ref')} {fmt_ci(base['all']['median_ci_ms'], 0)}" if base else "—",
                  fmt_speedup(o.get("speedup")) if base else "—")
    d = s.get("demo")
    if d:
        base = d.get("baseline")
        t.add_row("`make demo`'s request one-shot with arguments, wall (ms)",
                  fmt_ci(d["product"]["wall"]["median_ci_ms"], 0),
                  f"{d.get('baseline_ref')} {fmt_ci(base['wall']['median_ci_ms'], 0)}" if base else "—",
                  fmt_speedup(d.get("speedup")) if base else "—")
    for key, what in (("index_build", "no synthesis"), ("index_build_demo", "`make demo`'s registry")):
        ib = s.get(key)
        if ib:
            base = ib.get("baseline")
            t.add_row(f"`nexus index`, {ib['tools']} tools, {what}, a fresh process (ms; target {ib['target_s']} s)",
                      fmt_ci(ib["wall"]["median_ci_ms"], 0),
                      f"{ib.get('baseline_ref')} {fmt_ci(base['wall']['median_ci_ms'], 0)}" if base else "—",
                      fmt_speedup(ib.get("speedup")) if base else "—")
    console.print(t)
