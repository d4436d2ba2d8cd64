"""Argument extraction with the GOLD tool given: specified-argument accuracy, validity, signature length, latency.

    .venv/bin/python benchmarks/args_eval.py                       # qwen2.5-0.5b on benchmarks/queries/args_cases.jsonl
    .venv/bin/python benchmarks/args_eval.py --cases tool_registries/demo_queries.jsonl --registry tool_registries
    .venv/bin/python benchmarks/args_eval.py --no-post | --no-descriptions | --no-close   # ablations

Isolates the arguments stage (no routing): for each case the gold (server, tool) is compiled with
nexus_cli.schema.compile_tool and nexus_cli.arguments.pipeline.generate_arguments fills it in. A gold argument counts
as right when the generated value equals it (numbers by value, strings exactly after trimming; `free_text_args`
loosely: same words ignoring case and punctuation, or one contains the other). Extra keys the model adds beyond the
gold are counted as invented. Also reports the compressed signature's length in Qwen tokens over all tools of the
registry (median, p99), JSON validity and schema validity, and the per-call latency (median, p90).
Held-out data: this script measures; nothing here feeds back into prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.arguments import generate_arguments  # noqa: E402
from nexus_cli.lab.bench_args import values_equal  # noqa: E402  (the one scoring rule, shared with nexus bench args)
from nexus_cli.registry import load_registries  # noqa: E402
from nexus_cli.schema import compile_tool, validate_arguments  # noqa: E402


def loose_equal(a, b) -> bool:
    if not (isinstance(a, str) and isinstance(b, str)):
        return values_equal(a, b)
    wa = re.findall(r"\w+", a.lower())
    wb = re.findall(r"\w+", b.lower())
    return wa == wb or (bool(wa) and bool(wb) and (" ".join(wa) in " ".join(wb) or " ".join(wb) in " ".join(wa)))


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=[str(ROOT / "benchmarks" / "queries" / "args_cases.jsonl")],
                    help="one or more case files, read in order")
    ap.add_argument("--registry", default=os.environ.get("NEXUS_REGISTRIES", str(ROOT.parent / "shared" / "registries")))
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("NEXUS_THREADS", "0") or 0) or None)
    ap.add_argument("--max-cases", type=int, default=None)
    ap.add_argument("--no-post", action="store_true", help="keep optional fields the context does not support")
    ap.add_argument("--no-descriptions", action="store_true", help="bare one-line signature in the prompt")
    ap.add_argument("--no-close", action="store_true",
                    help="write every optional string to its end (no early close of values the drop would remove)")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)

    from nexus_cli.adapters.llama import LlamaContext, load_model

    tools = load_registries([a.registry])
    by_key = {t.key: t for t in tools}
    cases = [json.loads(line) for f in a.cases for line in Path(f).read_text().splitlines() if line.strip()]
    if a.max_cases:
        cases = cases[: a.max_cases]
    model = load_model(a.model)
    # flash attention, as the Router's context (routing/router.py) runs the arguments stage
    ctx = LlamaContext(model, n_ctx=4096, n_seq_max=1, n_threads=a.threads, flash_attn=True)

    # signature length over the whole registry, in this model's tokens
    specs = [compile_tool(t) for t in tools]
    sig_tok = [len(model.tokenize(s.signature)) for s in specs]
    desc_tok = [len(model.tokenize(s.described_signature)) for s in specs]

    per_case = []
    spec_total = spec_ok = invented = 0
    json_ok = schema_ok = 0
    lat_total, lat_first, ptoks = [], [], []
    t_start = time.time()
    for c in cases:
        key = f"{c['server']}/{c['tool']}"
        tool = by_key.get(key)
        if tool is None:
            print(f"skip {c['id']}: {key} not in the registry", file=sys.stderr)
            continue
        spec = compile_tool(tool)
        res = generate_arguments(ctx, spec, c["query"], c.get("history"), descriptions=not a.no_descriptions,
                                 post_process=not a.no_post, close_unbacked=not a.no_close)
        try:
            json.loads(res.raw)
            json_ok += 1
        except ValueError:
            pass
        schema_ok += int(res.valid and not validate_arguments(tool.input_schema, res.arguments))
        gold = c.get("arguments") or {}
        free = set(c.get("free_text_args") or [])
        got = res.arguments or {}  # None: no arguments came out (res.errors says why)
        right = {k: (k in got and (loose_equal if k in free else values_equal)(got[k], v))
                 for k, v in gold.items()}
        extra = [k for k in got if k not in gold]
        spec_total += len(right)
        spec_ok += sum(right.values())
        invented += len(extra)
        lat_total.append(res.timings_ms["total"])
        lat_first.append(res.timings_ms["first_token"])
        ptoks.append(res.prompt_tokens)
        rec = {"id": c["id"], "tool": key, "right": right, "args": res.arguments, "gold": gold, "extra": extra,
               "dropped": res.dropped, "valid": res.valid, "errors": res.errors, "ms": res.timings_ms,
               "history": bool(c.get("history")), "closed": res.closed, "guessed": res.guessed, "raw": res.raw}
        per_case.append(rec)
        if a.verbose:
            mark = "ok " if all(right.values()) else "BAD"
            print(f"{mark} {c['id']} {key} {json.dumps(res.arguments, ensure_ascii=False)[:160]}"
                  f" | gold {json.dumps(gold, ensure_ascii=False)[:160]} | dropped {res.dropped}", file=sys.stderr)
    n = len(per_case)
    hist = [p for p in per_case if p["history"]]
    report = {
        "suite": "args_eval (gold tool given)",
        "cases_file": " ".join(a.cases), "cases": n, "model": a.model, "threads": ctx.n_threads,
        "config": {"post_process": not a.no_post, "descriptions": not a.no_descriptions,
                   "close_unbacked": not a.no_close},
        "specified_args": spec_total, "specified_right": spec_ok,
        "specified_accuracy": round(spec_ok / spec_total, 4) if spec_total else None,
        "cases_all_right": sum(all(p["right"].values()) for p in per_case),
        "history_cases": len(hist),
        "history_args_right": f"{sum(sum(p['right'].values()) for p in hist)}/{sum(len(p['right']) for p in hist)}",
        "invented_keys": invented,
        "json_validity": round(json_ok / n, 4) if n else None,
        "schema_validity": round(schema_ok / n, 4) if n else None,
        "signature_tokens_all_tools": {"tools": len(specs), "median": statistics.median(sig_tok),
                                       "p99": pct(sig_tok, 0.99), "max": max(sig_tok)},
        "described_signature_tokens_all_tools": {"median": statistics.median(desc_tok), "p99": pct(desc_tok, 0.99)},
        "tools_compiled_ok": sum(s.ok for s in specs),
        "latency_ms": {"total_median": pct(lat_total, 0.5), "total_p90": pct(lat_total, 0.9),
                       "first_token_median": pct(lat_first, 0.5)},
        "prompt_tokens_median": pct(ptoks, 0.5),
        "wall_s": round(time.time() - t_start, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "loadavg": os.getloadavg()},
        "git_sha": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                  cwd=ROOT).stdout.strip(),
        "per_case": per_case,
    }
    summary = {k: v for k, v in report.items() if k != "per_case"}
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
