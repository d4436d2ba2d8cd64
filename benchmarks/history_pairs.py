"""Requests that are not follow-ups, each given the history of another conversation: what routing does with a
conversation's earlier turns when the new request does not depend on them.

    python benchmarks/history_pairs.py IN.jsonl [IN.jsonl ...] --out OUT.jsonl [--seed 0]

In a session every request after the first has a history, but the query sets give one only to follow-ups, so a
benchmark over them cannot see what the history costs a request that changes the subject. For each request of the
inputs without a history, this writes two copies with the history of one of the inputs' follow-ups (the follow-up's
own request is not included):
- `+switch`: a follow-up whose server is none of the request's gold servers (a change of subject);
- `+same`: a follow-up on one of the request's gold servers (the same service, another task), where one exists.
Ids and sets get the suffix, `history_from` names the follow-up. Seeded: the same inputs give the same file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def load(paths: list[str]) -> list[dict]:
    out = []
    for p in paths:
        out += [json.loads(line) for line in Path(p).read_text(encoding="utf-8").splitlines() if line.strip()]
    return out


def gold_servers(q: dict) -> set[str]:
    return {q["server"]} | {a["server"] for a in q.get("acceptable") or []}


def pairs(requests: list[dict], seed: int = 0) -> list[dict]:
    follow_ups = sorted((q for q in requests if q.get("history")), key=lambda q: q["id"])
    if not follow_ups:
        raise SystemExit("history_pairs: the inputs hold no follow-up (a request with a history) to take one from")
    rng = random.Random(seed)
    out = []
    for q in requests:
        if q.get("history"):
            continue
        servers = gold_servers(q)
        for kind, pool in (("switch", [f for f in follow_ups if f["server"] not in servers]),
                           ("same", [f for f in follow_ups if f["server"] in servers])):
            if not pool:
                continue
            src = rng.choice(pool)
            out.append({**q, "id": f"{q['id']}+{kind}", "set": f"{q.get('set', '')}+{kind}",
                        "history": src["history"], "history_from": src["id"]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = pairs(load(args.inputs), args.seed)
    out = Path(args.out)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(out)
    kinds = {k: sum(r["id"].endswith("+" + k) for r in rows) for k in ("switch", "same")}
    print(f"{out}: {len(rows)} requests ({kinds['switch']} after another service's conversation, "
          f"{kinds['same']} after the same service's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
