"""Fig. 1: bare-splice next-token divergence against placement offset, with the numerical floor, and the scattered
partial recompute of EPIC's LegoLink at one offset, measured rather than assumed.

For each offset o (history of o filler tokens after the compile prefix, n_past = m0 + o; o = 0 is the compile anchor)
the history is decoded once, then for each of the `queries` user turns:

  reference  schema + query decoded as text in one call                                  -> p_ref
  floor      the same text in two calls (schema, then query)                             -> KL(p_ref || p_split)
  bare       the compiled block spliced at n_past (re-rotated, R = 0: nothing recomputed), query decoded -> p_bare
  control    the block computed by llama.cpp at its real positions n_past.., seeing only the compile prefix as the
             compiled block did (position_matched_block): no re-rotation, only the missing history -> p_ctl

KL = D_KL(p_ref || p_bare) in nats; top-1 = argmax agreement. KL(p_ref || p_ctl) is the context drift alone (a block
that never attended to the history); |KL_bare - KL_ctl| per query bounds what the re-rotation itself adds. Per offset: mean KL with a percentile-bootstrap 95 %
interval over the queries, median and max, top-1 rate with its Wilson interval, mean and max floor.

LegoLink port (EPIC, ICML 2025: recompute the first k tokens of every precomputed chunk, k <= 32, evaluated 16): after
the bare splice at n_past, the first k tokens of the block are recomputed *in place* with the right causal context:
a scratch sequence is given the history cells (seq_cp of [0, n_past), no copy in a unified cache), the k head tokens
are decoded there at positions n_past .. n_past+k-1 (they attend to the history and each other, as in a full
prefill), the live sequence's spliced head cells are removed and the scratch sequence's new cells are handed to it
(seq_cp), then the scratch sequence is dropped. The block's other S - k cells stay as spliced; the query is decoded
after them. The paper calls its retired configuration a "scattered partial recompute" (KL ≈ 5.7 nats at depth 1024)
without saying which tokens it recomputed, so the same offset also measures the scattered reading: k tokens spread
evenly over the block (indices round(i S / k)), each recomputed in place in ascending order with its whole causal
context (the history and the block's cells before it, recomputed ones included), the others left as spliced.
Both recomputes leave, or make, cells of another sequence in the cache while they run; such masked cells alone move
the output by a numerical amount (also where the batch-split floor is exactly 0), so the LegoLink point
carries its own floor: the reference text decoded with the block's cells present as another sequence's
(layout_floor_logits).
"""

from __future__ import annotations

import numpy as np

from ..adapters.llama import kl_divergence, load_model
from ..config import DEFAULT_LLM, TEST_LLM
from ..splice.engine import SpliceEngine
from ..splice.fidelity import filler_tokens, query_tokens
from ..splice.render import prefix_tokens
from . import stats
from .common import DEFAULT_TOOL, NULL_PROGRESS, QUERIES, Progress, compile_block, context, find_tool
from .results import Run, model_identity, model_variant

SUITE = "dkl"
DEFAULT_OFFSETS = [0, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048]
DEFAULTS = dict(model=DEFAULT_LLM, offsets=DEFAULT_OFFSETS, queries=10, legolink_offset=1024)
QUICK = dict(model=TEST_LLM, offsets=[0, 64, 256], queries=2, legolink_offset=256)
PAPER = {"band_nats": [0.008, 0.038], "top1": 1.0, "legolink_kl_nats": 5.7, "legolink_offset": 1024, "queries": 10}


def legolink_recompute(ctx, block_tokens, n_past: int, k: int, live: int = 0, scratch: int = 1) -> None:
    """Recompute the first k cells of a block spliced at n_past of `live`, with the history as context (see above)."""
    ctx.seq_rm(scratch, -1, -1)
    ctx.seq_cp(live, scratch, 0, n_past)
    ctx.decode([int(t) for t in block_tokens[:k]], n_past, scratch, logits_last=False)
    ctx.seq_rm(live, n_past, n_past + k)
    ctx.seq_cp(scratch, live, n_past, n_past + k)
    ctx.seq_rm(scratch, -1, -1)


