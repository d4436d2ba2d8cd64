"""Routing on servers the router never trained on (leave-servers-out): `nexus bench routing-lso`.

The split (benchmarks/server_splits.json) keeps whole server families out of the router embedder's training: its
dev servers choose settings, its test servers report. For one part, the index holds that part's tools only, built
without any example request (a user's own registry nobody wrote examples for), and every request whose gold tool is
in the part is routed as `nexus route` routes it (with `--synthesize`, the index also holds the requests the LLM
writes for each tool, as `nexus index --synthesize` builds it: still no hand-written example). Reported: top-1 and top-3 with Wilson intervals, strictly and
counting a pick of the same tool on another server (interchangeable) as right, overall and for follow-ups (requests
with a history); each request's decision is kept in the samples. Escalated decisions are timed twice: in the first
pass with their candidates' prefixes cold, then routed again with them decoded (warm; `warm=False` skips it).

Requests: `--queries FILE` (repeatable); by default, for dev the dev servers' example requests (never trained on:
the embedder learns from train servers only), for test the held-out query sets benchmarks/queries/routing.jsonl and
benchmarks/queries/routing_heldout_servers.jsonl, restricted to the part's servers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..adapters.embedder import index_embedder
from ..config import DEFAULT_EMBEDDER, REPO_ROOT
from ..errors import UsageError
from ..registry import load_example_requests, load_registries
from ..routing.router import Router, RouterConfig
from ..routing.synthesize import RequestWriter
from . import stats
from .bench_routing import _index_for, gold_keys, load_queries, with_interchangeable
from .common import NULL_PROGRESS, Progress, registry_dir_default
from .results import Run, model_identity

SUITE = "routing-lso"
SPLITS = REPO_ROOT / "benchmarks" / "server_splits.json"
EXAMPLES = REPO_ROOT / "tool_registries" / "examples" / "shared_registries.jsonl"
TEST_QUERIES = [REPO_ROOT / "benchmarks" / "queries" / "routing.jsonl",
                REPO_ROOT / "benchmarks" / "queries" / "routing_heldout_servers.jsonl"]
PARTS = ("dev", "test")
DEFAULTS = dict(embedder=DEFAULT_EMBEDDER, max_queries=None)
QUICK = dict(max_queries=24)


def part_servers(part: str, splits: Path = SPLITS) -> set[str]:
    doc = json.loads(Path(splits).read_text(encoding="utf-8"))
    if part not in PARTS:
        raise UsageError(f"unknown part '{part}' ({', '.join(PARTS)})")
    return set(doc[part])


def dev_requests(servers: set[str], per_tool: int = 3) -> list[dict]:
    """The dev servers' example requests as queries: the first `per_tool` of each tool."""
    examples = load_example_requests([EXAMPLES])
    out = []
    for key, reqs in sorted(examples.items()):
        server, tool = key.split("/", 1)
        if server in servers:
            out += [{"id": f"{key}#{i}", "query": q, "server": server, "tool": tool, "set": "dev-examples"}
                    for i, q in enumerate(reqs[:per_tool])]
    return out


DEV_WRITTEN = REPO_ROOT / "benchmarks" / "queries" / "routing_dev_servers.jsonl"


def dev_sets(registry_dir: str | None = None) -> tuple[list, dict[str, list[dict]]]:
    """The dev part's tools and its two request sets, each kept to requests whose gold tool is among them: the dev
    servers' example requests ("examples") and the requests written apart for them ("written")."""
    servers = part_servers("dev")
    reg_dir = Path(registry_dir) if registry_dir else registry_dir_default()
    tools = [t for t in load_registries([reg_dir]) if t.server in servers]
    keys = {t.key for t in tools}
    sets = {"examples": dev_requests(servers), "written": load_queries(DEV_WRITTEN)}
    return tools, {name: [q for q in qs if gold_keys(q) & keys] for name, qs in sets.items()}


