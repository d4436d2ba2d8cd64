"""One-shot `nexus route` with and without the prefix store (prefix_store.PrefixStore), side by side.

    .venv/bin/python benchmarks/oneshot_route.py --index .nexus/demo/index --rounds 6 --out R.json
    .venv/bin/python benchmarks/oneshot_route.py --index .nexus/demo/index --with-args --out R.json

Each round runs every request of `--queries` (default: the forge demo's own requests) as its own `nexus route
--json --no-args` process twice, in alternating order: once with the store off (NEXUS_PREFIX_CACHE=off: every
candidate prefix decoded in that process, as before the store) and once with a store primed by one run of each
request beforehand (the prefixes read from disk). Reported for the escalated requests: median rerank and route
total (ms, from the command's own timings) with 95 % intervals, the per-request speed-up of the rerank step, and
whether both ways made the same decision every time. With `--with-args` the commands also generate the arguments
(the store then holds each tool's argument prompt prefix too): reported over every run, the argument step's median
(ms) both ways, its per-request speed-up, and whether the arguments were the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.lab.stats import median_ci  # noqa: E402

NEXUS = str(Path(sys.executable).with_name("nexus"))


def route(query: str, index: str, store: str, with_args: bool = False) -> dict:
    env = {**os.environ, "NEXUS_PREFIX_CACHE": store}
    out = subprocess.run([NEXUS, "route", query, "--index", index, "--json"] + ([] if with_args else ["--no-args"]),
                         env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"nexus route failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", default=str(ROOT / "tool_registries" / "demo_queries.jsonl"))
    ap.add_argument("--limit", type=int, default=8, help="requests taken from --queries")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--with-args", action="store_true", help="generate the arguments too (no --no-args)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    queries = [json.loads(x)["query"] for x in Path(a.queries).read_text().splitlines() if x.strip()][: a.limit]
    with tempfile.TemporaryDirectory(prefix="nexus-prefix-bench-") as store:
        for q in queries:  # prime the store
            route(q, a.index, store, a.with_args)
        rows = []
        for r in range(a.rounds):
            for i, q in enumerate(queries):
                order = ("off", store) if (r + i) % 2 == 0 else (store, "off")
                got = {("off" if s == "off" else "store"): route(q, a.index, s, a.with_args) for s in order}
                rows.append({"query": q, "escalated": got["off"]["gate"]["escalated"],
                             "same": (got["off"]["server"], got["off"]["tool"]) == (got["store"]["server"],
                                                                                   got["store"]["tool"]),
                             **({"same_args": got["off"].get("arguments") == got["store"].get("arguments")}
                                if a.with_args else {}),
                             **{k: {"rerank": v["timings_ms"]["rerank"], "total": v["timings_ms"]["total"],
                                    **({"args": v["timings_ms"]["args"]} if a.with_args else {})}
                                for k, v in got.items()}})
                print(json.dumps(rows[-1]), flush=True)
    esc = [x for x in rows if x["escalated"]]
    summary = {
        "what": f"one-shot nexus route --json{'' if a.with_args else ' --no-args'} per request, prefix store off "
                "against a primed store, alternating order; timings are the command's own (rerank, args, total)",
        "index": a.index, "requests": len(queries), "rounds": a.rounds, "runs": len(rows), "escalated_runs": len(esc),
        "same_decision": sum(x["same"] for x in rows),
        "load_average": os.getloadavg(),
    }
    if esc:
        for way in ("off", "store"):
            summary[f"{way}_rerank_ms"] = median_ci([x[way]["rerank"] for x in esc]).__dict__
            summary[f"{way}_total_ms"] = median_ci([x[way]["total"] for x in esc]).__dict__
        summary["rerank_speedup_per_request"] = median_ci(
            [x["off"]["rerank"] / max(x["store"]["rerank"], 1e-3) for x in esc]).__dict__
    summary["baseline"] = "store off (every prefix decoded in the process)"
    if a.with_args:
        for way in ("off", "store"):
            summary[f"{way}_args_ms"] = median_ci([x[way]["args"] for x in rows]).__dict__
            summary[f"{way}_total_all_ms"] = median_ci([x[way]["total"] for x in rows]).__dict__
        summary["args_speedup_per_request"] = median_ci(
            [x["off"]["args"] / max(x["store"]["args"], 1e-3) for x in rows]).__dict__
        summary["same_arguments"] = sum(x["same_args"] for x in rows)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({**summary, "rows": rows}, indent=1) + "\n")
    print(json.dumps(summary))
    return 0 if summary["same_decision"] == len(rows) else 1  # a decision that moved is worth a look (exit 1)


if __name__ == "__main__":
    sys.exit(main())
