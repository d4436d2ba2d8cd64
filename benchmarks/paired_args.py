"""Two `benchmarks/args_eval.py` reports over the same cases, paired: the specified values one gets right and the
other wrong (pooled, and per case file), JSON and schema validity of each, and the argument call's median time.

    python benchmarks/paired_args.py BASELINE.json CANDIDATE.json

Cases are matched by id; a value counts as fixed when the baseline has it wrong and the candidate right, broken the
other way round. Exit status 0; the verdict is left to the reader (or to the RULE.txt the runs were made under).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("baseline")
    ap.add_argument("candidate")
    a = ap.parse_args(argv)
    base, cand = (json.loads(Path(p).read_text()) for p in (a.baseline, a.candidate))
    by_id = {c["id"]: c for c in cand["per_case"]}
    missing = [c["id"] for c in base["per_case"] if c["id"] not in by_id]
    if missing:
        print(f"error: {len(missing)} baseline cases are not in the candidate (e.g. {missing[0]})", file=sys.stderr)
        return 2
    fixed, broken, per_file = [], [], Counter()
    same_args = 0
    for b in base["per_case"]:
        c = by_id[b["id"]]
        same_args += b["args"] == c["args"]
        for k, ok in b["right"].items():
            now = c["right"].get(k, False)
            if now and not ok:
                fixed.append(f"{b['id']}.{k}")
                per_file[(b["id"].rstrip("0123456789"), "fixed")] += 1
            elif ok and not now:
                broken.append(f"{b['id']}.{k}")
                per_file[(b["id"].rstrip("0123456789"), "broken")] += 1

    def ms(doc):
        return statistics.median(p["ms"]["total"] for p in doc["per_case"])

    report = {
        "cases": len(base["per_case"]),
        "specified_right": {"baseline": base["specified_right"], "candidate": cand["specified_right"],
                            "of": base["specified_args"]},
        "fixed": len(fixed), "broken": len(broken), "net": len(fixed) - len(broken),
        "fixed_values": fixed, "broken_values": broken,
        "by_case_prefix": {f"{p} {kind}": n for (p, kind), n in sorted(per_file.items())},
        "identical_arguments": same_args,
        "json_validity": {"baseline": base["json_validity"], "candidate": cand["json_validity"]},
        "schema_validity": {"baseline": base["schema_validity"], "candidate": cand["schema_validity"]},
        "median_call_ms": {"baseline": round(ms(base), 1), "candidate": round(ms(cand), 1)},
        "git": {"baseline": base.get("git_sha"), "candidate": cand.get("git_sha")},
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
