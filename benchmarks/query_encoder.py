"""Request embedding in NumPy (adapters.embedder.NumpyBertEncoder) against sentence-transformers, side by side.

    .venv/bin/python benchmarks/query_encoder.py --index .nexus/demo/index --out R.json
    .venv/bin/python benchmarks/query_encoder.py --index IDX --queries tool_registries/examples/shared_registries.jsonl \
        --limit 300 --oneshot-limit 8 --out R.json

Two measurements, each alternating the two encoders:
1. One-shot: every one of the first `--oneshot-limit` requests runs as its own `nexus route --json --no-args`
   process, with NEXUS_QUERY_ENCODER=numpy and =torch (the baseline: sentence-transformers, which a process must
   import). Reported: the wall time of each process (median, 95 % interval), the per-request speed-up, and whether
   both made the same decision.
2. Steady state: one worker process per encoder routes every request after five warm-up requests (retriever only),
   four workers in the order numpy, torch, torch, numpy (separate processes: NumPy's BLAS threads and torch's
   OpenMP threads in one process slow each other). Reported: embed + scan (ms, the Router's own timings) both ways,
   the per-request ratio, the decisions that differ and the largest difference of a candidate's score.
The requests are only routed, never scored against a gold tool.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.lab.stats import median_ci  # noqa: E402

NEXUS = str(Path(sys.executable).with_name("nexus"))
ENCODERS = ("numpy", "torch")


def oneshot(query: str, index: str, encoder: str) -> tuple[float, dict]:
    env = {**os.environ, "NEXUS_QUERY_ENCODER": encoder}
    t0 = time.perf_counter()
    out = subprocess.run([NEXUS, "route", query, "--index", index, "--json", "--no-args"], env=env,
                         capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"nexus route failed ({encoder}): {out.stderr.strip()}")
    return wall * 1e3, json.loads(out.stdout)


def worker_run(index: str, queries: str, limit: int, encoder: str) -> list[dict]:
    """Route the requests in a fresh process with one encoder: per request its embed + scan ms, tool and scores."""
    env = {**os.environ, "NEXUS_QUERY_ENCODER": encoder}
    out = subprocess.run([sys.executable, __file__, "--worker", "--index", index, "--queries", queries,
                          "--limit", str(limit), "--out", "-"], env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"worker ({encoder}) failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def worker(index: str, queries: list[str]) -> None:
    from nexus_cli.routing.router import Router, RouterConfig

    router = Router(index, RouterConfig(reranker="none"))
    for q in queries[:5]:
        router.route(q, with_args=False)
    rows = []
    for q in queries:
        res = router.route(q, with_args=False)
        rows.append({"ms": res.timings_ms["embed"] + res.timings_ms["scan"], "tool": f"{res.server}/{res.tool}",
                     "scores": {f"{c.server}/{c.tool}": c.score for c in res.candidates},
                     "precision": getattr(router.embedder, "query_precision", "float32 (numpy)")})
    print(json.dumps(rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", default=str(ROOT / "tool_registries" / "demo_queries.jsonl"),
                    help="JSONL with a 'query' field per line")
    ap.add_argument("--limit", type=int, default=200, help="requests routed in process")
    ap.add_argument("--oneshot-limit", type=int, default=8, help="requests run as one-shot processes")
    ap.add_argument("--out", required=True)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    queries = [json.loads(x)["query"] for x in Path(a.queries).read_text("utf-8").splitlines() if x.strip()]
    if a.worker:
        worker(a.index, queries[: a.limit])
        return 0
    shots = []
    for i, q in enumerate(queries[: a.oneshot_limit]):
        order = ENCODERS if i % 2 == 0 else ENCODERS[::-1]
        got = {enc: oneshot(q, a.index, enc) for enc in order}
        shots.append({"query": q, **{enc: round(got[enc][0], 1) for enc in ENCODERS},
                      "same": all((got[e][1]["server"], got[e][1]["tool"]) == (got["torch"][1]["server"],
                                                                              got["torch"][1]["tool"])
                                  for e in ENCODERS)})
        print(json.dumps(shots[-1]), flush=True)
    runs = {enc: [] for enc in ENCODERS}
    for enc in ("numpy", "torch", "torch", "numpy"):
        runs[enc].append(worker_run(a.index, a.queries, a.limit, enc))
    rows = []
    for i in range(len(runs["numpy"][0])):
        got = {enc: [run[i] for run in runs[enc]] for enc in ENCODERS}
        ms = {enc: statistics.median(x["ms"] for x in got[enc]) for enc in ENCODERS}
        first = {enc: got[enc][0] for enc in ENCODERS}
        common = set(first["numpy"]["scores"]) & set(first["torch"]["scores"])
        rows.append({**ms, "same": first["numpy"]["tool"] == first["torch"]["tool"],
                     "max_score_diff": max((abs(first["numpy"]["scores"][k] - first["torch"]["scores"][k])
                                            for k in common), default=None)})
    summary = {
        "what": "request embedding: NumPy (NumpyBertEncoder, float32) against sentence-transformers (the baseline: "
                "torch, bfloat16 where the CPU runs it natively, as the Embedder's 'auto' precision picks)",
        "index": a.index, "queries": a.queries,
        "oneshot": {
            "what": "wall time of one `nexus route --json --no-args` process per request, alternating",
            "n": len(shots), "same_decision": sum(s["same"] for s in shots),
            **{f"{enc}_wall_ms": median_ci([s[enc] for s in shots]).__dict__ for enc in ENCODERS},
            "speedup_per_request": median_ci([s["torch"] / s["numpy"] for s in shots]).__dict__,
        } if shots else None,
        "steady_state": {
            "what": "embed + scan per request (ms, Router timings; each request's median over the two workers of "
                    "its encoder), workers in the order numpy, torch, torch, numpy",
            "n": len(rows), "same_decision": sum(r["same"] for r in rows),
            "max_score_diff": max((r["max_score_diff"] for r in rows if r["max_score_diff"] is not None), default=None),
            **{f"{enc}_embed_scan_ms": median_ci([r[enc] for r in rows]).__dict__ for enc in ENCODERS},
            "numpy_over_torch_per_request": median_ci([r["numpy"] / r["torch"] for r in rows]).__dict__,
        },
        "query_precision_torch": runs["torch"][0][0]["precision"],
        "load_average": os.getloadavg(),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({**summary, "oneshot_rows": shots}, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
