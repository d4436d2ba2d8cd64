"""End-to-end routing latency of escalated decisions, reranker configurations side by side in one process.

    python benchmarks/rerank_latency.py --set core --work /tmp/nexus-ablation [--indexes core-multi core-multi-ex]

Every held-out request of the set is routed as `nexus route --no-args` routes it (the real MiniLM embedder, the
gate decides); the escalated decisions are timed (embed + scan + gate + rerank). Each configuration runs twice over
the same requests: the first pass starts with an empty prefix cache (cold), the second finds every candidate's
prefix cached (warm, as in `--batch` and `nexus serve`). All configurations share one LLM context, so the same
weights and threads serve each. The indexes are the ablation's (`routing_ablation.py` builds them into --work; with
`--examples` its index names end in `-ex`); each configuration runs over each index named.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from routing_ablation import queries_for  # noqa: E402

from nexus_cli.routing.index import load_index  # noqa: E402
from nexus_cli.routing.rerank import LikelihoodReranker  # noqa: E402
from nexus_cli.routing.router import Router, RouterConfig  # noqa: E402

CONFIGS = {  # name -> RouterConfig overrides; the first is the baseline the others are compared with
    "as-written-top5": {"rerank_k": 5, "rerank_masking": False},
    "masked-top4": {"rerank_k": 4, "rerank_masking": True},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="core", choices=["core", "all"])
    ap.add_argument("--work", default="/tmp/nexus-ablation", help="the ablation's work folder (its indexes)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--indexes", nargs="+", default=None, help="index folders under --work (default: SET-multi)")
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.adapters.llama import LlamaContext, LlamaModel

    names = args.indexes or [f"{args.set}-multi"]
    for name in names:
        if not (Path(args.work) / name / "manifest.json").is_file():
            print(f"no index at {Path(args.work) / name}: run benchmarks/routing_ablation.py --sets {args.set} "
                  f"--variants multi+lex --work {args.work} first", file=sys.stderr)
            return 2
    indexes = {name: load_index(Path(args.work) / name) for name in names}
    rows = queries_for(args.set)
    emb = Embedder("minilm")
    k_max = max(CONFIGS[c]["rerank_k"] for c in args.configs)
    llm = LlamaContext(LlamaModel(args.model), n_ctx=4096, n_seq_max=LikelihoodReranker.SEQ + k_max,
                       flash_attn=True)  # as the Router's own context
    results = []
    load_start = os.getloadavg()
    for name in args.configs:
        for index_name, index in indexes.items():
            own = index.manifest["embedder"].get("path")  # a fine-tuned index embeds queries with its own model
            # prefix_store off: "cold" means prefixes nobody decoded yet, not ones read back from disk
            router = Router(index, RouterConfig(reranker="likelihood", model=args.model, prefix_store=False,
                                                **CONFIGS[name]),
                            embedder=None if own else emb, llm=llm)
            label = name if len(indexes) == 1 else f"{name}@{index_name}"
            for pass_name in ("cold", "warm"):
                escalated, reranked, fast, hits = [], [], [], 0
                for q in rows:
                    res = router.route(q["query"], q.get("history"), with_args=False)
                    hits += (res.server, res.tool) == (q["server"], q["tool"])
                    if res.gate["escalated"]:
                        escalated.append(res.timings_ms["total"])
                        reranked.append(res.timings_ms["rerank"])
                    else:
                        fast.append(res.timings_ms["total"])
                row = {"set": args.set, "config": label, "pass": pass_name, "n": len(rows), "top1": hits / len(rows),
                       "escalated": len(escalated),
                       "escalated_total_median_ms": round(statistics.median(escalated), 1),
                       "escalated_total_p90_ms": round(float(np.percentile(escalated, 90)), 1),
                       "rerank_median_ms": round(statistics.median(reranked), 1),
                       "fast_path_total_median_ms": round(statistics.median(fast), 1) if fast else None}
                results.append(row)
                print(json.dumps(row), flush=True)
    first = results[0]["config"]
    base = {r["pass"]: r["escalated_total_median_ms"] for r in results if r["config"] == first}
    for r in results:
        r["ratio_to_first"] = round(r["escalated_total_median_ms"] / base[r["pass"]], 3)
    summary = {"load_average_start": load_start, "load_average_end": os.getloadavg(), "rows": results}
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
    for r in results:
        print(f"{r['config']:>16} {r['pass']}: escalated median {r['escalated_total_median_ms']} ms "
              f"({r['ratio_to_first']}x of {first}), top-1 {100 * r['top1']:.1f} %")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
