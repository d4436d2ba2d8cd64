"""Where a routing run's misses are: each top-1 miss of a `nexus bench routing-lso` results file, by kind.

    python benchmarks/routing_errors.py results/routing-lso/FILE.json [--json OUT.json]

Kinds, in this order (a miss takes the first that fits):
  interchangeable  the pick is an interchangeable copy of the gold tool (the same tool on another server)
  same server      another tool of the gold tool's server
  same name        the tool of the gold tool's name on another server
  other server     anything else
Each kind is split by whether the gate escalated the decision and whether the gold tool is among the top 3; the
gold servers with the most misses are listed, and the follow-ups (requests with a history) are counted apart.
Families (as benchmarks/server_splits.json forms them: servers connected by a shared tool name, read from
--registries) that hold more than one server of the run are listed with their requests and misses, and how many of
those misses pick a tool of the same family.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nexus_cli.files import atomic_write_json  # noqa: E402
from nexus_cli.registry import load_registries  # noqa: E402

REGISTRIES = REPO.parent / "shared" / "registries"

KINDS = ("interchangeable", "same server", "same name", "other server")


def kind_of(row: dict) -> str:
    gold_server, gold_tool = row["gold"].split("/", 1)
    server, tool = row["choice"].split("/", 1)
    if row.get("top1_interchangeable"):
        return "interchangeable"
    if server == gold_server:
        return "same server"
    return "same name" if tool == gold_tool else "other server"


def families(tools) -> dict[str, str]:
    """Each server → its family's first server name (servers connected by a shared tool name)."""
    parent: dict[str, str] = {}

    def find(s: str) -> str:
        while parent.setdefault(s, s) != s:
            s = parent[s]
        return s

    first_server: dict[str, str] = {}
    for t in tools:
        find(t.server)
        other = first_server.setdefault(t.name, t.server)
        a, b = find(other), find(t.server)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return {s: find(s) for s in parent}


def _server(key: str) -> str:
    return key.split("/", 1)[0]


def run_families(rows: list[dict], family: dict[str, str]) -> dict[str, set[str]]:
    """Each family of the run's gold servers → those servers."""
    members: dict[str, set[str]] = {}
    for s in {_server(r["gold"]) for r in rows}:
        members.setdefault(family.get(s, s), set()).add(s)
    return members


def family_rows(rows: list[dict], family: dict[str, str]) -> list[dict]:
    """The families with more than one of the run's gold servers: their requests, misses, and misses inside them."""
    out = []
    for fam, servers in sorted(run_families(rows, family).items()):
        if len(servers) < 2:
            continue
        miss = [r for r in rows if _server(r["gold"]) in servers and not r["top1"]]
        out.append({"servers": sorted(servers), "requests": sum(_server(r["gold"]) in servers for r in rows),
                    "misses": len(miss),
                    "misses_picking_the_family": sum(family.get(_server(r["choice"])) == fam for r in miss)})
    return out


def outside(rows: list[dict], family: dict[str, str]) -> dict:
    """Top-1 and top-3 over the requests whose gold server is alone in its family among the run's gold servers."""
    alone = set().union(*(ss for ss in run_families(rows, family).values() if len(ss) == 1))
    sel = [r for r in rows if _server(r["gold"]) in alone]
    return {"requests": len(sel), "top1": sum(bool(r["top1"]) for r in sel), "top3": sum(bool(r["top3"]) for r in sel)}


def breakdown(doc: dict, family: dict[str, str], path: str | None = None, top_servers: int = 8) -> dict:
    rows = doc["samples"]["queries"]
    misses = [r for r in rows if not r["top1"]]
    kinds = {}
    for k in KINDS:
        sel = [r for r in misses if kind_of(r) == k]
        kinds[k] = {"n": len(sel),
                    "escalated": sum(bool(r["escalated"]) for r in sel),
                    "gold_in_top3": sum(bool(r["top3"]) for r in sel),
                    "follow_ups": sum(bool(r["follow_up"]) for r in sel)}
    by_server = collections.Counter(_server(r["gold"]) for r in misses)
    return {"file": path, "params": {k: doc["params"].get(k) for k in ("part", "reranker", "embedder")},
            "n": len(rows), "misses": len(misses),
            "misses_escalated": sum(bool(r["escalated"]) for r in misses),
            "misses_gold_in_top3": sum(bool(r["top3"]) for r in misses),
            "kinds": kinds,
            "gold_servers_most_missed": [{"server": s, "misses": n,
                                          "requests": sum(_server(r["gold"]) == s for r in rows)}
                                         for s, n in by_server.most_common(top_servers)],
            "multi_server_families": family_rows(rows, family),
            "outside_multi_server_families": outside(rows, family)}


def render(b: dict) -> str:
    out = [f"{b['file']}: {b['misses']} misses of {b['n']} ({b['misses_escalated']} escalated, gold in the top 3 "
           f"for {b['misses_gold_in_top3']})"]
    for k, v in b["kinds"].items():
        out.append(f"  {k:16s} {v['n']:3d}  escalated {v['escalated']:3d}  gold in top 3 {v['gold_in_top3']:3d}  "
                   f"follow-ups {v['follow_ups']:3d}")
    out.append("  most missed gold servers: " + ", ".join(f"{s['server']} {s['misses']}/{s['requests']}"
                                                         for s in b["gold_servers_most_missed"]))
    for f in b["multi_server_families"]:
        out.append(f"  family {' + '.join(f['servers'])}: {f['misses']} misses of {f['requests']}, "
                   f"{f['misses_picking_the_family']} of them inside the family")
    o = b["outside_multi_server_families"]
    if o["requests"]:
        out.append(f"  outside those families: top-1 {o['top1']} of {o['requests']} "
                   f"({100 * o['top1'] / o['requests']:.1f} %), top-3 {o['top3']}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--json", type=Path, help="write the breakdown here as JSON")
    ap.add_argument("--registries", type=Path, default=REGISTRIES, help="the registries the run's tools come from")
    a = ap.parse_args()
    try:
        doc = json.loads(a.results.read_text(encoding="utf-8"))
        doc["samples"]["queries"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {a.results}: not a routing-lso results file ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    b = breakdown(doc, families(load_registries([a.registries])), path=str(a.results))
    print(render(b))
    if a.json:
        atomic_write_json(a.json, b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
