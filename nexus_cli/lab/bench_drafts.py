"""Drafted decoding of arguments against one token at a time, side by side on the same cases.

For each case of argument sets g, h and i (EARLIER_BLIND_CASES of bench_args, the cases of the published runs; the
suite times decoding, so whether a set is still blind does not matter to it), the gold tool's arguments are generated twice
by `arguments.generate_arguments` as a one-shot `nexus route` does (an empty context, the default time limit): with
drafting (the product default: the ArgumentDrafter's tokens verified in batches, arguments/drafts.py) and without
(one decode per token). The two runs of a case alternate in order (even cases without drafting first) so that a
warm-up or a slow spell falls on both arms.

Reported: the share of cases whose final arguments are identical (a batch of several tokens runs other matrix
kernels than one token, so a near tie can fall the other way), specified argument values right in each arm (as
bench_args scores them, for the gold tool), validity in each arm, the time of the whole argument call in each arm
(median with its bootstrap interval), the paired speedup (median over cases of the time without drafting / with,
bootstrap interval), and how many drafted tokens were kept.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..adapters.llama import LlamaContext, load_model
from ..arguments.pipeline import generate_arguments
from ..config import ARGUMENTS_LLM, REPO_ROOT
from ..schema import compile_tool
from . import stats
from .bench_args import EARLIER_BLIND_CASES, gold_in_tool_names, load_cases, values_equal
from .bench_routing import pool_tools
from .common import NULL_PROGRESS, Progress, registry_dir_default
from .results import Run, model_identity, model_variant

SUITE = "drafts"
DEFAULTS = dict(model=ARGUMENTS_LLM, max_cases=None)
QUICK = dict(max_cases=4)


def _paired_speedup(base: Sequence[float], cand: Sequence[float], n_boot: int, seed: int) -> stats.Interval:
    """Median over cases of base/cand with its percentile-bootstrap interval (cases resampled)."""
    ratios = np.asarray(base, dtype=np.float64) / np.asarray(cand, dtype=np.float64)
    return stats.bootstrap_ci(ratios, np.median, n_boot=n_boot, seed=seed, name="median-of-paired-ratios")


def run(
    cases: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    registry_dir: str | None = None,
    model: str = ARGUMENTS_LLM,
    max_cases: int | None = None,
    seed: int = 0,
    n_boot: int = 2000,
    out_dir: str = "results",
    quick: bool = False,
    progress: Progress = NULL_PROGRESS,
    write: bool = True,
) -> dict:
    reg_dir = Path(registry_dir) if registry_dir else registry_dir_default()
    paths, cs = load_cases(cases, max_cases, default=EARLIER_BLIND_CASES)
    by_key = {t.key: t for t in pool_tools(reg_dir)}
    params = dict(cases=[os.path.relpath(p, REPO_ROOT) for p in paths], n_cases=len(cs),
                  registry_dir=os.path.relpath(reg_dir, REPO_ROOT), model=model, n_boot=n_boot, quick=quick,
                  timing="the whole generate_arguments call from an empty context (prompt prefill, every "
                         "generation, repairs), as a one-shot nexus route makes it")
    run_ = Run(SUITE, params, seed=seed, models={"llm": model_identity(model)}, variant=model_variant(model))
    llm = load_model(model)
    ctx = LlamaContext(llm, n_ctx=4096, n_batch=512, n_seq_max=1)
    progress.set_total(len(cs))
    per_case = []
    try:
        for i, c in enumerate(cs):
            key = f"{c['server']}/{c['tool']}"
            spec = compile_tool(by_key[key])
            rec = {"id": c.get("id"), "file": c["_file"], "tool": key}
            for drafting in ((False, True) if i % 2 == 0 else (True, False)):
                ctx.clear()
                res = generate_arguments(ctx, spec, c["query"], c.get("history"), drafting=drafting)
                args = res.arguments if res.valid else None
                gold, _ = gold_in_tool_names(c.get("arguments") or {}, spec.schema)
                arm = "drafted" if drafting else "plain"
                rec[arm] = {"arguments": args, "valid": res.valid, "ms": res.timings_ms["total"],
                            "first_token_ms": res.timings_ms["first_token"], "drafted": res.drafted,
                            "accepted": res.accepted, "retries": res.retries,
                            "correct": {k: (args is not None and k in args and values_equal(args[k], v))
                                        for k, v in gold.items()}}
            rec["identical"] = rec["plain"]["arguments"] == rec["drafted"]["arguments"]
            per_case.append(rec)
            progress.advance(c.get("id", ""))
    finally:
        ctx.close()

    n = len(per_case)

    def arm_summary(arm: str, k: int) -> dict:
        ms = [p[arm]["ms"] for p in per_case]
        return {"specified_args": stats.wilson(sum(sum(p[arm]["correct"].values()) for p in per_case),
                                               sum(len(p[arm]["correct"]) for p in per_case)),
                "valid": stats.wilson(sum(1 for p in per_case if p[arm]["valid"]), n),
                "ms": stats.median_ci(ms, n_boot, seed + k)}

    drafted = sum(p["drafted"]["drafted"] for p in per_case)
    accepted = sum(p["drafted"]["accepted"] for p in per_case)
    summary = {
        "n_cases": n,
        "identical_arguments": stats.wilson(sum(1 for p in per_case if p["identical"]), n),
        "plain": arm_summary("plain", 1),
        "drafted": arm_summary("drafted", 2),
        "speedup_paired": _paired_speedup([p["plain"]["ms"] for p in per_case],
                                          [p["drafted"]["ms"] for p in per_case], n_boot, seed + 3),
        "draft_tokens": drafted,
        "draft_tokens_kept": accepted,
        "draft_kept_share": accepted / drafted if drafted else None,
    }
    samples = {"cases": per_case}
    if not write:
        return run_.document(summary, samples)
    return run_.write(summary, samples, out_dir=out_dir, figure=None)
