"""How well `guessed` (arguments/guessed.py) names the required values a request does not give, scored over the
answers that `benchmarks/args_eval.py` reports hold (no model runs here):

    python benchmarks/guessed_values.py REPORT.json [REPORT.json ...] [--out results]

For each case the answer's required values are sorted by what the case file says of them: *stated* (the gold answer
has the field: the request gives it), *unstated* (the case's `unstated` list: the request leaves it out, as in
`benchmarks/queries/args_unstated.jsonl`), or neither (counted apart). A stated value flagged is a false alarm; an
unstated value flagged is a guess found. Flags are recomputed from each case's request and history with the
product's own function, so a report written before `guessed` existed is scored the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.arguments.guessed import guessed_values  # noqa: E402
from nexus_cli.arguments.prompt import build_messages, source_text  # noqa: E402
from nexus_cli.lab.bench_args import values_equal  # noqa: E402
from nexus_cli.lab.common import registry_dir_default  # noqa: E402
from nexus_cli.lab.results import Run  # noqa: E402
from nexus_cli.lab.stats import wilson  # noqa: E402
from nexus_cli.registry import load_registries  # noqa: E402
from nexus_cli.schema import compile_tool  # noqa: E402


def score(report: dict, tools: dict) -> tuple[dict, list[dict]]:
    cases = {}
    for f in report["cases_file"].split():
        for line in (ROOT / f).read_text().splitlines():
            if line.strip():
                c = json.loads(line)
                cases[c["id"]] = c
    n = dict(cases=0, required=0, stated=0, stated_flagged=0, stated_right_flagged=0, stated_wrong=0,
             stated_wrong_flagged=0, unstated=0, unstated_flagged=0, other=0, other_flagged=0)
    rows = []
    for p in report["per_case"]:
        c = cases[p["id"]]
        spec = compile_tool(tools[p["tool"]])
        _, window = build_messages(spec, c["query"], c.get("history"))
        flagged = guessed_values(p["args"], spec, source_text(c["query"], window))
        top = {path.split(".")[0] for path in flagged}
        required = set(spec.schema.get("required") or [])
        gold, unstated = c.get("arguments") or {}, set(c.get("unstated") or [])
        n["cases"] += 1
        for k in (p["args"] or {}):
            if k not in required:
                continue
            n["required"] += 1
            hit = k in top
            if k in gold:
                right = values_equal(p["args"][k], gold[k])
                n["stated"] += 1
                n["stated_flagged"] += hit
                n["stated_right_flagged"] += hit and right
                n["stated_wrong"] += not right
                n["stated_wrong_flagged"] += hit and not right
            elif k in unstated:
                n["unstated"] += 1
                n["unstated_flagged"] += hit
            else:
                n["other"] += 1
                n["other_flagged"] += hit
        if flagged or unstated:
            rows.append({"id": p["id"], "tool": p["tool"], "args": p["args"], "guessed": flagged,
                         "unstated": sorted(unstated)})
    return n, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--registry", default=registry_dir_default())
    ap.add_argument("--out", default=None, help="write a results file under this folder")
    a = ap.parse_args(argv)
    tools = {t.key: t for t in load_registries([a.registry])}
    run = Run("guessed-values", {"reports": a.reports})
    summary, samples = {}, {}
    for path in a.reports:
        n, rows = score(json.loads(Path(path).read_text()), tools)
        for part in ("stated", "unstated"):
            ci = wilson(n[f"{part}_flagged"], n[part]) if n[part] else None
            n[f"{part}_flagged_share"] = round(n[f"{part}_flagged"] / n[part], 4) if n[part] else None
            n[f"{part}_flagged_ci95"] = [round(ci.lo, 4), round(ci.hi, 4)] if ci else None
        summary[path], samples[path] = n, rows
        print(f"{path}: {n['cases']} cases, {n['required']} required values in the answers")
        print(f"  stated   {n['stated_flagged']:3d} of {n['stated']:3d} flagged (false alarms; {n['stated_right_flagged']} "
              f"right values, {n['stated_wrong_flagged']} of the {n['stated_wrong']} wrong ones)")
        if n["unstated"]:
            print(f"  unstated {n['unstated_flagged']:3d} of {n['unstated']:3d} flagged (guesses found)")
        if n["other"]:
            print(f"  neither  {n['other_flagged']:3d} of {n['other']:3d} flagged")
    if a.out:
        print(run.write(summary, samples, out_dir=a.out)["files"]["json"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
