"""The retriever alone on the leave-servers-out dev part, over a grid of fusion settings: a cheap first look at a
setting before `nexus bench routing-lso` measures it with the gate and the reranker.

    python benchmarks/lso_retriever_sweep.py [--lex-weights 0,0.1,0.2,0.3] [--out results]

The dev part's index is built as `nexus bench routing-lso` builds it (no example requests, the default embedder;
cached), and each request of both dev sets (the dev servers' example requests and the requests written apart for
them, `benchmarks/queries/routing_dev_servers.jsonl`) is scored once per BM25 weight, the reranker off. Only the dev
part is read: the test part stays for the one run a rule allows. Writes results/routing-lso-retriever/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.adapters.embedder import Embedder  # noqa: E402
from nexus_cli.config import DEFAULT_EMBEDDER  # noqa: E402
from nexus_cli.lab import stats  # noqa: E402
from nexus_cli.lab.bench_lso import DEV_WRITTEN, dev_sets  # noqa: E402
from nexus_cli.lab.bench_routing import _index_for, gold_keys  # noqa: E402
from nexus_cli.lab.results import Run, model_identity  # noqa: E402
from nexus_cli.routing.router import Router, RouterConfig  # noqa: E402

SUITE = "routing-lso-retriever"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lex-weights", default="0,0.1,0.2,0.3")
    ap.add_argument("--out", default="results")
    args = ap.parse_args()
    weights = [float(w) for w in args.lex_weights.split(",")]

    tools, sets = dev_sets()
    emb = Embedder(DEFAULT_EMBEDDER)
    router = Router(_index_for(tools, emb), RouterConfig(reranker="none", prefix_store=False), embedder=emb)
    names = [f"{t.server}/{t.name}" for t in router.index.tools]
    run = Run(SUITE, {"part": "dev", "tools": len(tools), "lex_weights": weights, "index_lex_weight": router.lex_weight,
                      "sets": {k: len(v) for k, v in sets.items()}, "written": str(DEV_WRITTEN.relative_to(ROOT))},
              models={"embedder": model_identity(DEFAULT_EMBEDDER, kind="embedder")})
    summary: dict = {}
    samples: dict = {}
    for set_name, qs in sets.items():
        rows = []
        for w in weights:
            router.lex_weight = w
            for q in qs:
                scores, _ = router.retrieve(q["query"], q.get("history"))
                top = [names[i] for i in np.argsort(-scores, kind="stable")[:3]]
                gold = gold_keys(q)
                rows.append({"id": q.get("id"), "lex_weight": w, "top1": top[0] in gold, "top3": bool(set(top) & gold)})
        samples[set_name] = rows
        summary[set_name] = {}
        for w in weights:
            sel = [r for r in rows if r["lex_weight"] == w]
            t1 = stats.wilson(sum(r["top1"] for r in sel), len(sel))
            t3 = stats.wilson(sum(r["top3"] for r in sel), len(sel))
            summary[set_name][str(w)] = {"top1": t1.as_dict(), "top3": t3.as_dict()}
            print(f"{set_name:9s} n={len(sel)} w={w:<4} top-1 {t1.value:.3f} [{t1.lo:.3f}, {t1.hi:.3f}] "
                  f"top-3 {t3.value:.3f}", flush=True)
    doc = run.write(summary, samples, out_dir=args.out)
    print(f"results: {doc['files']['json']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
