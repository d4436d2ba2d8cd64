"""Optional fields cut while written (arguments/unbacked.py) against every field written out, side by side.

For each case (default: the blind argument sets, BLIND_CASES of bench_args), the gold tool's arguments are generated
twice by `arguments.generate_arguments` as a one-shot `nexus route` does (an empty context, the default time limit,
drafting on): with the cut (the product default) and without it (every optional field written to the end and then
dropped by the repairs). The arms alternate in order from case to case (bench_drafts.side_by_side).

Reported: the share of cases whose final arguments are identical (a cut changes what the model reads before the
fields after the cut one), specified argument values right and validity in each arm, the whole argument call's time
in each arm (median with its bootstrap interval), the paired speedup (median over cases of the time written out /
cut), and how many cases had a field cut.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..adapters.llama import LlamaContext, load_model
from ..config import ARGUMENTS_LLM, REPO_ROOT
from .bench_args import load_cases
from .bench_drafts import compare_arms, side_by_side
from .bench_routing import pool_tools
from .common import NULL_PROGRESS, Progress, registry_dir_default
from .results import Run, model_identity, model_variant

SUITE = "cut"
DEFAULTS = dict(model=ARGUMENTS_LLM, max_cases=None)
QUICK = dict(max_cases=4)


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
    paths, cs = load_cases(cases, max_cases)
    by_key = {t.key: t for t in pool_tools(reg_dir)}
    params = dict(cases=[os.path.relpath(p, REPO_ROOT) for p in paths], n_cases=len(cs),
                  registry_dir=os.path.relpath(reg_dir, REPO_ROOT), model=model, n_boot=n_boot, quick=quick,
                  timing="the whole generate_arguments call from an empty context (prompt prefill, every "
                         "generation, repairs), as a one-shot nexus route makes it")
    run_ = Run(SUITE, params, seed=seed, models={"llm": model_identity(model)}, variant=model_variant(model))
    ctx = LlamaContext(load_model(model), n_ctx=4096, n_batch=512, n_seq_max=1)
    progress.set_total(len(cs))
    try:
        per_case = side_by_side(cs, by_key, ctx, {"written_out": {"cut_unbacked": False},
                                                  "cut": {"cut_unbacked": True}}, progress)
    finally:
        ctx.close()
    with_cut = [p for p in per_case if p["cut"]["cut"]]
    summary = {
        **compare_arms(per_case, "written_out", "cut", n_boot, seed),
        "cases_with_a_cut": len(with_cut),
        "fields_cut": sum(len(p["cut"]["cut"]) for p in per_case),
        "identical_where_cut": sum(1 for p in with_cut if p["identical"]),
    }
    samples = {"cases": per_case}
    if not write:
        return run_.document(summary, samples)
    return run_.write(summary, samples, out_dir=out_dir, figure=None)
