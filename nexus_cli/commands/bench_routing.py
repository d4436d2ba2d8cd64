"""nexus bench routing: Fig. 5 / Table IV (routing accuracy against registry size, the oracle, gate and scan costs)."""

from __future__ import annotations

from typing import Optional

import typer

from ._progress import stage_progress
from ._report import env_line, finish, fmt_ci, fmt_pct


def command(
    registry_dir: Optional[str] = typer.Option(None, "--registry-dir", help="Registries folder (default ../shared/registries)."),
    sizes: str = typer.Option("10,50,100,250,ALL", "--sizes", help="Registry sizes (integers and ALL)."),
    queries: Optional[str] = typer.Option(None, "--queries", help="Queries JSONL (default benchmarks/queries/routing.jsonl)."),
    model: str = typer.Option("qwen2.5-0.5b", "--model", "-m", help="LLM of the concatenate-all oracle and of the likelihood / llm rerankers."),
    embedder: str = typer.Option("minilm", "--embedder", help="Embedder name or folder."),
    examples: Optional[str] = typer.Option(None, "--examples", help="Example requests JSONL given to every index (nexus index --examples), e.g. tool_registries/examples/shared_registries.jsonl."),
    oracle: bool = typer.Option(True, "--oracle/--no-oracle", help="Run the concatenate-all-schemas oracle where it fits."),
    oracle_ctx: int = typer.Option(8192, "--oracle-ctx", help="Context of the oracle (tokens); larger prompts overflow."),
    oracle_max_queries: int = typer.Option(100, "--oracle-max-queries", help="Oracle on whole groups until this many queries (0: all)."),
    reranker: str = typer.Option("auto", "--reranker", help="auto (the product default, as nexus route picks per index: likelihood on escalation, none for an embedder fine-tuned on example requests), likelihood, none, cross (trained once on ALL, shared) or llm."),
    reranker_budget: float = typer.Option(300.0, "--reranker-budget", help="Reranker training budget (s)."),
    max_queries: Optional[int] = typer.Option(None, "--max-queries", help="Use only the first N queries."),
    seed: int = typer.Option(0, "--seed", help="Seed of the distractor draws and the bootstrap."),
    quick: bool = typer.Option(False, "--quick", help="CI smoke run: sizes 10,50, first 30 queries, 20 s reranker."),
    out: str = typer.Option("results", "--out", help="Results folder (writes <out>/routing/)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results document as JSON."),
) -> None:
    from ..stages import bench_routing as stage

    if quick:
        q = stage.QUICK
        sizes = ",".join(q["sizes"]) if sizes == "10,50,100,250,ALL" else sizes
        max_queries = max_queries or q["max_queries"]
        reranker_budget = q["reranker_budget"] if reranker_budget == 300.0 else reranker_budget
    with stage_progress("routing") as prog:
        doc = stage.run(registry_dir=registry_dir, sizes=sizes, queries=queries, model=model, embedder=embedder,
                        examples=examples, oracle=oracle, oracle_ctx=oracle_ctx,
                        oracle_max_queries=oracle_max_queries or None, reranker=reranker, reranker_budget=reranker_budget,
                        max_queries=max_queries, seed=seed, out_dir=out, quick=quick, progress=prog)
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
