"""Copy bias on/off, paired: each case's arguments generated at several `copy_bias` values in one process.

    .venv/bin/python benchmarks/args_copy_bias.py --biases 0,2 --sets args_cases,args_cases_b --out R.json

The same prompt is decoded once and stays warm in the KV cache, so a second bias value costs only its generation.
Scored as benchmarks/args_eval.py scores (gold tool given; post-processing on). Prints per case the right values at
each bias, then the totals and every value one bias fixes or breaks against the first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from args_eval import loose_equal, values_equal  # noqa: E402

from nexus_cli.registry import load_registries  # noqa: E402
from nexus_cli.schema import compile_tool  # noqa: E402
from nexus_cli.stages.arguments import generate_arguments  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--biases", default="0,2", help="comma-separated copy-bias values; the first is the baseline")
    ap.add_argument("--sets", default="args_cases", help="comma-separated names under benchmarks/queries/")
    ap.add_argument("--registry", default=str(ROOT.parent / "shared" / "registries"))
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from nexus_cli.adapters.llama import LlamaContext, load_model

    biases = [float(x) for x in a.biases.split(",")]
    tools = {t.key: t for t in load_registries([a.registry])}
    ctx = LlamaContext(load_model(a.model), n_ctx=4096, n_seq_max=1, n_threads=a.threads, flash_attn=True)
    recs = []
    for name in a.sets.split(","):
        for line in (ROOT / "benchmarks" / "queries" / f"{name}.jsonl").read_text().splitlines():
            if not line.strip():
                continue
            c = json.loads(line)
            spec = compile_tool(tools[f"{c['server']}/{c['tool']}"])
            gold, free = c.get("arguments") or {}, set(c.get("free_text_args") or [])
            rec = {"set": name, "id": c["id"], "runs": {}}
            for b in biases:
                t0 = time.time()
                res = generate_arguments(ctx, spec, c["query"], c.get("history"), bias=b)
                right = {k: k in res.arguments and (loose_equal if k in free else values_equal)(res.arguments[k], v)
                         for k, v in gold.items()}
                rec["runs"][str(b)] = {"right": right, "args": res.arguments, "valid": res.valid,
                                       "extra": [k for k in res.arguments if k not in gold], "s": round(time.time() - t0, 2)}
            recs.append(rec)
            print(name, c["id"], {b: sum(r["right"].values()) for b, r in rec["runs"].items()}, "of", len(gold), flush=True)
            Path(a.out).write_text(json.dumps(recs, ensure_ascii=False))
    base = str(biases[0])
    for b in map(str, biases):
        fixed = sum(1 for r in recs for k, ok in r["runs"][b]["right"].items() if ok and not r["runs"][base]["right"][k])
        broken = sum(1 for r in recs for k, ok in r["runs"][b]["right"].items() if not ok and r["runs"][base]["right"][k])
        print(json.dumps({"bias": float(b), "values": sum(len(r["runs"][b]["right"]) for r in recs),
                          "right": sum(sum(r["runs"][b]["right"].values()) for r in recs), "fixed": fixed, "broken": broken,
                          "invented_keys": sum(len(r["runs"][b]["extra"]) for r in recs),
                          "valid": sum(r["runs"][b]["valid"] for r in recs), "cases": len(recs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
