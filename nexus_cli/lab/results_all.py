"""`make results` / `make results-quick`: every measurement suite in sequence, one results tree.

    nexus results all [--quick] [--out DIR] [--only deep-splice,dkl,...] [--skip ...]

Full: the main model (qwen2.5-0.5b) with the paper's parameters, into results/, then the fidelity suites again on a
second model family with the other RoPE type (SmolLM2-135M, NORM; `deep-splice:smollm2-135m`, ..., written as that
suite's variant: results/<suite>/latest-smollm2-135m.json), and the gate and dkl sweeps and deep splice on the
arguments model, Qwen2.5-Coder-1.5B (`gate:qwen2.5-1.5b`, `dkl:qwen2.5-1.5b`, `deep-splice:qwen2.5-1.5b`,
`card-splice:qwen2.5-1.5b`; `args` and `drafts` run on it by default). Quick: the CI smoke variant of each
suite (SmolLM2 where a model is needed, one depth, 1-3 trials, a few queries), into .nexus/results-quick/ so the
committed results are never overwritten by a smoke run. A suite that fails is reported and the others still run; the
exit status is 1 if any failed. Progress goes to stderr, the per-suite and total wall times to stdout (and to
<out>/results_all.json).

Resume: the full run takes hours on two cores, so after each suite the suites done so far are kept in
`<out>/.partial-results_all[-quick].json` (written atomically; git-ignored). Started again on the same commit of a
clean tree, `results all` skips the suites that finished (their results are on disk already) and runs the rest; a
failed suite runs again. The report lists every segment (start, wall time, load, the suites it ran) and its total is
their sum. Another commit or a dirty tree starts over and a dirty tree keeps nothing; `fresh=True` (`--fresh`) starts
over too. The file is removed once every suite has finished.

Idle: a full run starts each suite once the 1-minute load average has fallen below half the cores (at most a 3-minute
wait), so that the load each suite records at its start says whether the machine was idle.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from ..config import REPO_ROOT, TEST_LLM
from ..errors import UsageError
from ..output import progress as make_progress
from . import (
    bench_args,
    bench_cards,
    bench_deep_splice,
    bench_drafts,
    bench_l0,
    bench_latency,
    bench_lso,
    bench_poisoning,
    bench_routing,
    bench_serve,
    bench_slb,
    common,  # noqa: F401 - sets OMP_WAIT_POLICY before any OpenMP library loads
    sweep_dkl,
    sweep_gate,
)
from .common import Progress
from .results import environment, git_info, loadavg_1m, write_json_doc

SLB_QUICK_REPS = 200  # the smoke variant of the scan's timing loop
SECOND_FAMILY = "smollm2-135m"  # the fidelity suites on a second model family (NORM RoPE; Qwen2.5 is NEOX)
SECOND_FAMILY_SUITES = [f"{s}:{SECOND_FAMILY}" for s in ("deep-splice", "dkl", "gate")]
LARGER_MODEL = "qwen2.5-1.5b"  # the arguments model: the fidelity suites that have been measured on it
LARGER_MODEL_SUITES = [f"{s}:{LARGER_MODEL}" for s in ("gate", "dkl", "deep-splice", "card-splice")]
# the suites a "suite:model" entry runs, with their settings on another model: card-splice as docs/arguments.md
# publishes it on the 1.5B, one test conversation per file and depth (its default would double the suite's time),
# the shipped repair left as it is
MODEL_SUITES = {"deep-splice": (bench_deep_splice, {}), "dkl": (sweep_dkl, {}), "gate": (sweep_gate, {}),
                "card-splice": (bench_cards, {"test_cases": 1})}
ORDER = ["slb", "latency", "l0", "deep-splice", "dkl", "gate", "routing", "routing-lso", "args", "drafts", "card-splice",
         "serve", "poisoning", *SECOND_FAMILY_SUITES,
         *LARGER_MODEL_SUITES]
SERVE_QUICK = {"registry": str(REPO_ROOT / "tool_registries" / "github_like.json"), "clients": 8, "requests": 25,
               "embedder": "minilm"}
POISONING_QUICK = {"attacks": ("instructions", "shadow-exact"), "reranker": "none", "max_queries": 20}


def _progress(label: str):
    bar = make_progress(transient=True)
    task = bar.add_task(label, total=None)

    def on_total(n):
        bar.update(task, total=n)

    def on_adv(desc):
        bar.update(task, advance=1, description=f"{label} {desc}")

    return bar, Progress(on_advance=on_adv, on_total=on_total)


def run_suite(suite: str, out: Path, quick: bool) -> dict:
    bar, prog = _progress(suite)
    suite, _, model = suite.partition(":")  # "deep-splice:smollm2-135m": the suite on that model
    with bar:
        if model:
            module, settings = MODEL_SUITES[suite]
            doc = module.run(out_dir=str(out), quick=quick, progress=prog, model=model, **settings)
        elif suite == "slb":
            doc = bench_slb.run(out_dir=str(out), reps=SLB_QUICK_REPS if quick else bench_slb.DEFAULT_REPS)
        elif suite == "latency":
            kw = dict(bench_latency.QUICK if quick else bench_latency.DEFAULTS)
            doc = bench_latency.run(out_dir=str(out), quick=quick, progress=prog, **kw)
        elif suite == "l0":
            doc = bench_l0.run(out_dir=str(out), quick=quick, progress=prog)
        elif suite == "deep-splice":
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
                kw["model"] = TEST_LLM
            doc = bench_routing.run(out_dir=str(out), quick=quick, progress=prog, **kw)
        elif suite == "args":
            kw = dict(bench_args.QUICK) if quick else {}
            if quick:
                kw["model"] = TEST_LLM
            doc = bench_args.run(out_dir=str(out), quick=quick, progress=prog, **kw)
        elif suite == "routing-lso":  # the blind test part, as published
            kw = dict(bench_lso.QUICK, model=TEST_LLM) if quick else {}
            doc = bench_lso.run(part="test", out_dir=str(out), quick=quick, progress=prog, **kw)
        elif suite == "card-splice":  # measured with the shipped repair, which only --write-repair changes
            kw = dict(bench_cards.QUICK) if quick else {}
            doc = bench_cards.run(out_dir=str(out), quick=quick, progress=prog, **kw)
        elif suite == "drafts":
            kw = dict(bench_drafts.QUICK, model=TEST_LLM) if quick else {}
            doc = bench_drafts.run(out_dir=str(out), quick=quick, progress=prog, **kw)
        elif suite == "serve":
            doc = bench_serve.run(out_dir=str(out), progress=prog, **(SERVE_QUICK if quick else {}))
        elif suite == "poisoning":
            doc = bench_poisoning.run(out_dir=str(out), progress=prog, **(POISONING_QUICK if quick else {}))
        else:
            raise ValueError(f"unknown suite {suite}")
    return {"ok": True, "doc": doc}


class _Resume:
    """The suites a run on this commit has finished, kept on disk (module doc, "Resume")."""

    def __init__(self, out: Path, quick: bool, fresh: bool):
        self.path = out / (".partial-results_all-quick.json" if quick else ".partial-results_all.json")
        git = git_info()
        self.key = {"git": git.get("sha"), "clean": git.get("dirty") is False, "quick": quick}
        self.done: dict[str, dict] = {}
        self.segments: list[dict] = []
        if fresh or not self.key["clean"] or not self.path.is_file():
            return
        try:
            kept = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if kept.get("key") == self.key:
            self.done = {k: v for k, v in (kept.get("suites") or {}).items() if v.get("status") == "ok"}
            self.segments = list(kept.get("segments") or [])

    def keep(self, suites: dict, segment: dict) -> None:
        if not self.key["clean"]:
            return  # a dirty tree's run cannot be told from another edit's: never resumed
        out = {**self.done, **suites}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_doc(self.path, {"key": self.key, "suites": out, "segments": self.segments + [segment]})

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


def _load() -> float | None:
    load = loadavg_1m()
    return None if load is None else round(load, 2)


SETTLE_SHARE = 0.5  # a suite starts once the 1-minute load average is under this share of the cores ...
SETTLE_MAX_S = 180.0  # ... or after this long, with a warning
SETTLE_POLL_S = 5.0


def _settle(label: str) -> float | None:
    """Wait until the 1-minute load average is below SETTLE_SHARE of the cores (at most SETTLE_MAX_S), so that each
    suite's recorded load at its start says whether the machine was idle: the average lags what ran before (`make
    setup`'s build, the previous suite) by about a minute after it ended. Returns the load the suite starts at."""
    limit = SETTLE_SHARE * (os.cpu_count() or 1)
    load = _load()
    waited = 0.0
    while load is not None and load >= limit and waited < SETTLE_MAX_S:
        if waited == 0.0:
            print(f"[results] waiting for the load average ({load:.2f}) to fall below {limit:.1f} before {label}",
                  file=sys.stderr, flush=True)
        time.sleep(SETTLE_POLL_S)
        waited += SETTLE_POLL_S
        load = _load()
    if load is not None and load >= limit:
        print(f"[results] warning: the load average is still {load:.2f}; {label} starts anyway", file=sys.stderr,
              flush=True)
    return load


def _mode_suites(quick: bool) -> list[str]:
    """Every suite a full or a quick run runs: quick runs are on SmolLM2 already, and the other models' suites would
    repeat them."""
    return [s for s in ORDER if not (quick and s in SECOND_FAMILY_SUITES + LARGER_MODEL_SUITES)]


def run_all(quick: bool = False, out: str | Path | None = None, only: list[str] | None = None,
            skip: list[str] | None = None, fresh: bool = False) -> dict:
    """Every suite in ORDER (less `skip`, or `only` those), one after another; a failing suite is reported and the
    others still run; the suites an earlier, stopped run on this commit finished are not run again (module doc,
    "Resume"). Returns the report (also written to <out>/results_all.json); report["failed"] counts."""
    out = Path(out) if out else (REPO_ROOT / (".nexus/results-quick" if quick else "results"))
    only, skip = list(only or []), set(skip or [])
    unknown = [s for s in only + sorted(skip) if s not in ORDER]
    if unknown:
        raise UsageError(f"unknown suite(s) {', '.join(unknown)} (known: {', '.join(ORDER)})")
    suites = [s for s in _mode_suites(quick) if (not only or s in only) and s not in skip]
    resume = _Resume(out, quick, fresh)
    t_all = time.perf_counter()
    segment = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wall_s": 0.0,
               "loadavg_1m_start": _load(), "loadavg_1m_end": None, "suites": []}
    report = {"quick": quick, "out": str(out), "suites": {}}
    failed = 0
    for suite in suites:
        if suite in resume.done:
            report["suites"][suite] = {**resume.done[suite], "earlier_segment": True}
            print(f"{suite:12s} {'ok':7s} {resume.done[suite]['seconds']:8.1f} s  (an earlier segment)",
                  file=sys.stderr, flush=True)
            continue
        load_start = None if quick else _settle(suite)  # a smoke run's timings are not figures: no wait
        t0 = time.perf_counter()
        print(f"[results] {suite} ...", file=sys.stderr, flush=True)
        try:
            run_suite(suite, out, quick)
            status = "ok"
            err = None
        except Exception as e:  # noqa: BLE001 - one failing suite must not stop the others
            status, err = "failed", f"{type(e).__name__}: {e}"
            failed += 1
            traceback.print_exc(file=sys.stderr)
        dt = time.perf_counter() - t0
        report["suites"][suite] = {"status": status, "seconds": round(dt, 1), "error": err,
                                   "loadavg_1m_start": load_start}
        segment["suites"].append(suite)
        segment["wall_s"] = round(time.perf_counter() - t_all, 1)
        resume.keep({k: v for k, v in report["suites"].items() if not v.get("earlier_segment")}, segment)
        print(f"{suite:12s} {status:7s} {dt:8.1f} s" + (f"  {err}" if err else ""), file=sys.stderr, flush=True)
    segment["wall_s"] = round(time.perf_counter() - t_all, 1)
    segment["loadavg_1m_end"] = _load()
    report["segments"] = resume.segments + [segment]
    report["total_seconds"] = round(sum(seg["wall_s"] for seg in report["segments"]), 1)
    report["failed"] = failed
    finished = set(resume.done) | {k for k, v in report["suites"].items() if v["status"] == "ok"}
    if finished >= set(_mode_suites(quick)):  # a run of some suites (--only) keeps the others' record
        resume.remove()
    out.mkdir(parents=True, exist_ok=True)
    report["environment"] = environment()
    name = "results_all-quick.json" if quick else "results_all.json"
    write_json_doc(out / name, report)
    return report
