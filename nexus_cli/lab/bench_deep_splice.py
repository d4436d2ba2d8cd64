"""Table III / Fig. 4: time to the first token with a spliced-and-repaired schema block against text prefill, per
recompute curve K and history depth, with fidelity checked in the same runs.

Workload (the one `nexus splice` uses): the compile prefix (m0 tokens) + filler history, then one tool schema (S
tokens, default github/create_pull_request), then a user turn (Q tokens). `depth` is the cursor n_past (prefix
included), as in the paper's Table III, so eq. (2) gives the same R column: the history is depth - m0 filler tokens.

One trial at one depth measures, in this order (all on one context, n_batch 512):

  cold baseline   empty cache; decode prefix + history + schema + query as text            -> t_cold_prefill
  for each K:
    splice path   empty cache; decode prefix + history (t_hist); splice the block at n_past with
                  R = eq. (2)(n_past; M=256, R_base=5 %, K), repair r = ceil(S R/100) tokens fused with the query
                  -> t_cold_splice = t_hist + splice;   t_warm_splice = splice alone (history already cached)
  warm baseline   history cached (the cells of the run above); decode schema + query as text -> t_warm_prefill
                  (its logits are the fidelity reference)

Every timed span ends when the next-token logits are available (TTFT without sampling). One untimed round warms up
first. Speedups: cold = median(t_cold_prefill) / median(t_cold_splice) (the paper's baseline: both paths start from an
empty cache); warm = median(t_warm_prefill) / median(t_warm_splice) (the agent's steady state). Intervals: see stats.py.

Resume: after each depth its samples, the K-order generator's state and the run's segments so far are kept in
`<out>/deep-splice/.partial[-<variant>].json` (written atomically). A run started again with the same parameters, on
the same commit of a clean tree and the same model file, measures only the depths that file lacks; a file of other
settings is replaced by this run's (`fresh=True` ignores a matching one too). A dirty tree's run keeps nothing. The
results file lists each segment (start, seconds, load average at its start and end), and the checkpoint goes once
the results are written.

Fidelity per cell: KL = D_KL(p_ref || p_splice) of the next-token distribution after the query, p_ref from the warm
baseline; top-1 = argmax agreement; floor = D_KL(p_ref || p_split) where p_split decodes the same text in two calls
(schema, then query): the numerical noise of batching alone. KL is deterministic per cell; each trial's value is
kept in the samples and the maximum is reported.
"""

from __future__ import annotations

import json
import time

import numpy as np

from .. import files
from ..adapters.llama import kl_divergence, load_model
from ..config import DEFAULT_LLM, TEST_LLM
from ..splice.engine import Schedule, SpliceEngine, recompute_tokens
from ..splice.fidelity import filler_tokens, query_tokens
from ..splice.render import prefix_tokens
from . import stats
from .common import DEFAULT_TOOL, NULL_PROGRESS, Progress, compile_block, context, find_tool
from .results import Run, loadavg_1m, model_identity, model_variant, suite_dir, to_jsonable

SUITE = "deep-splice"
DEFAULTS = dict(model=DEFAULT_LLM, ks=[4.0, 16.0], depths=[256, 512, 1024, 2048], trials=15, tool=DEFAULT_TOOL,
                flash_attn=False, seed=0, n_boot=2000)
QUICK = dict(model=TEST_LLM, ks=[4.0, 16.0], depths=[256], trials=3)

# The paper's Table III (Qwen2.5-14B Q4_K_M, M4 Max): (K, depth) -> (R %, prefill ms, splice ms, speedup, lo, hi)
PAPER = {
    (4, 256): (5.0, 3278, 2010, 1.63, 1.62, 1.67), (4, 512): (36.7, 4672, 3761, 1.24, 1.23, 1.25),
    (4, 1024): (100.0, 7302, 7425, 0.98, 0.97, 1.00), (4, 2048): (100.0, 13092, 13142, 1.00, 0.99, 1.00),
    (16, 256): (5.0, 3327, 1924, 1.73, 1.72, 1.75), (16, 512): (11.3, 4747, 3336, 1.42, 1.42, 1.43),
    (16, 1024): (24.0, 7625, 6532, 1.17, 1.14, 1.19), (16, 2048): (49.3, 13468, 12620, 1.07, 1.01, 1.08),
}


def _kkey(k: float) -> str:
    return f"{int(k)}" if float(k).is_integer() else f"{k:g}"