def run(
    part: str = "dev",
    embedder: str = DEFAULT_EMBEDDER,
    queries: list[str] | None = None,
    reranker: str = "auto",
    rerank_k: int | None = None,
    model: str | None = None,
    synthesize_model: str | None = None,
    finetune: bool = False,
    lex_weight: float | None = None,
    history_weight: float | None = None,
    registry_dir: str | None = None,
    max_queries: int | None = None,
    warm: bool = True,
    seed: int = 0,
    out_dir: str = "results",
    quick: bool = False,
    progress: Progress = NULL_PROGRESS,
    write: bool = True,
) -> dict:
    servers = part_servers(part)
    reg_dir = Path(registry_dir) if registry_dir else registry_dir_default()
    tools = [t for t in load_registries([reg_dir]) if t.server in servers]
    keys = {t.key for t in tools}
    if queries:
        files = [Path(q) for q in queries]
        qs = [q for f in files for q in load_queries(f)]
    elif part == "dev":
        files, qs = [EXAMPLES], dev_requests(servers)
    else:
        files = [f for f in TEST_QUERIES if f.is_file()]
        qs = [q for f in files for q in load_queries(f)]
    qs = [q for q in qs if gold_keys(q) & keys]
    if max_queries:
        qs = qs[:max_queries]
    if not qs:
        raise UsageError(f"no request has its gold tool among the {part} servers' tools")
    # with synthesize_model, the LLM writes requests for the part's tools as `nexus index --synthesize` does (cached)
    writer = RequestWriter(synthesize_model) if synthesize_model else None
    emb = index_embedder(embedder)  # the part's index and its requests embedded as the product embeds them
    config = RouterConfig(reranker=reranker, rerank_k=rerank_k, rerank_model=model, prefix_store=False,
                          **({} if history_weight is None else {"history_weight": history_weight}))
    ipath = _index_for(tools, emb, synthesize=writer, lex_weight=lex_weight, finetune=finetune)
    # an index with its own fine-tuned embedder: the router loads it as `nexus route` does
    router = Router(ipath, config, embedder=None if finetune else emb)
    synth_info = (router.index.manifest["recipe"].get("examples") or {}).get("synthesized")
    used = router.reranker_name  # what `auto` resolved to for this index
    params = dict(part=part, splits=os.path.relpath(SPLITS, REPO_ROOT), servers=len(servers), tools=len(tools),
                  queries=[os.path.relpath(f, REPO_ROOT) for f in files], n_queries=len(qs), embedder=embedder,
                  reranker=used, reranker_option=reranker, model=router.rerank_model,
                  rerank_k=router.rerank_k if used != "none" else None,
                  max_queries=max_queries, quick=quick, examples=None, synthesized=synth_info,
                  finetuned=router.index.manifest.get("embedder", {}).get("finetuned"),
                  lex_weight=router.lex_weight, history_weight=config.history_weight, warm=warm)
    models = {"embedder": model_identity(embedder, kind="embedder")}
    if used != "none":
        models["llm"] = model_identity(router.rerank_model)
    run_ = Run(SUITE, params, seed=seed, models=models)
    progress.set_total(len(qs))
    rows = []
    for q in qs:
        res = router.route(q["query"], q.get("history"), with_args=False)
        gold = gold_keys(q)
        loose = with_interchangeable(gold, router.index)
        picks = [f"{c.server}/{c.tool}" for c in res.candidates]
        rows.append({"id": q.get("id"), "gold": f"{q['server']}/{q['tool']}", "choice": picks[0],
                     "top1": picks[0] in gold, "top3": bool(set(picks[:3]) & gold),
                     "top1_interchangeable": picks[0] in loose, "top3_interchangeable": bool(set(picks[:3]) & loose),
                     "set": q.get("set"), "follow_up": bool(q.get("history")), "escalated": res.gate["escalated"],
                     "reranked": res.reranker is not None, "name_choice": res.name_choice,
                     "ms": res.timings_ms["total"]})
        progress.advance(q.get("id") or "")
    if warm:
        _warm_pass(router, qs, rows, progress)

    def rate(key, subset=None):
        sel = [r for r in rows if subset is None or subset(r)]
        return stats.wilson(sum(r[key] for r in sel), len(sel))

    summary = {"n": len(rows), "n_follow_up": sum(r["follow_up"] for r in rows),
               "top1": rate("top1"), "top3": rate("top3"),
               "top1_interchangeable": rate("top1_interchangeable"), "top3_interchangeable": rate("top3_interchangeable"),
               "follow_up_top1": rate("top1", lambda r: r["follow_up"]),
               "escalated": rate("escalated"), "ms_median": float(np.median([r["ms"] for r in rows])),
               # per query set (a file's `set` field): requests after another conversation's turns apart from the rest
               "by_set": {name: {"n": sum(r["set"] == name for r in rows),
                                 "top1": rate("top1", lambda r, n=name: r["set"] == n),
                                 "top3": rate("top3", lambda r, n=name: r["set"] == n)}
                          for name in sorted({r["set"] for r in rows if r["set"]})}}
    summary["ms_escalated"] = _escalated_ms(rows, "ms")
    if warm:
        summary["ms_escalated_warm"] = _escalated_ms(rows, "ms_warm")
        summary["warm_same_choice"] = sum(r["choice_warm"] == r["choice"] for r in rows if r["escalated"])
    if not write:
        return run_.document(summary, {"queries": rows})
    return run_.write(summary, {"queries": rows}, out_dir=out_dir)


def _warm_pass(router: Router, qs: list[dict], rows: list[dict], progress: Progress) -> None:
    """Route every escalated request a second time, in the same process: its candidates' prefixes are now decoded
    (the likelihood reranker keeps them in memory), as in `nexus serve` or `nexus route --batch` once a registry's
    tools have been seen, or a one-shot route whose prefixes the prefix store holds. Nothing keyed on the request is
    kept: the request is embedded, scanned, gated and reranked again, and the name choice's prompt is decoded again.
    The cold pass (the bench turns the prefix store off) times prefixes nobody has decoded."""
    again = [(q, r) for q, r in zip(qs, rows) if r["escalated"]]
    progress.set_total(len(rows) + len(again))  # one bar: the first pass's requests, then these
    for q, r in again:
        res = router.route(q["query"], q.get("history"), with_args=False)
        r["ms_warm"] = res.timings_ms["total"]
        r["choice_warm"] = f"{res.candidates[0].server}/{res.candidates[0].tool}"
        progress.advance(f"warm {q.get('id') or ''}")


def _escalated_ms(rows: list[dict], key: str) -> dict | None:
    """The median time of an escalated decision (embed, scan, gate and rerank), with its bootstrap interval."""
    ms = [r[key] for r in rows if r["escalated"] and key in r]
    return {"median": stats.median_ci(ms), "mean": float(np.mean(ms))} if ms else None
