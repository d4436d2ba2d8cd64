"""nexus bench args: argument fidelity and first-argument latency against full-schema re-prefill."""

from __future__ import annotations

from typing import List, Optional

import typer

from ..errors import UsageError
from . import options
from ._progress import stage_progress
from ._report import env_line, finish, fmt_ci, fmt_pct, fmt_speedup


def command(
    cases: Optional[List[str]] = typer.Option(None, "--cases", help="Cases JSONL (repeatable; default: the blind set benchmarks/queries/args_cases_j.jsonl)."),
    examples: Optional[str] = typer.Option(None, "--examples", help="Example requests the index is built with (default: tool_registries/examples/shared_registries.jsonl)."),
    no_examples: bool = typer.Option(False, "--no-examples", help="Route over an index built without example requests."),
    registry_dir: Optional[str] = options.registry_dir(),
    model: Optional[str] = options.model(help="LLM for arguments, as `nexus route --model` (default qwen2.5-1.5b; the likelihood reranker then runs on qwen2.5-0.5b)."),
    embedder: Optional[str] = options.embedder(),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, help="Latency repetitions per case and path (default 1)."),
    max_cases: Optional[int] = typer.Option(None, "--max-cases", help="Use only the first N cases."),
    reranker: str = typer.Option("likelihood", "--reranker", help="likelihood (the product default: LLM query likelihood on escalation, docs/routing.md) or none."),
    pool: str = typer.Option("all", "--pool", help="Registry to route over: all, core, or cases (only the cases' gold tools)."),
    seed: int = options.seed(),
    quick: bool = options.quick("CI smoke run: first 6 cases, 1 trial."),
    out: str = options.results_out("args"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import bench_args as stage  # lazy: `nexus --help` stays fast

    s = options.settings(dict(model=model, embedder=embedder, trials=trials, max_cases=max_cases), stage.DEFAULTS,
                         quick, stage.QUICK)
    if no_examples and examples:
        raise UsageError("give --examples FILE or --no-examples, not both")
    with stage_progress("args") as prog:
        doc = stage.run(cases=cases or None, registry_dir=registry_dir, reranker=reranker, pool=pool, seed=seed,
                        out_dir=out, quick=quick, progress=prog,
                        examples=None if no_examples else (examples or stage.DEFAULT_EXAMPLES), **s)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    s = doc["summary"]
    p = doc["params"]
    pp = s["paper"]
    t = Table(title=f"Argument fidelity · {p['model']} · {p['n_cases']} cases", title_justify="left")
    t.add_column("quantity")
    t.add_column("Nexus [95% CI]", justify="right")
    t.add_column("n", justify="right")
    t.add_column("paper", justify="right")
    t.add_row("routing accuracy %", fmt_pct(s["routing"]), str(s["routing"]["n"]), f"{pp['routing'] * 100:.1f}")
    t.add_row("specified-argument accuracy % (routed)", fmt_pct(s["specified_args"]), str(s["specified_args"]["n"]), "100")
    t.add_row("end-to-end argument accuracy %", fmt_pct(s["end_to_end_args"]), str(s["end_to_end_args"]["n"]), "80")
    t.add_row("cases with every argument right %", fmt_pct(s["cases_all_args_correct"]), str(s["cases_all_args_correct"]["n"]), "—")
    t.add_row("JSON validity %", fmt_pct(s["json_validity"]), str(s["json_validity"]["n"]), "100")
    t.add_row("schema validity %", fmt_pct(s["schema_validity"]), str(s["schema_validity"]["n"]), "—")
    st = s["signature_tokens"]
    t.add_row("signature tokens median / p99", f"{st['median']:.0f} / {st['p99']:.0f}", str(st["n_tools"]), "19 / 32")
    fa = s.get("first_arg")
    if fa:
        for mode in ("steady", "cold"):
            m = fa[mode]
            t.add_row(f"first-arg token ms, signature ({mode})", fmt_ci(m["signature_ms"], 1), str(m["signature_ms"]["n"]),
                      f"{pp['first_arg_ms_sig']}" if mode == "steady" else "—")
            t.add_row(f"first-arg token ms, full schema ({mode})", fmt_ci(m["full_schema_ms"], 1), str(m["full_schema_ms"]["n"]),
                      f"{pp['first_arg_ms_full']}" if mode == "steady" else "—")
            t.add_row(f"speedup ({mode})", fmt_speedup(m["speedup"]), "", "1.66x" if mode == "steady" else "—")
        t.add_row("main-context token saving per turn %", f"{fa['token_saving_turn'] * 100:.1f}", str(fa["n_cases"]), "≈80")
        t.add_row("tool-text token saving %", f"{fa['token_saving_tool_text'] * 100:.1f}", str(fa["n_cases"]), "—")
    console.print(t)
    by_file = s.get("by_file") or {}
    if len(by_file) > 1:
        f = Table(title="per case file", title_justify="left")
        for col in ("cases", "file", "routing %", "specified arguments % (routed)"):
            f.add_column(col, justify="left" if col == "file" else "right")
        for name, row in by_file.items():
            f.add_row(str(row["cases"]), name, fmt_pct(row["routing"]), fmt_pct(row["specified_args"]))
        console.print(f)
    if "target_first_arg_ge_3x_at_ge_90pct_saving" in s:
        console.print(f"target first-arg >= 3x at >= 90 % saving: {'met' if s['target_first_arg_ge_3x_at_ge_90pct_saving'] else 'NOT met'}",
                      highlight=False)
    console.print(f"[dim]{env_line(doc)}[/]", highlight=False)