def run(
    model: str = DEFAULTS["model"],
    ks=None,
    depths=None,
    trials: int = DEFAULTS["trials"],
    tool: str = DEFAULTS["tool"],
    registry_dir: str | None = None,
    flash_attn: bool = False,
    seed: int = 0,
    n_boot: int = 2000,
    out_dir: str = "results",
    quick: bool = False,
    progress: Progress = NULL_PROGRESS,
    write: bool = True,
    fresh: bool = False,
) -> dict:
    ks = [float(k) for k in (ks or DEFAULTS["ks"])]
    depths = [int(d) for d in (depths or DEFAULTS["depths"])]
    if trials < 1:
        raise ValueError("trials must be >= 1")
    params = dict(model=model, ks=ks, depths=depths, trials=trials, tool=tool, flash_attn=flash_attn,
                  n_boot=n_boot, quick=quick, schedule={"M": 256, "R_base": 5.0}, n_batch=512, warmup_rounds=1)
    run_ = Run(SUITE, params, seed=seed, models={"llm": model_identity(model)}, variant=model_variant(model))

    llm = load_model(model)
    the_tool = find_tool(tool, registry_dir)
    block = compile_block(model, the_tool, flash_attn)
    schema = [int(t) for t in block.tokens]
    S = len(schema)
    prefix = prefix_tokens(llm)
    m0 = len(prefix)
    q = query_tokens(llm, None)
    rng = np.random.default_rng(seed)

    for depth in depths:
        if depth <= m0:
            raise ValueError(f"depth {depth} must exceed the compile prefix ({m0} tokens)")
    progress.set_total(len(depths) * (trials + 1))
    cells: dict[str, dict] = {}
    samples: dict[str, dict] = {}
    checkpoint = _Checkpoint(out_dir, run_, write and not fresh) if write else None
    done = checkpoint.resume(rng) if checkpoint is not None else {}
    for depth in depths:
        hist = prefix + filler_tokens(llm, depth - m0)
        n_past = len(hist)
        if f"d{depth}" in done:  # measured by an earlier segment of this run
            raw = done[f"d{depth}"]
            samples[f"d{depth}"] = raw
            cells.update(_depth_cells(depth, raw, ks, n_past, S, len(q), n_boot, seed))
            for _ in range(trials + 1):
                progress.advance(f"depth {depth} (kept from an earlier segment)")
            continue
        ctx = context(llm, n_past + S + len(q) + 8, flash_attn)
        try:
            engine = SpliceEngine(ctx)
            engine.check(block)
            pcts = {k: Schedule(k=k).pct(n_past) for k in ks}
            raw = {"cold_prefill_ms": [], "warm_prefill_ms": [], "floor_kl": []}
            for k in ks:
                raw[f"K{_kkey(k)}"] = {"cold_splice_ms": [], "warm_splice_ms": [], "hist_ms": [], "kl": [],
                                       "top1": [], "overhead_ms": [], "recomputed_tokens": None}
            order_log = []
            for trial in range(trials + 1):  # trial 0 is the warm-up round, not recorded
                rec = trial > 0
                # cold baseline: the whole context as text from an empty cache
                ctx.clear()
                t0 = time.perf_counter()
                ctx.decode(hist + schema + q, 0, 0)
                ctx.logits()
                t_cold = (time.perf_counter() - t0) * 1e3
                # splice paths, K in a shuffled order per trial (no K always runs right after the cold baseline)
                k_order = list(rng.permutation(len(ks))) if rec else list(range(len(ks)))
                order_log.append([_kkey(ks[i]) for i in k_order])
                splice_logits = {}
                for ki in k_order:
                    k = ks[ki]
                    ctx.clear()
                    t0 = time.perf_counter()
                    ctx.decode(hist, 0, 0, logits_last=False)
                    t1 = time.perf_counter()
                    res = engine.splice(block, n_past, pcts[k], then_tokens=q)
                    t2 = time.perf_counter()
                    splice_logits[k] = res.logits
                    if rec:
                        r = raw[f"K{_kkey(k)}"]
                        r["cold_splice_ms"].append((t2 - t0) * 1e3)
                        r["warm_splice_ms"].append((t2 - t1) * 1e3)
                        r["hist_ms"].append((t1 - t0) * 1e3)
                        r["overhead_ms"].append(res.overhead_ms)
                        r["recomputed_tokens"] = res.recomputed_tokens
                # warm baseline: history cached (left by the last splice run), schema + query as text
                ctx.seq_rm(0, n_past, -1)
                t0 = time.perf_counter()
                ctx.decode(schema + q, n_past, 0)
                ref = ctx.logits()
                t_warm = (time.perf_counter() - t0) * 1e3
                # numerical floor: the same text in two decode calls
                ctx.seq_rm(0, n_past, -1)
                ctx.decode(schema, n_past, 0, logits_last=False)
                ctx.decode(q, n_past + S, 0)
                split = ctx.logits()
                if rec:
                    raw["cold_prefill_ms"].append(t_cold)
                    raw["warm_prefill_ms"].append(t_warm)
                    raw["floor_kl"].append(kl_divergence(ref, split))
                    for k in ks:
                        r = raw[f"K{_kkey(k)}"]
                        r["kl"].append(kl_divergence(ref, splice_logits[k]))
                        r["top1"].append(bool(int(np.argmax(ref)) == int(np.argmax(splice_logits[k]))))
                progress.advance(f"depth {depth}")
            cells.update(_depth_cells(depth, {**raw, "k_order": order_log}, ks, n_past, S, len(q), n_boot, seed))
            samples[f"d{depth}"] = {**raw, "k_order": order_log}
            if checkpoint is not None:
                checkpoint.keep(samples, rng)
        finally:
            ctx.close()

    summary = {"cells": cells, "targets": _targets(cells), "m0": m0, "S": S, "Q": len(q), "tool": tool}
    if not write:
        return run_.document(summary, samples)
    summary["segments"] = checkpoint.segments()
    doc = run_.write(summary, samples, out_dir=out_dir, figure=lambda plt: figure(plt, cells))
    checkpoint.remove()
    return doc


