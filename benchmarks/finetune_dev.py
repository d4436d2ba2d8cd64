"""Development protocol for the router embedder's fine-tuning recipe, on the example requests alone.

    python benchmarks/finetune_dev.py --set core --examples tool_registries/examples/shared_registries.jsonl \
        --configs '{}' '{"epochs": 2}' [--work /tmp/nexus-ftdev] [--out dev.json]

Choosing a recipe on benchmarks/queries/ would tune on held-out data, which benchmarks/README.md forbids. So each
tool's example requests are split: one request per tool (drawn with random.Random(--seed)) is held out as a
development query, the others are the index's examples and the fine-tuning data. Every configuration (a JSON object
of `finetune_embedder` keyword arguments; `null` = no fine-tuning) gets its own index built exactly as
`nexus index --examples --finetune` builds one, and is scored on the held-out requests through the product path
(`Router.route`, retriever alone, as `--reranker auto` routes a fine-tuned index). The held-out requests were written
by the same writers as the rest, so absolute figures run higher than on benchmarks/queries/; the comparison between
configurations is what this measures. Paired differences against the first configuration are reported with a
two-sided sign test.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from routing_ablation import CachedEmbedder, registry_paths  # noqa: E402

from nexus_cli.lab.bench_routing import with_interchangeable  # noqa: E402
from nexus_cli.lab.stats import sign_test  # noqa: E402
from nexus_cli.registry import load_example_requests, load_registries  # noqa: E402
from nexus_cli.routing.build import EXAMPLES_PER_TOOL, build_index
from nexus_cli.routing.index import load_index  # noqa: E402
from nexus_cli.routing.router import Router, RouterConfig  # noqa: E402


def split_examples(tools, examples: dict[str, list[str]], seed: int) -> tuple[dict[str, list[str]], list[dict]]:
    """(examples kept for the index, held-out development queries): one request per tool with at least two."""
    rng = random.Random(seed)
    kept, dev = {}, []
    for t in tools:
        own = list(examples.get(t.key, []))[:EXAMPLES_PER_TOOL]
        if len(own) < 2:
            if own:
                kept[t.key] = own
            continue
        j = rng.randrange(len(own))
        dev.append({"query": own[j], "server": t.server, "tool": t.name})
        kept[t.key] = own[:j] + own[j + 1:]
    return kept, dev


def score(router: Router, dev: list[dict]) -> tuple[dict, list[bool]]:
    hits1, hits3, same1 = [], 0, 0
    for r in dev:
        res = router.route(r["query"], with_args=False, rerank=False)
        got = [f"{c.server}/{c.tool}" for c in res.candidates]
        gold = f"{r['server']}/{r['tool']}"
        hits1.append(got[0] == gold)
        hits3 += gold in got[:3]
        same1 += got[0] in with_interchangeable({gold}, router.index)
    n = len(dev)
    return {"n": n, "top1": sum(hits1) / n, "top3": hits3 / n, "top1_interchangeable": same1 / n}, hits1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="core")
    ap.add_argument("--examples", default=str(ROOT / "tool_registries" / "examples" / "shared_registries.jsonl"))
    ap.add_argument("--configs", nargs="+", default=["{}"],
                    help="JSON objects of finetune_embedder options; 'null' builds the index without fine-tuning")
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--work", default="/tmp/nexus-ftdev")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from nexus_cli.adapters.embedder import Embedder

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    emb = CachedEmbedder(Embedder("minilm"), work / "embcache.npz")
    tools = load_registries(registry_paths(args.set))
    kept, dev = split_examples(tools, load_example_requests([args.examples]), args.seed)
    print(json.dumps({"set": args.set, "tools": len(tools), "dev_queries": len(dev),
                      "examples_kept": sum(len(v) for v in kept.values())}), flush=True)
    results, first_hits = [], None
    for raw in args.configs:
        opts = json.loads(raw)
        tag = "noft" if opts is None else "ft-" + ("default" if not opts else
                                                   "-".join(f"{k}{v}" for k, v in sorted(opts.items())))
        idx_dir = work / f"{args.set}-s{args.seed}-{tag}"
        t0 = time.perf_counter()
        if not (idx_dir / "manifest.json").is_file():
            build_index(tools, idx_dir, embedder=emb, finetune=opts is not None, finetune_options=opts or {},
                        examples=kept)
            emb.save()
        build_s = round(time.perf_counter() - t0, 1)
        index = load_index(idx_dir)
        router = Router(index, RouterConfig(reranker="none"), embedder=None if opts is not None else emb)
        res, hits = score(router, dev)
        res.update({"config": opts, "build_seconds": build_s,
                    "finetune": (index.manifest.get("embedder") or {}).get("finetuned")})
        if first_hits is None:
            first_hits = hits
        else:
            fixed = sum(1 for a, b in zip(first_hits, hits) if b and not a)
            broken = sum(1 for a, b in zip(first_hits, hits) if a and not b)
            res["vs_first"] = {"fixed": fixed, "broken": broken, "sign_test_p": round(sign_test(fixed, broken), 4)}
        results.append(res)
        print(json.dumps(res), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
