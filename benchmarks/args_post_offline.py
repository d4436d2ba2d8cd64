"""Post-processing compared offline: the raw answers of an `args_eval.py --no-post --no-close` report, repaired by the
current code with and without one repair, scored as args_eval.py scores them, paired per value.

    .venv/bin/python benchmarks/args_eval.py --model qwen2.5-1.5b --cases FILES --no-post --no-close --out RAW.json
    .venv/bin/python benchmarks/args_post_offline.py RAW.json --cases FILES --off normalized_backed [--json OUT]

What it cannot see: the second passes (they ask the model again for what post-processing finds missing) and the
early close of optional strings, which both act during decoding; a repair that passes here is then measured through
the whole pipeline (`args_eval.py` without flags).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from args_eval import loose_equal  # noqa: E402
from nexus_cli.arguments import repairs  # noqa: E402
from nexus_cli.arguments.prompt import build_messages  # noqa: E402
from nexus_cli.lab.bench_args import values_equal  # noqa: E402
from nexus_cli.lab.stats import sign_test  # noqa: E402
from nexus_cli.registry import load_registries  # noqa: E402
from nexus_cli.schema import compile_tool, validate_arguments  # noqa: E402

# repairs that can be turned off, and what stands in for them
OFF = {"normalized_backed": lambda *a, **k: False}


def repaired(cases: dict, report: dict, by_key: dict) -> dict:
    """id -> {gold key: right} and the count of invented keys and invalid objects, post-processed by the code as
    it stands (repairs patched by the caller)."""
    out, invented, invalid = {}, 0, 0
    for rec in report["per_case"]:
        c = cases[rec["id"]]
        tool = by_key[rec["tool"]]
        spec = compile_tool(tool)
        try:
            args = json.loads(rec["raw"])
        except (TypeError, ValueError):
            args = None
        if isinstance(args, dict):
            _, window = build_messages(spec, c["query"], c.get("history"))
            args, _ = repairs.post_process_arguments(args, spec, c["query"], window)
            invalid += bool(validate_arguments(tool.input_schema, args))
        else:
            args, invalid = {}, invalid + 1
        gold, free = c.get("arguments") or {}, set(c.get("free_text_args") or [])
        out[rec["id"]] = {k: (k in args and (loose_equal if k in free else values_equal)(args[k], v))
                          for k, v in gold.items()}
        invented += sum(k not in gold for k in args)
    return {"right": out, "invented": invented, "invalid": invalid}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", help="an args_eval.py report run with --no-post --no-close")
    ap.add_argument("--cases", nargs="+", required=True, help="the case files the report ran")
    ap.add_argument("--registry", default=os.environ.get("NEXUS_REGISTRIES", str(ROOT.parent / "shared" / "registries")))
    ap.add_argument("--off", required=True, choices=sorted(OFF), help="the repair the baseline runs without")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    report = json.loads(Path(a.report).read_text())
    cases = {c["id"]: c for f in a.cases for c in map(json.loads, Path(f).read_text().splitlines()) if c}
    by_key = {t.key: t for t in load_registries([a.registry])}
    with_it = repaired(cases, report, by_key)
    kept = getattr(repairs, a.off)
    setattr(repairs, a.off, OFF[a.off])
    try:
        without = repaired(cases, report, by_key)
    finally:
        setattr(repairs, a.off, kept)
    pairs = [(without["right"][i][k], with_it["right"][i][k]) for i in with_it["right"] for k in with_it["right"][i]]
    fixed = sum(w and not b for b, w in pairs)
    broken = sum(b and not w for b, w in pairs)
    changed = [f"{i}.{k}: {'fixed' if with_it['right'][i][k] else 'broken'}" for i in with_it["right"]
               for k in with_it["right"][i] if with_it["right"][i][k] != without["right"][i][k]]
    summary = {"report": a.report, "cases": a.cases, "repair": a.off, "values": len(pairs),
               "right_without": sum(b for b, _ in pairs), "right_with": sum(w for _, w in pairs),
               "fixed": fixed, "broken": broken, "sign_test_p": sign_test(fixed, broken),
               "invented_without": without["invented"], "invented_with": with_it["invented"],
               "invalid_without": without["invalid"], "invalid_with": with_it["invalid"], "changed": changed}
    print(f"{a.report}: {len(pairs)} values; without {a.off} {summary['right_without']}, with it "
          f"{summary['right_with']} ({fixed} fixed / {broken} broken, p = {summary['sign_test_p']:.3f}); invented keys "
          f"{without['invented']} -> {with_it['invented']}; invalid objects {without['invalid']} -> {with_it['invalid']}")
    for line in changed:
        print("  " + line)
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