def _depth_cells(depth: int, raw: dict, ks: list[float], n_past: int, S: int, Q: int, n_boot: int,
                 seed: int) -> dict[str, dict]:
    """The cells of one depth (one per K) from its raw samples."""
    cells = {}
    floor = float(max(raw["floor_kl"]))
    cold_b, warm_b = raw["cold_prefill_ms"], raw["warm_prefill_ms"]
    for k in ks:
        pct = Schedule(k=k).pct(n_past)
        r = raw[f"K{_kkey(k)}"]
        key = f"K{_kkey(k)}/d{depth}"
        top1_ok = sum(r["top1"])
        cell = {
            "K": k, "depth": depth, "n_past": n_past, "S": S, "Q": Q, "R_pct": pct,
            "recomputed_tokens": r["recomputed_tokens"] if r["recomputed_tokens"] is not None
            else recompute_tokens(S, pct),
            "cold": {
                "prefill_ms": stats.median_ci(cold_b, n_boot, seed),
                "splice_ms": stats.median_ci(r["cold_splice_ms"], n_boot, seed + 1),
                "speedup": stats.speedup_ci(cold_b, r["cold_splice_ms"], n_boot, seed + 2),
            },
            "warm": {
                "prefill_ms": stats.median_ci(warm_b, n_boot, seed + 3),
                "splice_ms": stats.median_ci(r["warm_splice_ms"], n_boot, seed + 4),
                "speedup": stats.speedup_ci(warm_b, r["warm_splice_ms"], n_boot, seed + 5),
            },
            "splice_overhead_ms": stats.median_ci(r["overhead_ms"], n_boot, seed + 6),
            "kl_max": float(max(r["kl"])),
            "kl_median": float(np.median(r["kl"])),
            "top1": stats.wilson(top1_ok, len(r["top1"])),
            "top1_all": top1_ok == len(r["top1"]),
            "floor_kl": floor,
            "kl_at_or_below_floor": float(max(r["kl"])) <= floor,
        }
        pk = PAPER.get((int(k), depth)) if float(k).is_integer() else None
        if pk:
            cell["paper"] = dict(zip(("R_pct", "prefill_ms", "splice_ms", "speedup", "lo", "hi"), pk))
        cells[key] = cell
    return cells


