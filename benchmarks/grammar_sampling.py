"""Lazy grammar sampling against the grammar in the sampler chain, side by side, through the arguments stage.

    .venv/bin/python benchmarks/grammar_sampling.py --sets args_cases --out results/args/grammar-sampling/R.json

Each case's arguments are generated twice in one process by `generate_arguments` (post-processing and its second
passes on, as `nexus route` runs them), once per configuration, in alternating order, each configuration over its
own LlamaContext of one shared model (so each keeps its own warm prefix, as a `--batch` run does):
- baseline, "chain": the grammar inside llama.cpp's sampler chain, every candidate masked at every step (the
  adapter's behaviour before lazy grammar sampling; `LlamaContext.generate(lazy_grammar=False)`);
- candidate, "lazy": the default, the unconstrained greedy choice tested against the grammar and the whole
  vocabulary masked only when it is rejected.
The outputs must be identical (raw text and arguments); a difference is counted and listed. Reported: the median
call time of each with its 95 % interval and the speed-up (bootstrap ratio of medians), the median per-token decode
time (time after the first token over the generated tokens), the median of the per-case ratios (chain / lazy, the
same case), and the share of steps the grammar rejected.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.arguments.pipeline import generate_arguments  # noqa: E402
from nexus_cli.lab.stats import median_ci, speedup_ci  # noqa: E402
from nexus_cli.registry import load_registries  # noqa: E402
from nexus_cli.schema import compile_tool  # noqa: E402


class _Recording:
    """A LlamaContext whose generate() records each result (tokens, grammar rejections); lazy=False keeps the
    grammar in the sampler chain (the baseline)."""

    def __init__(self, ctx, lazy: bool):
        self._ctx, self._lazy = ctx, lazy
        self.calls: list = []

    def generate(self, *args, **kw):
        res = self._ctx.generate(*args, lazy_grammar=self._lazy, **kw)
        self.calls.append(res)
        return res

    def __getattr__(self, name):
        return getattr(self._ctx, name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="args_cases", help="comma-separated names under benchmarks/queries/")
    ap.add_argument("--registry", default=str(ROOT.parent / "shared" / "registries"))
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the adapter's)")
    ap.add_argument("--limit", type=int, default=0, help="stop after this many cases (0: all)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from nexus_cli.adapters.llama import LlamaContext, load_model

    tools = {t.key: t for t in load_registries([a.registry])}
    model = load_model(a.model)
    kw = {} if a.threads is None else {"n_threads": a.threads}
    chain = _Recording(LlamaContext(model, n_ctx=4096, n_seq_max=1, flash_attn=True, **kw), lazy=False)
    lazy = _Recording(LlamaContext(model, n_ctx=4096, n_seq_max=1, flash_attn=True, **kw), lazy=True)
    recs = []
    cases = []
    for name in a.sets.split(","):
        for line in (ROOT / "benchmarks" / "queries" / f"{name}.jsonl").read_text().splitlines():
            if line.strip():
                cases.append((name, json.loads(line)))
    if a.limit:
        cases = cases[: a.limit]
    for i, (name, c) in enumerate(cases):
        spec = compile_tool(tools[f"{c['server']}/{c['tool']}"])
        out = {}
        order = (("chain", chain), ("lazy", lazy)) if i % 2 == 0 else (("lazy", lazy), ("chain", chain))
        for label, ctx in order:
            n0 = len(ctx.calls)
            t0 = time.perf_counter()
            res = generate_arguments(ctx, spec, c["query"], c.get("history"))
            s = time.perf_counter() - t0
            gens = ctx.calls[n0:]
            n_tok = sum(len(g.tokens) for g in gens)
            decode_ms = sum(g.t_total_ms - g.t_first_token_ms for g in gens)
            out[label] = {"s": s, "raw": res.raw, "args": res.arguments, "passes": len(gens), "tokens": n_tok,
                          "decode_ms_per_token": decode_ms / max(1, n_tok - len(gens)),
                          "rejections": sum(g.grammar_rejections for g in gens)}
        same = out["chain"]["raw"] == out["lazy"]["raw"] and out["chain"]["args"] == out["lazy"]["args"]
        recs.append({"set": name, "id": c["id"], "same": same, **{k: {x: v[x] for x in v if x != "raw"}
                                                                     for k, v in out.items()}})
        print(f"{name} {c['id']}: chain {out['chain']['s']:.2f} s, lazy {out['lazy']['s']:.2f} s, "
              f"{out['lazy']['tokens']} tokens, {out['lazy']['rejections']} rejected, same={same}", flush=True)
    chain_s = [r["chain"]["s"] for r in recs]
    lazy_s = [r["lazy"]["s"] for r in recs]
    sp = speedup_ci(chain_s, lazy_s)
    tokens = sum(r["lazy"]["tokens"] for r in recs)
    summary = {
        "what": "generate_arguments per case, grammar in the sampler chain (baseline) against lazy grammar sampling "
                "(default), one process, alternating order, each over its own context of one shared model",
        "sets": a.sets, "model": a.model, "threads": a.threads, "cases": len(recs),
        "identical_outputs": sum(r["same"] for r in recs),
        "differing": [r["id"] for r in recs if not r["same"]],
        "chain_median_s": median_ci(chain_s).__dict__, "lazy_median_s": median_ci(lazy_s).__dict__,
        "speedup": {"value": sp.value, "lo": sp.lo, "hi": sp.hi, "method": sp.method,
                    "baseline": "grammar in the sampler chain"},
        "paired_ratio_median": median_ci([c / x for c, x in zip(chain_s, lazy_s)]).__dict__,
        "decode_ms_per_token_median": {"chain": statistics.median(r["chain"]["decode_ms_per_token"] for r in recs),
                                       "lazy": statistics.median(r["lazy"]["decode_ms_per_token"] for r in recs)},
        "generated_tokens": tokens,
        "rejected_share": sum(r["lazy"]["rejections"] for r in recs) / max(1, tokens),
        "second_passes": sum(r["lazy"]["passes"] - 1 for r in recs),
        "load_average": os.getloadavg(),
        "per_case": recs,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(summary, indent=1, ensure_ascii=False, default=float) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "per_case"}, default=float))
    return 0 if not summary["differing"] else 1


if __name__ == "__main__":
    sys.exit(main())