def scattered_indices(S: int, k: int) -> list[int]:
    """k block positions spread evenly over 0 .. S-1 (the first is 0), ascending and distinct."""
    n = min(k, S)
    return sorted({min(S - 1, round(i * S / n)) for i in range(n)})


def scattered_recompute(ctx, block_tokens, n_past: int, k: int, live: int = 0, scratch: int = 1) -> list[int]:
    """Recompute k cells spread over a block spliced at n_past of `live`, each in place with its causal context (the
    history and the block's cells before it as they stand, earlier recomputed ones included). Returns the indices."""
    idx = scattered_indices(len(block_tokens), k)
    for j in idx:
        pos = n_past + j
        ctx.seq_rm(scratch, -1, -1)
        ctx.seq_cp(live, scratch, 0, pos)
        ctx.decode([int(block_tokens[j])], pos, scratch, logits_last=False)
        ctx.seq_rm(live, pos, pos + 1)
        ctx.seq_cp(scratch, live, pos, pos + 1)
    ctx.seq_rm(scratch, -1, -1)
    return idx


def layout_floor_logits(ctx, block_tokens, q, n_past: int, live: int = 0, other: int = 1):
    """The reference text decoded again while the block's tokens also sit in the cache as another sequence's cells
    (what a recompute in a scratch sequence leaves there): the cells are masked out, but the attention runs over
    more of them, which moves the output by a numerical amount of its own. The returned logits' KL against the
    reference is the floor a scratch-sequence recompute can reach."""
    ctx.seq_rm(live, n_past, -1)
    ctx.seq_rm(other, -1, -1)
    ctx.decode([int(t) for t in block_tokens], n_past, other, logits_last=False)
    ctx.decode([int(t) for t in block_tokens] + [int(t) for t in q], n_past, live)
    logits = ctx.logits()
    ctx.seq_rm(other, -1, -1)
    return logits


def position_matched_block(ctx, prefix, block_tokens, n_past: int, live: int = 0, scratch: int = 1) -> None:
    """The control for the bare splice: the block computed by llama.cpp directly at its real positions n_past.. and,
    like the compiled block, after the compile prefix only (not the history); its cells are then given to `live`.

    The scratch sequence decodes prefix + block at positions n_past - len(prefix) .. (an empty sequence may start
    anywhere; RoPE attention depends on relative positions only, so the block sees the prefix exactly as at compile
    time). No re-rotation is involved: the control's divergence from the reference is the missing history alone,
    and the bare splice's divergence beyond it is what our re-anchoring adds."""
    m0 = len(prefix)
    ctx.seq_rm(live, n_past, -1)  # first: the context is sized for one copy of the block
    ctx.seq_rm(scratch, -1, -1)
    ctx.decode([int(t) for t in prefix] + [int(t) for t in block_tokens], n_past - m0, scratch, logits_last=False)
    ctx.seq_cp(scratch, live, n_past, n_past + len(block_tokens))
    ctx.seq_rm(scratch, -1, -1)