class _Checkpoint:
    """The depths a run has measured so far, kept on disk so that a stopped run goes on where it stopped (module
    doc, "Resume"). It matches only the same parameters, seed, models and commit of a clean tree."""

    def __init__(self, out_dir: str, run_: Run, use: bool):
        folder = suite_dir(out_dir, SUITE)
        self.path = folder / (".partial.json" if run_.variant is None else f".partial-{run_.variant}.json")
        self.run = run_
        self.use = use
        git = run_.git_start or {}
        self.key = to_jsonable({"params": run_.params, "seed": run_.seed, "models": run_.models,
                                "git": git.get("sha"), "clean": git.get("dirty") is False})
        self.earlier: list[dict] = []

    def resume(self, rng: np.random.Generator) -> dict:
        """The samples of the depths an earlier segment measured ({} when there is no matching checkpoint); `rng`
        is set to where that segment left it."""
        if not (self.use and self.key["clean"] and self.path.is_file()):
            return {}
        try:
            kept = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if kept.get("key") != self.key:
            return {}
        rng.bit_generator.state = kept["rng_state"]
        self.earlier = list(kept.get("segments") or [])
        self.run.note(f"resumed: {len(kept['samples'])} depth(s) measured by {len(self.earlier)} earlier "
                      "segment(s) of this run (summary.segments)")
        return kept["samples"]

    def _segment(self) -> dict:
        return {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.run.started)),
                "wall_s": round(time.perf_counter() - self.run._t0, 3), "loadavg_1m_start": self.run.load_start,
                "loadavg_1m_end": loadavg_1m()}

    def segments(self) -> list[dict]:
        return self.earlier + [self._segment()]

    def keep(self, samples: dict, rng: np.random.Generator) -> None:
        if not self.key["clean"]:
            return  # a dirty tree's run cannot be told from another edit's: never resumed
        files.atomic_write_json(self.path, to_jsonable({
            "key": self.key, "samples": samples, "rng_state": rng.bit_generator.state,
            "segments": self.segments()}))

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


def _targets(cells: dict) -> dict:
    """The issue's targets: warm speedup at depth 256 >= 3x with top-1 kept; KL <= floor wherever R = 100 %;
    cold speedups at or above the paper's in every cell."""
    warm256 = [c for c in cells.values() if c["depth"] == 256]
    full = [c for c in cells.values() if c["R_pct"] >= 100.0]
    with_paper = [c for c in cells.values() if "paper" in c]
    return {
        "warm_speedup_d256_ge_3x": {
            "met": bool(warm256) and all(c["warm"]["speedup"].value >= 3.0 and c["top1_all"] for c in warm256),
            "values": {f"K{_kkey(c['K'])}": c["warm"]["speedup"].value for c in warm256},
        },
        "kl_le_floor_where_R100": {
            "met": all(c["kl_at_or_below_floor"] for c in full) if full else None,
            "cells": [f"K{_kkey(c['K'])}/d{c['depth']}" for c in full],
        },
        "cold_speedup_ge_paper": {
            "met": all(c["cold"]["speedup"].value >= c["paper"]["speedup"] for c in with_paper) if with_paper else None,
            "shortfall": {f"K{_kkey(c['K'])}/d{c['depth']}": round(c["paper"]["speedup"] - c["cold"]["speedup"].value, 3)
                          for c in with_paper if c["cold"]["speedup"].value < c["paper"]["speedup"]},
        },
        "top1_kept_everywhere": all(c["top1_all"] for c in cells.values()),
    }


def figure(plt, cells: dict):
    """Fig. 4: speedup against depth per K, cold and warm, with 95 % intervals; the paper's cold points dashed."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    ks = sorted({c["K"] for c in cells.values()})
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for ax, mode in zip(axes, ("cold", "warm")):
        for i, k in enumerate(ks):
            cs = sorted((c for c in cells.values() if c["K"] == k), key=lambda c: c["depth"])
            xs = [c["depth"] for c in cs]
            sp = [c[mode]["speedup"] for c in cs]
            ys = [s.value for s in sp]
            err = [[s.value - s.lo for s in sp], [s.hi - s.value for s in sp]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=colors[i % 4], label=f"Nexus K={_kkey(k)}")
            if mode == "cold":
                pp = [(c["depth"], c["paper"]["speedup"]) for c in cs if "paper" in c]
                if pp:
                    ax.plot(*zip(*pp), ls="--", marker="x", color=colors[i % 4], alpha=0.6, label=f"paper K={_kkey(k)}")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("cursor n_past (tokens, compile prefix included)")
        ax.set_title(f"{mode} baseline" + (" (whole context as text)" if mode == "cold" else " (history cached)"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("TTFT speedup (x), 95 % CI")
    fig.suptitle("Deep splice: speedup vs depth (Fig. 4)")
    fig.tight_layout()
    return fig
