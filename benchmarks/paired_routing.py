"""Two `nexus bench routing-lso` results over the same requests, paired: top-1 and top-3 of each, the requests one
fixes and the other breaks (with a two-sided sign test), over all requests and over those written in CJK script.

    python benchmarks/paired_routing.py BASELINE.json CANDIDATE.json [--queries FILE.jsonl ...]

The requests' texts come from the query files, matched by id (default: the files the baseline's run names in its
params, or the shipped example requests, which the dev part routes by default, named server/tool#i).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nexus_cli.lab.stats import sign_test, wilson  # noqa: E402
from nexus_cli.registry import load_example_requests  # noqa: E402

CJK = re.compile(r"[\u1100-\u11FF\u3040-\u30FF\u3130-\u318F\u3400-\u4DBF\u4E00-\u9FFF\uAC00-\uD7AF\uF900-\uFAFF]")


def texts(files: list[str]) -> dict[str, str]:
    """id -> text, from query files with ids and example files without (`server/tool#i`, as the dev part names them)."""
    out: dict[str, str] = {}
    for f in files:
        lines = [json.loads(x) for x in open(f, encoding="utf-8") if x.strip()]
        if lines and "id" not in lines[0]:
            for key, reqs in load_example_requests([f]).items():
                for i, q in enumerate(reqs):
                    out.setdefault(f"{key}#{i}", q)
            continue
        for q in lines:
            out.setdefault(q["id"], q["query"])
    return out


def row(label: str, a: list[dict], b: list[dict]) -> str:
    n = len(a)
    if n == 0:
        return f"{label}: no requests"
    out = [f"{label} (n = {n})"]
    for key in ("top1", "top3"):
        sa, sb = sum(x[key] for x in a), sum(y[key] for y in b)
        ia, ib = wilson(sa, n), wilson(sb, n)
        fixed = sum(1 for x, y in zip(a, b) if y[key] and not x[key])
        broken = sum(1 for x, y in zip(a, b) if x[key] and not y[key])
        out.append(f"  {key}: {100 * sa / n:.1f} % [{100 * ia.lo:.1f}, {100 * ia.hi:.1f}] -> {100 * sb / n:.1f} % "
                   f"[{100 * ib.lo:.1f}, {100 * ib.hi:.1f}]; fixed {fixed}, broken {broken}, "
                   f"sign test p = {sign_test(fixed, broken):.3g}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("baseline")
    ap.add_argument("candidate")
    ap.add_argument("--queries", nargs="*", default=None)
    a = ap.parse_args(argv)
    docs = [json.loads(Path(p).read_text("utf-8")) for p in (a.baseline, a.candidate)]
    qa, qb = (d["samples"]["queries"] for d in docs)
    if [x["id"] for x in qa] != [y["id"] for y in qb]:
        print("the two files do not hold the same requests in the same order", file=sys.stderr)
        return 2
    files = a.queries or [str(REPO / f) for f in docs[0]["params"].get("queries") or []] or \
        [str(REPO / "tool_registries/examples/shared_registries.jsonl")]
    text = texts(files)
    missing = [x["id"] for x in qa if x["id"] not in text]
    if missing:
        print(f"{len(missing)} request ids not in the query files (first: {missing[0]})", file=sys.stderr)
        return 2
    cjk = [i for i, x in enumerate(qa) if CJK.search(text[x["id"]])]
    rest = [i for i in range(len(qa)) if i not in set(cjk)]
    print(row("all", qa, qb))
    print(row("CJK script", [qa[i] for i in cjk], [qb[i] for i in cjk]))
    print(row("the rest", [qa[i] for i in rest], [qb[i] for i in rest]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
