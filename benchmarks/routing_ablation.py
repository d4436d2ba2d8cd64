"""Routing ablation for model selection: each retrieval/rerank stage's contribution to accuracy and latency.

    python benchmarks/routing_ablation.py --sets core all --variants doc multi multi+lex ... [--out results.json]

Indexes are built from the registries alone (benchmarks/registry_sets.json); the held-out queries
(benchmarks/queries/routing.jsonl) are only *scored* here: nothing is trained or calibrated on them. A query of set
"core" is evaluated over the core registry; over the "all" registry every query is evaluated (core ⊂ all).
A hit is the gold (server, tool) pair (strict); `top1_acceptable` / `top3_acceptable` also count the alternatives a
query lists as acceptable (the same tool of another server generation, listed when the query was written), as
`nexus bench routing` scores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.lab.bench_routing import gold_keys, with_interchangeable  # noqa: E402
from nexus_cli.registry import load_registries  # noqa: E402
from nexus_cli.routing.build import build_index  # noqa: E402
from nexus_cli.routing.index import load_index  # noqa: E402
from nexus_cli.routing.router import Router, RouterConfig  # noqa: E402


class CachedEmbedder:
    """Wraps an Embedder with an on-disk text→vector cache (embedding is the slow part on a shared 2-core box)."""

    def __init__(self, inner, cache_file: Path):
        self.inner = inner
        self.path = inner.path
        self.dim = inner.dim
        self.prompts = getattr(inner, "prompts", {})
        self.cache_file = cache_file
        self.cache: dict[str, np.ndarray] = {}
        if cache_file.is_file():
            d = np.load(cache_file, allow_pickle=False)
            for k, v in zip(d["keys"], d["vecs"]):
                self.cache[str(k)] = v

    @staticmethod
    def _k(t: str) -> str:
        return hashlib.sha1(t.encode()).hexdigest()

    def encode(self, texts, batch_size=64, show_progress=False, callback=None, role="document"):
        # a query and a document of the same text differ for models with prompts, so the role is part of the key
        key = self._k if role == "document" else (lambda t: "q:" + self._k(t))
        missing = [t for t in dict.fromkeys(texts) if key(t) not in self.cache]
        if missing:
            vecs = self.inner.encode(missing, batch_size=batch_size, role=role)
            for t, v in zip(missing, vecs):
                self.cache[key(t)] = v
        if callback:
            callback(len(texts))
        return np.stack([self.cache[key(t)] for t in texts]).astype(np.float32)

    def encode_one(self, text):
        # cached too: accuracy runs reuse query vectors; latency is measured by a separate uncached pass (--latency)
        k = "q:" + self._k(text)
        if k not in self.cache:
            self.cache[k] = self.inner.encode_one(text)
        return self.cache[k]

    def encode_few(self, texts):
        return np.stack([self.encode_one(t) for t in texts])

    def save(self):
        keys = list(self.cache)
        np.savez(self.cache_file, keys=np.asarray(keys), vecs=np.stack([self.cache[k] for k in keys]))


def registry_paths(set_name: str) -> list[Path]:
    spec = json.loads((ROOT / "benchmarks" / "registry_sets.json").read_text())
    base = Path(os.environ.get("NEXUS_REGISTRIES", ROOT / spec["registries_dir"]["default"]))
    files = spec["sets"][set_name]["files"]
    return [base / f for f in files]


def queries_for(set_name: str) -> list[dict]:
    rows = [json.loads(x) for x in (ROOT / "benchmarks" / "queries" / "routing.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if set_name == "all" or r.get("set") == set_name]


def evaluate(router: Router, rows: list[dict], rerank) -> dict:
    top1 = top3 = top10 = top1_ok = top3_ok = top1_same = top3_same = 0
    lat_route, lat_rerank, esc = [], [], 0
    keys = [(t.server, t.name) for t in router.index.tools]
    cfg_k = router.config.top_k
    router.config.top_k = 10
    for r in rows:
        res = router.route(r["query"], history=r.get("history"), with_args=False, rerank=rerank)
        gold = (r["server"], r["tool"])
        got = [(c.server, c.tool) for c in res.candidates]
        top1 += got[0] == gold
        top3 += gold in got[:3]
        top10 += gold in got[:10]
        ok = gold_keys(r)  # gold or a listed acceptable alternative, as `nexus bench routing` scores
        top1_ok += f"{got[0][0]}/{got[0][1]}" in ok
        top3_ok += any(f"{s}/{t}" in ok for s, t in got[:3])
        same = with_interchangeable({f"{r['server']}/{r['tool']}"}, router.index)  # gold or the same tool elsewhere
        top1_same += f"{got[0][0]}/{got[0][1]}" in same
        top3_same += any(f"{s}/{t}" in same for s, t in got[:3])
        lat_route.append(res.timings_ms["embed"] + res.timings_ms["scan"])
        if res.gate["escalated"]:
            esc += 1
        if res.reranker:
            lat_rerank.append(res.timings_ms["total"])
    router.config.top_k = cfg_k
    n = len(rows)
    return {
        "n": n, "top1": top1 / n, "top3": top3 / n, "top10": top10 / n, "escalated": esc / n,
        "top1_acceptable": top1_ok / n, "top3_acceptable": top3_ok / n,
        "top1_interchangeable": top1_same / n, "top3_interchangeable": top3_same / n,
        "median_embed_scan_ms": statistics.median(lat_route),
        "median_total_when_reranked_ms": statistics.median(lat_rerank) if lat_rerank else None,
        "n_reranked": len(lat_rerank),
        "unknown_gold": sum(1 for r in rows if (r["server"], r["tool"]) not in set(keys)),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", nargs="+", default=["core", "all"])
    ap.add_argument("--variants", nargs="+", default=["doc", "multi", "multi+lex"])
    ap.add_argument("--work", default="/tmp/nexus-ablation")
    ap.add_argument("--lex-weights", nargs="+", type=float, default=[0.1])
    ap.add_argument("--out", default=None)
    ap.add_argument("--finetune-budget", type=float, default=300.0)
    ap.add_argument("--modes", nargs="+", choices=["gated", "always"], default=None,
                    help="rerank modes to run (default: gated, and always when the variant has a reranker)")
    ap.add_argument("--rerank-k", type=int, default=None, help="candidates the reranker sees (default: its own)")
    ap.add_argument("--embedder", default="minilm",
                    help="embedder name or sentence-transformers folder (its query/document prompts are used)")
    ap.add_argument("--examples", default=None,
                    help="example requests JSONL given to every index (nexus index --examples)")
    ap.add_argument("--rerank-unmasked", action="store_true",
                    help="the likelihood reranker scores the request as written, not value-masked")
    args = ap.parse_args()
    from nexus_cli.adapters.embedder import Embedder

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    # the vector cache and the indexes are per embedder (the default keeps the plain names)
    emb_tag = "" if args.embedder == "minilm" else "-" + Path(args.embedder).name
    emb = CachedEmbedder(Embedder(args.embedder), work / f"embcache{emb_tag}.npz")
    from nexus_cli.registry import load_example_requests

    examples = load_example_requests([args.examples]) if args.examples else None
    ex_tag = "-ex" if examples else ""
    results = []
    for set_name in args.sets:
        tools = load_registries(registry_paths(set_name))
        rows = queries_for(set_name)
        for variant in args.variants:
            recipe = "doc" if variant.startswith("doc") else "multi"
            ft = "ft" in variant.split("+")
            idx_dir = work / f"{set_name}-{recipe}{'-ft' if ft else ''}{emb_tag}{ex_tag}"
            time.perf_counter()
            if not (idx_dir / "manifest.json").is_file():
                rep = build_index(tools, idx_dir, embedder=emb, embedder_name=args.embedder, recipe=recipe, lexical=True, finetune=ft,
                                  finetune_options={"time_budget_s": args.finetune_budget}, examples=examples)
                emb.save()
                build_s = rep.seconds
            else:
                build_s = None
            index = load_index(idx_dir)
            lws = args.lex_weights if "lex" in variant else [0.0]
            for lw in lws:
                parts = variant.split("+")
                reranker = "llm" if "llm" in parts else "likelihood" if "ql" in parts else "none"
                router = Router(index, RouterConfig(lex_weight=lw, reranker=reranker, rerank_k=args.rerank_k,
                                                    rerank_masking=not args.rerank_unmasked),
                                embedder=None if ft else emb)
                modes = [("gated", None)] + ([("always", True)] if reranker != "none" else [])
                if args.modes:
                    modes = [m for m in modes if m[0] in args.modes]
                for mode, rr in modes:
                    res = evaluate(router, rows, rr)
                    res.update({"set": set_name, "variant": variant, "lex_weight": lw, "rerank_mode": mode,
                                "rerank_k": router.rerank_k, "rerank_masking": not args.rerank_unmasked,
                                "tau": index.tau, "n_tools": len(index.tools), "build_seconds": build_s,
                                "examples": index.manifest["recipe"].get("examples")})
                    results.append(res)
                    print(json.dumps(res), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
