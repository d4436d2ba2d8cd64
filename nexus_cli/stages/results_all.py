"""`make results` / `make results-quick`: every measurement suite in sequence, one results tree.

    python -m nexus_cli.stages.results_all [--quick] [--out DIR] [--only deep-splice,dkl,...] [--skip ...]

Full: the main model (qwen2.5-0.5b) with the paper's parameters, into results/. Quick: the CI smoke variant of each
suite (SmolLM2 where a model is needed, one depth, 1-3 trials, a few queries), into .nexus/results-quick/ so the
committed results are never overwritten by a smoke run. A suite that fails is reported and the others still run; the
exit status is 1 if any failed. Progress goes to stderr, the per-suite and total wall times to stdout (and to
<out>/results_all.json).

Suites owned by other parts of the project (`bench slb`, `bench l0`) are called through their stage's
`run(out_dir=..., quick=...)` when it exists, else through their CLI command in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

from ..config import REPO_ROOT
from . import _bench_common  # noqa: F401 - sets OMP_WAIT_POLICY before any OpenMP library loads

ORDER = ["slb", "l0", "deep-splice", "dkl", "gate", "routing", "args"]


def _progress(label: str):
    from ..output import progress as make_progress
    from ._bench_common import Progress

    bar = make_progress(transient=True)
    task = bar.add_task(label, total=None)

    def on_total(n):
        bar.update(task, total=n)

    def on_adv(desc):
        bar.update(task, advance=1, description=f"{label} {desc}")

    return bar, Progress(on_advance=on_adv, on_total=on_total)


def _external(suite: str, out: Path, quick: bool) -> dict:
    """bench slb / bench l0: the stage's run() if it has one, else the CLI in a subprocess."""
    import importlib

    mod_name = {"slb": "bench_slb", "l0": "bench_l0"}[suite]
    try:
        mod = importlib.import_module(f"nexus_cli.stages.{mod_name}")
    except ImportError:
        mod = None
    fn = getattr(mod, "run", None) if mod is not None else None
    if callable(fn):
        import inspect

        accepted = inspect.signature(fn).parameters
        kw = {"out_dir": str(out)}
        if "quick" in accepted:
            kw["quick"] = quick
        elif quick and "reps" in accepted:
            kw["reps"] = 200  # the smoke variant of a timing loop: fewer repetitions
        return {"ok": True, "doc": fn(**kw)}
    cmd = [sys.executable, "-m", "nexus_cli.cli", "bench", suite, "--out", str(out)] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr or proc.stdout).strip().splitlines()[-1] if (proc.stderr or proc.stdout) else
                           f"exit {proc.returncode}")
    return {"ok": True, "stdout": proc.stdout}


def run_suite(suite: str, out: Path, quick: bool) -> dict:
    if suite in ("slb", "l0"):
        return _external(suite, out, quick)
    from . import bench_args, bench_deep_splice, bench_routing, sweep_dkl, sweep_gate

    bar, prog = _progress(suite)
    with bar:
        if suite == "deep-splice":
            kw = dict(bench_deep_splice.QUICK) if quick else {}
            doc = bench_deep_splice.run(out_dir=str(out), quick=quick, progress=prog, **kw)
        elif suite == "dkl":
            kw = dict(sweep_dkl.QUICK) if quick else {}
            doc = sweep_dkl.run(out_dir=str(out), quick=quick, progress=prog, **kw)
        elif suite == "gate":
            kw = dict(sweep_gate.QUICK) if quick else {}
            doc = sweep_gate.run(out_dir=str(out), quick=quick, progress=prog, **kw)
        elif suite == "routing":
            kw = dict(bench_routing.QUICK) if quick else {}
            if quick:
                kw["sizes"] = ",".join(kw["sizes"])
                kw["model"] = "smollm2-135m"
            doc = bench_routing.run(out_dir=str(out), quick=quick, progress=prog, **kw)
        elif suite == "args":
            kw = dict(bench_args.QUICK) if quick else {}
            if quick:
                kw["model"] = "smollm2-135m"
            doc = bench_args.run(out_dir=str(out), quick=quick, progress=prog, **kw)
        else:
            raise ValueError(f"unknown suite {suite}")
    return {"ok": True, "doc": doc}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nexus_cli.stages.results_all", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the CI smoke variant of every suite")
    ap.add_argument("--out", default=None, help="results folder (default results/, or .nexus/results-quick/ with --quick)")
    ap.add_argument("--only", default="", help="comma-separated suites to run (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated suites to skip")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else (REPO_ROOT / (".nexus/results-quick" if args.quick else "results"))
    only = [s for s in args.only.split(",") if s]
    skip = {s for s in args.skip.split(",") if s}
    suites = [s for s in ORDER if (not only or s in only) and s not in skip]
    unknown = [s for s in only + list(skip) if s not in ORDER]
    if unknown:
        print(f"error: unknown suite(s) {', '.join(unknown)} (known: {', '.join(ORDER)})", file=sys.stderr)
        return 2
    t_all = time.perf_counter()
    report = {"quick": args.quick, "out": str(out), "suites": {}}
    failed = 0
    for suite in suites:
        t0 = time.perf_counter()
        print(f"[results] {suite} ...", file=sys.stderr, flush=True)
        try:
            res = run_suite(suite, out, args.quick)
            status = "ok"
            err = None
        except Exception as e:  # noqa: BLE001 - one failing suite must not stop the others
            status, err = "failed", f"{type(e).__name__}: {e}"
            failed += 1
            traceback.print_exc(file=sys.stderr)
        dt = time.perf_counter() - t0
        report["suites"][suite] = {"status": status, "seconds": round(dt, 1), "error": err}
        print(f"{suite:12s} {status:7s} {dt:8.1f} s" + (f"  {err}" if err else ""), flush=True)
    total = time.perf_counter() - t_all
    report["total_seconds"] = round(total, 1)
    print(f"{'total':12s} {'':7s} {total:8.1f} s ({total / 60:.1f} min)", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    from ..results import atomic_write_json, environment

    report["environment"] = environment()
    name = "results_all-quick.json" if args.quick else "results_all.json"
    atomic_write_json(out / name, report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
