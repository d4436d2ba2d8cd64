"""nexus bench routing: Fig. 5 / Table IV (routing accuracy against registry size, the oracle, gate and scan costs)."""

from __future__ import annotations

from typing import Optional

import typer

from . import options
from ._progress import stage_progress
from ._report import env_line, finish, fmt_ci, fmt_pct


def command(
    registry_dir: Optional[str] = options.registry_dir(),
    sizes: Optional[str] = typer.Option(None, "--sizes", help="Registry sizes (integers and ALL; default 10,50,100,250,ALL)."),
    queries: Optional[str] = typer.Option(None, "--queries", help="Queries JSONL (default benchmarks/queries/routing.jsonl)."),
    model: Optional[str] = options.model("LLM of the concatenate-all oracle and of the likelihood / llm rerankers (default qwen2.5-0.5b)."),
    embedder: Optional[str] = options.embedder(),
    examples: Optional[str] = typer.Option(None, "--examples", help="Example requests JSONL given to every index (nexus index --examples), e.g. tool_registries/examples/shared_registries.jsonl."),
    shipped_examples: bool = typer.Option(True, "--shipped-examples/--no-shipped-examples", help="Give each index the shipped example requests of the tools they cover, as nexus index does by default."),
    oracle: bool = typer.Option(True, "--oracle/--no-oracle", help="Run the concatenate-all-schemas oracle where it fits."),
    oracle_ctx: int = typer.Option(8192, "--oracle-ctx", help="Context of the oracle (tokens); larger prompts overflow."),
    oracle_max_queries: int = typer.Option(100, "--oracle-max-queries", help="Oracle on whole groups until this many queries (0: all)."),
    reranker: str = typer.Option("auto", "--reranker", help="auto (the product default, as nexus route picks per index: likelihood on escalation, none for an embedder fine-tuned on example requests), likelihood, none or llm."),
    max_queries: Optional[int] = typer.Option(None, "--max-queries", help="Use only the first N queries."),
    seed: int = options.seed("Seed of the distractor draws and the bootstrap."),
    quick: bool = options.quick("CI smoke run: sizes 10,50, first 30 queries."),
    out: str = options.results_out("routing"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import bench_routing as stage  # lazy: `nexus --help` stays fast

    s = options.settings(dict(sizes=sizes, model=model, embedder=embedder, max_queries=max_queries), stage.DEFAULTS,
                         quick, stage.QUICK)
    with stage_progress("routing") as prog:
        doc = stage.run(registry_dir=registry_dir, queries=queries, examples=examples,
                        shipped_examples=shipped_examples, oracle=oracle,
                        oracle_ctx=oracle_ctx, oracle_max_queries=oracle_max_queries or None, reranker=reranker,
                        seed=seed, out_dir=out, quick=quick, progress=prog, **s)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    s = doc["summary"]
    p = doc["params"]
    t = Table(title=f"Routing accuracy vs registry size (Fig. 5 / Table IV) · {p['n_queries']} queries · pool {p['pool_tools']} tools",
              title_justify="left")
    for col in ("N", "registries", "accuracy % [95% CI]", "+ interchangeable %", "paper", "no reranker", "lift pp", "retriever top-1/top-3 %",
                "SLB top-1/top-3 %", "τ", "fire %", "scan in-situ µs", "scan native µs", "oracle"):
        t.add_column(col, justify="right")
    for r in s["rows"]:
        o = r.get("oracle")
        if not o:
            otxt = "—"
        elif o["status"] == "ran":
            otxt = f"{fmt_pct(o['accuracy'], 1)} ({o['prompt_tokens_max']} tok)"
        else:
            otxt = f"overflow ({o['prompt_tokens_max']} tok > {o['context']})"
        t.add_row(
            r["size"], str(r["registries"]), fmt_pct(r["accuracy"]),
            f"{r['accuracy_interchangeable']['value'] * 100:.1f}" if r.get("accuracy_interchangeable") else "—",
            f"{r['paper_accuracy'] * 100:.0f}" if r.get("paper_accuracy") else "—",
            f"{r['accuracy_no_rerank']['value'] * 100:.1f}", f"{r['reranker_lift_pp']:+.1f}",
            f"{r['retriever_top1']['value'] * 100:.1f} / {r['retriever_top3']['value'] * 100:.1f}",
            f"{r['slb_top1']['value'] * 100:.1f} / {r['slb_top3']['value'] * 100:.1f}",
            f"{r['tau_median']:.4f}", f"{r['fire_rate']['value'] * 100:.1f}",
            fmt_ci(r["scan_in_situ_us"], 1), fmt_ci(r["scan_native_us"], 2), otxt,
        )
    console.print(t)
    tg = s.get("target_ge_95_at_250")
    if tg is not None:
        console.print(f"target routing >= 95 % at N = 250: {'met' if tg else 'NOT met'}", highlight=False)
    console.print(f"[dim]{env_line(doc)}[/]", highlight=False)
