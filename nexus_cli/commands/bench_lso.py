"""nexus bench routing-lso: routing on servers the router embedder never trained on (leave-servers-out)."""

from __future__ import annotations

from typing import List, Optional

import typer

from . import options
from ._progress import stage_progress
from ._report import env_line, finish, fmt_ci


def command(
    part: str = typer.Option("dev", "--part", help="Split part to route over: dev (settings are chosen on it) or test (reported)."),
    embedder: Optional[str] = options.embedder(),
    queries: Optional[List[str]] = typer.Option(None, "--queries", help="Request JSONL files (default: dev: the dev servers' example requests; test: the held-out query sets)."),
    reranker: str = typer.Option("auto", "--reranker", help="auto (the product's choice for the index), none (retriever and gate alone), likelihood, llm or cascade."),
    rerank_k: Optional[int] = typer.Option(None, "--rerank-k", help="Candidates the reranker reads (default: the reranker's own: likelihood 4, llm and cascade 5)."),
    model: Optional[str] = options.model("LLM of the reranker (default: the product's, qwen2.5-0.5b for likelihood, qwen2.5-1.5b for llm)."),
    synthesize: bool = typer.Option(False, "--synthesize/--no-synthesize", help="Index the part's tools with example requests the LLM writes for them (as `nexus index --synthesize`)."),
    synthesize_model: Optional[str] = typer.Option(None, "--synthesize-model", help="The LLM that writes them (default qwen2.5-1.5b)."),
    finetune: bool = typer.Option(False, "--finetune/--no-finetune", help="Fine-tune the embedder on the part's example requests (with --synthesize, the written ones) as `nexus index --finetune` does, with its default recipe (minutes)."),
    lex_weight: Optional[float] = typer.Option(None, "--lex-weight", help="Build the part's index with this BM25 weight (default: `nexus index`'s, 0.2)."),
    history_weight: Optional[float] = typer.Option(None, "--history-weight", help="Share of the history-prefixed request in the scores of a request with a history (default: the router's)."),
    registry_dir: Optional[str] = options.registry_dir(),
    max_queries: Optional[int] = typer.Option(None, "--max-queries", help="Use only the first N requests."),
    warm: bool = typer.Option(True, "--warm/--no-warm", help="Route the escalated requests a second time with their candidates' prefixes decoded, and time that too (the warm decision)."),
    seed: int = options.seed(),
    quick: bool = options.quick("CI smoke run: the first 24 requests."),
    out: str = options.results_out("routing-lso"),
    as_json: bool = options.as_json(),
) -> None:
    from ..config import SYNTHESIS_MODEL
    from ..lab import bench_lso as stage  # lazy: `nexus --help` stays fast

    s = options.settings(dict(embedder=embedder, max_queries=max_queries), stage.DEFAULTS, quick, stage.QUICK)
    with stage_progress("routing-lso") as prog:
        doc = stage.run(part=part, queries=queries, reranker=reranker, rerank_k=rerank_k, model=model,
                        synthesize_model=(synthesize_model or SYNTHESIS_MODEL) if synthesize else None,
                        finetune=finetune, lex_weight=lex_weight, history_weight=history_weight, registry_dir=registry_dir, warm=warm, seed=seed, out_dir=out, quick=quick, progress=prog, **s)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    s, p = doc["summary"], doc["params"]
    console.print(f"routing on unseen servers · part {p['part']} · {p['servers']} servers, {p['tools']} tools · "
                  f"{s['n']} requests ({s['n_follow_up']} follow-ups) · embedder {p['embedder']} · reranker {p['reranker']}"
                  + (f" · requests written by {p['synthesized']['model']}" if p.get("synthesized") else "")
                  + (" · embedder fine-tuned on them" if p.get("finetuned") else ""),
                  highlight=False)
    for key in ("top1", "top3", "top1_interchangeable", "top3_interchangeable", "follow_up_top1", "escalated"):
        iv = s[key]
        console.print(f"  {key:22s} {fmt_ci(iv, 1, 100)} %", highlight=False)
    for name, row in (s.get("by_set") or {}).items():
        console.print(f"  set {name}: n {row['n']} · top-1 {fmt_ci(row['top1'], 1, 100)} % · "
                      f"top-3 {fmt_ci(row['top3'], 1, 100)} %", highlight=False)
    console.print(f"  median {s['ms_median']:.1f} ms a request", highlight=False)
    for key, what in (("ms_escalated", "escalated, prefixes cold"), ("ms_escalated_warm", "escalated, prefixes warm")):
        if s.get(key):
            console.print(f"  {what:24s} median {fmt_ci(s[key]['median'], 0)} ms, mean {s[key]['mean']:.0f} ms",
                          highlight=False)
    if s.get("ms_escalated_warm"):
        console.print(f"  the warm pass chose the same tool for {s['warm_same_choice']} of "
                      f"{s['ms_escalated_warm']['median']['n']} escalated requests", highlight=False)
    console.print(f"[dim]{env_line(doc)}[/]", highlight=False)