def run(
    model: str = DEFAULT_LLM,
    offsets=None,
    queries: int = 10,
    tool: str = DEFAULT_TOOL,
    registry_dir: str | None = None,
    legolink_offset: int | None = 1024,
    legolink_k: int = 16,
    flash_attn: bool = False,
    seed: int = 0,
    n_boot: int = 2000,
    out_dir: str = "results",
    quick: bool = False,
    progress: Progress = NULL_PROGRESS,
    write: bool = True,
) -> dict:
    offsets = sorted({int(o) for o in (offsets if offsets is not None else DEFAULT_OFFSETS)})
    if not 1 <= queries <= len(QUERIES):
        raise ValueError(f"queries must be within 1..{len(QUERIES)}")
    params = dict(model=model, offsets=offsets, queries=queries, tool=tool, legolink_offset=legolink_offset,
                  legolink_k=legolink_k, flash_attn=flash_attn, n_boot=n_boot, quick=quick, recompute_pct=0.0,
                  query_texts=QUERIES[:queries])
    run_ = Run(SUITE, params, seed=seed, models={"llm": model_identity(model)}, variant=model_variant(model))
    llm = load_model(model)
    block = compile_block(model, find_tool(tool, registry_dir), flash_attn)
    schema = [int(t) for t in block.tokens]
    S = len(schema)
    prefix = prefix_tokens(llm)
    m0 = len(prefix)
    qtoks = [query_tokens(llm, text) for text in QUERIES[:queries]]
    ll_offsets = [legolink_offset] if legolink_offset is not None else []
    all_offsets = sorted(set(offsets) | set(ll_offsets))
    progress.set_total(len(all_offsets) * queries)

    rows, samples = [], {}
    legolink = None
    for off in all_offsets:
        hist = prefix + filler_tokens(llm, off)
        n_past = len(hist)
        # room for the history, a block, a second block's cells (a recompute's scratch copy, the layout floor's
        # other sequence) and a query
        ctx = context(llm, n_past + m0 + 2 * S + max(len(q) for q in qtoks) + 8, flash_attn)
        try:
            engine = SpliceEngine(ctx)
            engine.check(block)
            ctx.clear()
            ctx.decode(hist, 0, 0, logits_last=False)
            kl, top1, floor, ll_kl, ll_top1, pm_kl, pm_top1 = [], [], [], [], [], [], []
            sc_kl, sc_top1, layout = [], [], []
            for q in qtoks:
                ctx.seq_rm(0, n_past, -1)
                ctx.decode(schema + q, n_past, 0)
                ref = ctx.logits()
                ctx.seq_rm(0, n_past, -1)
                ctx.decode(schema, n_past, 0, logits_last=False)
                ctx.decode(q, n_past + S, 0)
                split = ctx.logits()
                floor.append(kl_divergence(ref, split))
                if off in offsets:
                    ctx.seq_rm(0, n_past, -1)
                    res = engine.splice(block, n_past, 0.0, then_tokens=q)
                    kl.append(kl_divergence(ref, res.logits))
                    top1.append(int(np.argmax(ref)) == int(np.argmax(res.logits)))
                    position_matched_block(ctx, prefix, schema, n_past)
                    ctx.decode(q, n_past + S, 0)
                    pm = ctx.logits()
                    pm_kl.append(kl_divergence(ref, pm))
                    pm_top1.append(int(np.argmax(ref)) == int(np.argmax(pm)))
                if off in ll_offsets:
                    layout.append(kl_divergence(ref, layout_floor_logits(ctx, schema, q, n_past)))
                    for repair, kls, top1s in ((legolink_recompute, ll_kl, ll_top1),
                                               (scattered_recompute, sc_kl, sc_top1)):
                        ctx.seq_rm(0, n_past, -1)
                        engine.splice(block, n_past, 0.0, then_tokens=None)
                        repair(ctx, schema, n_past, min(legolink_k, S))
                        ctx.decode(q, n_past + S, 0)
                        lg = ctx.logits()
                        kls.append(kl_divergence(ref, lg))
                        top1s.append(int(np.argmax(ref)) == int(np.argmax(lg)))
                progress.advance(f"offset {off}")
        finally:
            ctx.close()
        samples[f"o{off}"] = {"kl": kl, "top1": top1, "floor_kl": floor, "legolink_kl": ll_kl, "legolink_top1": ll_top1,
                              "legolink_scattered_kl": sc_kl, "legolink_scattered_top1": sc_top1,
                              "layout_floor_kl": layout,
                              "position_matched_kl": pm_kl, "position_matched_top1": pm_top1}
        if off in offsets:
            rows.append({
                "offset": off, "n_past": n_past,
                "kl_mean": stats.mean_ci(kl, n_boot, seed), "kl_median": float(np.median(kl)), "kl_max": float(max(kl)),
                "top1": stats.wilson(sum(top1), len(top1)),
                "floor_mean": float(np.mean(floor)), "floor_max": float(max(floor)),
                "position_matched_kl_mean": stats.mean_ci(pm_kl, n_boot, seed),
                "position_matched_top1": stats.wilson(sum(pm_top1), len(pm_top1)),
                "rotation_kl_excess_max": float(max(abs(a - b) for a, b in zip(kl, pm_kl))),
            })
        if off in ll_offsets:
            legolink = {
                "offset": off, "n_past": n_past, "k": min(legolink_k, S),
                "kl_mean": stats.mean_ci(ll_kl, n_boot, seed), "kl_max": float(max(ll_kl)),
                "top1": stats.wilson(sum(ll_top1), len(ll_top1)),
                "floor_mean": float(np.mean(floor)),
                "layout_floor_mean": float(np.mean(layout)), "layout_floor_max": float(max(layout)),
                "bare_kl_mean_same_offset": float(np.mean(kl)) if kl else None,
                "paper_kl": PAPER["legolink_kl_nats"],
                "scattered": {"indices": scattered_indices(S, min(legolink_k, S)),
                              "kl_mean": stats.mean_ci(sc_kl, n_boot, seed), "kl_max": float(max(sc_kl)),
                              "top1": stats.wilson(sum(sc_top1), len(sc_top1))},
            }
    off_anchor = [r for r in rows if r["offset"] > 0]
    summary = {
        "rows": rows,
        "legolink": legolink,
        "m0": m0, "S": S,
        "paper": PAPER,
        "plateau": {
            "kl_mean_min": min((r["kl_mean"].value for r in off_anchor), default=None),
            "kl_mean_max": max((r["kl_mean"].value for r in off_anchor), default=None),
            "top1_all": all(r["top1"].value == 1.0 for r in rows),
        },
    }
    if legolink is not None:
        summary["legolink_negative_result_reproduced"] = bool(
            max(legolink["kl_mean"].value, legolink["scattered"]["kl_mean"].value) >= 1.0)
    if not write:
        return run_.document(summary, samples)
    return run_.write(summary, samples, out_dir=out_dir, figure=lambda plt: figure(plt, rows, legolink))


