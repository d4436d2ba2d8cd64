"""Score `nexus route --batch --json` outputs against the request file they routed: top-1 and top-3 with Wilson
intervals, follow-ups (requests with a history) apart, escalated decisions, and each later output paired against the
first (requests fixed / broken at top-1, two-sided sign test).

    nexus route --batch QUERIES.jsonl --no-args --json --reranker none > none.jsonl
    nexus route --batch QUERIES.jsonl --no-args --json --reranker cascade > cascade.jsonl
    python benchmarks/score_routes.py QUERIES.jsonl none.jsonl cascade.jsonl [--json OUT.json]

A hit is the gold (server, tool) or one of the request's `acceptable` alternatives (bench_routing.gold_keys, as
`nexus bench routing` scores).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nexus_cli.lab.bench_routing import gold_keys  # noqa: E402
from nexus_cli.lab.stats import sign_test, wilson  # noqa: E402


def score(queries: dict[str, dict], path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    missing = [r.get("id") for r in rows if r.get("id") not in queries]
    if missing:
        raise SystemExit(f"error: {path}: {len(missing)} outputs name no request of the query file (e.g. {missing[0]})")
    hits: dict[str, dict[str, bool]] = {}
    escalated = 0
    for r in rows:
        q = queries[r["id"]]
        cands = [f"{c['server']}/{c['tool']}" for c in r.get("candidates") or []]
        gold = gold_keys(q)
        hits[r["id"]] = {"top1": bool(cands[:1]) and cands[0] in gold, "top3": any(c in gold for c in cands[:3]),
                         "follow_up": bool(q.get("history"))}
        escalated += bool((r.get("gate") or {}).get("escalated"))
    n = len(rows)
    fu = [h for h in hits.values() if h["follow_up"]]

    def rate(k: int, m: int) -> dict:
        return {"k": k, "n": m, **wilson(k, m).as_dict()}

    return {"file": str(path), "n": n, "escalated": escalated,
            "top1": rate(sum(h["top1"] for h in hits.values()), n),
            "top3": rate(sum(h["top3"] for h in hits.values()), n),
            "follow_up_top1": rate(sum(h["top1"] for h in fu), len(fu)) if fu else None,
            "hits": hits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("queries")
    ap.add_argument("outputs", nargs="+")
    ap.add_argument("--json", default=None, help="also write the figures (without per-request hits) here")
    a = ap.parse_args()
    queries = {}
    for line in Path(a.queries).read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)
            queries[q["id"]] = q
    results = [score(queries, Path(p)) for p in a.outputs]
    base = results[0]

    def pct(w) -> str:
        return f"{w['value'] * 100:.1f} % [{w['lo'] * 100:.1f}, {w['hi'] * 100:.1f}] ({w['k']}/{w['n']})"

    for res in results:
        line = f"{res['file']}: top-1 {pct(res['top1'])}, top-3 {pct(res['top3'])}"
        if res["follow_up_top1"]:
            line += f", follow-ups {res['follow_up_top1']['k']}/{res['follow_up_top1']['n']}"
        line += f", escalated {res['escalated']}"
        if res is not base:
            common = base["hits"].keys() & res["hits"].keys()
            fixed = sum(res["hits"][i]["top1"] and not base["hits"][i]["top1"] for i in common)
            broken = sum(base["hits"][i]["top1"] and not res["hits"][i]["top1"] for i in common)
            res["paired"] = {"fixed": fixed, "broken": broken, "sign_test_p": sign_test(fixed, broken)}
            line += f"; against the first: {fixed} fixed / {broken} broken (p = {sign_test(fixed, broken):.3f})"
        print(line)
    if a.json:
        out = [{k: v for k, v in r.items() if k != "hits"} for r in results]
        Path(a.json).write_text(json.dumps({"queries": a.queries, "results": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
