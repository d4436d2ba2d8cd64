"""Did a change keep every decision? Compare two `nexus bench routing` or two `nexus bench args` results documents.

    python benchmarks/same_decisions.py routing BEFORE.json AFTER.json
    python benchmarks/same_decisions.py args BEFORE.json AFTER.json

routing: the chosen tool and the gate's escalation of every query at every registry size; args: the routed tool and
the generated arguments of every case. Prints the count of identical ones and each difference; exits 1 on any.
"""

from __future__ import annotations

import json
import sys


def routing(a: dict, b: dict) -> list[str]:
    diffs = []
    for size in a["samples"]:
        qa = {q["id"]: q for q in a["samples"][size]["queries"]}
        qb = {q["id"]: q for q in b["samples"].get(size, {}).get("queries", [])}
        for i, x in qa.items():
            y = qb.get(i)
            if y is None or (x["choice"], x["escalated"]) != (y["choice"], y["escalated"]):
                diffs.append(f"N={size} {i}: {x['choice']} -> {y and y['choice']}")
    return diffs


def args(a: dict, b: dict) -> list[str]:
    ca, cb = a["samples"]["cases"], b["samples"]["cases"]
    return [f"{x.get('id')}: {x.get('choice')} {x.get('args')} -> {y.get('choice')} {y.get('args')}"
            for x, y in zip(ca, cb) if (x.get("choice"), x.get("args")) != (y.get("choice"), y.get("args"))] + \
        ([f"{len(ca)} cases -> {len(cb)}"] if len(ca) != len(cb) else [])


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("routing", "args"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    a, b = (json.loads(open(p, encoding="utf-8").read()) for p in argv[1:])
    diffs = (routing if argv[0] == "routing" else args)(a, b)
    n = sum(len(s["queries"]) for s in a["samples"].values()) if argv[0] == "routing" else len(a["samples"]["cases"])
    print(f"{argv[0]}: {n - len(diffs)}/{n} identical")
    for d in diffs:
        print("  " + d)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