def figure(plt, rows, legolink):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = [r["offset"] for r in rows]
    ys = [max(r["kl_mean"].value, 1e-7) for r in rows]
    err = [[max(r["kl_mean"].value - r["kl_mean"].lo, 0) for r in rows], [r["kl_mean"].hi - r["kl_mean"].value for r in rows]]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label="bare splice (R = 0), mean KL, 95 % bootstrap CI")
    ax.plot(xs, [max(r["floor_mean"], 1e-7) for r in rows], ls=":", color="grey", label="numerical floor (batch split)")
    ax.axhspan(*PAPER["band_nats"], color="tab:green", alpha=0.12, label="paper band 0.008–0.038 (14B)")
    if legolink is not None:
        lk = legolink["kl_mean"]
        ax.errorbar([legolink["offset"]], [max(lk.value, 1e-7)], yerr=[[max(lk.value - lk.lo, 0)], [lk.hi - lk.value]],
                    marker="s", color="tab:red", capsize=3, ls="none", label=f"LegoLink k={legolink['k']} (ours)")
        ax.plot([PAPER["legolink_offset"]], [PAPER["legolink_kl_nats"]], marker="x", color="tab:red", ls="none",
                markersize=9, label="LegoLink, paper (5.7)")
        sk = legolink["scattered"]["kl_mean"]
        ax.errorbar([legolink["offset"] * 1.06], [max(sk.value, 1e-7)], yerr=[[max(sk.value - sk.lo, 0)], [sk.hi - sk.value]],
                    marker="D", color="tab:purple", capsize=3, ls="none",
                    label=f"scattered recompute k={legolink['k']} (ours)")
    m0 = rows[0]["n_past"] - rows[0]["offset"] if rows else 0
    ax.axvline(256 - m0, color="black", ls="--", lw=0.8, label=f"P = 256 (n_past; offset {256 - m0})")
    ax.set_xscale("symlog", linthresh=16)
    ax.set_xlim(left=0, right=max(xs + [legolink["offset"] if legolink else 0]) * 1.15)
    ax.set_yscale("log")
    ax.set_xlabel("placement offset n_past − m0 (tokens; 0 = compile anchor)")
    ax.set_ylabel("D_KL(p_ref ‖ p_splice) (nats)")
    kept = sum(1 for r in rows if r["top1"].value == 1.0)
    ax.set_title(f"Bare-splice KL vs offset (Fig. 1); top-1 kept at all queries in {kept}/{len(rows)} offsets",
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig
