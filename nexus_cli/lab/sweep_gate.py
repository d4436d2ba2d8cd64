"""Table II: does a reference-free drift proxy predict the true per-head drift of a bare splice?

Heads are the KV heads of every layer (n_layer x n_head_kv: 48 for Qwen2.5-0.5B, 90 for SmolLM2-135M). For one cell
(cursor n_past = depth, context on- or off-topic):

  proxy[l, h]  (reference-free, what a runtime gate could compute before splicing): the K-variance of the preceding
               context for that head — the variance over the n_past preceding cells of each of the head's head_dim
               key components, averaged over the components. Read from llama.cpp's own K cache (post-RoPE, F16).
  drift[l, h]  (needs the reference, i.e. the prefill the gate wants to avoid): the mean over the S schema tokens of
               the L2 norm of the difference between the spliced key (compiled after the compile prefix, re-rotated to
               its new position, R = 0) and the reference key (the schema decoded as text after this context), for
               that head. The same with values is reported as a second, V-side drift.

Spearman rho(proxy, drift) over the heads is the cell's score (with a 95 % bootstrap interval over heads, seeded);
the gate is a go only if the mean over cells reaches 0.40. The paper measured 0.193 on a 14B model (no-go).

On-topic context: a conversation about repositories, branches and pull requests (the schema's own subject).
Off-topic context: a conversation about cooking and travel. Both are repeated to length after the compile prefix.
"""

from __future__ import annotations

import numpy as np

from ..adapters.llama import load_model
from ..config import DEFAULT_LLM, TEST_LLM
from ..splice.compile import extract_cells
from ..splice.engine import SpliceEngine
from ..splice.render import prefix_tokens
from . import stats
from .common import DEFAULT_TOOL, NULL_PROGRESS, Progress, compile_block, context, find_tool
from .results import Run, model_identity, model_variant

SUITE = "gate"
DEFAULT_DEPTHS = [256, 1024, 2048]
DEFAULTS = dict(model=DEFAULT_LLM, depths=DEFAULT_DEPTHS)
QUICK = dict(model=TEST_LLM, depths=[256])
TARGET_RHO = 0.40
PAPER = {
    (256, "on"): (207.1, 105.2, 0.147), (256, "off"): (195.3, 97.8, 0.221),
    (1024, "on"): (193.2, 98.4, 0.182), (1024, "off"): (189.1, 96.4, 0.250),
    (2048, "on"): (194.7, 97.6, 0.159), (2048, "off"): (175.4, 91.0, 0.197),
}
PAPER_MEAN_RHO = 0.193

ON_TOPIC = (
    "User: I opened a branch called feature/login in our api repository and pushed three commits. How do I get them "
    "reviewed?\nAssistant: Open a pull request from feature/login into main, describe what changed and why, and "
    "request a review from someone who owns the authentication code. Keep the pull request small so it is quick to "
    "review.\nUser: The CI checks failed on the second commit. Should I close the pull request?\nAssistant: No. Push a "
    "fix to the same branch; the pull request updates itself and the checks run again. Mark it as a draft while you "
    "work, then ready for review when the checks pass.\nUser: A reviewer asked me to rebase onto main. What does that "
    "do to the pull request?\nAssistant: Rebasing rewrites your branch on top of the latest main, so the pull request "
    "shows only your changes against current code. Force-push the branch afterwards; the review comments stay.\nUser: "
    "Can I merge it myself once it is approved?\nAssistant: If the repository's branch protection allows it, yes: "
    "choose squash merge to keep main's history linear, and delete the branch after merging.\n"
)
OFF_TOPIC = (
    "User: I want to cook a risotto for six people tonight. What do I need?\nAssistant: Arborio rice, a good stock, "
    "an onion, butter, a glass of dry white wine and plenty of parmesan. Warm the stock before you start and add it "
    "one ladle at a time while stirring.\nUser: Can I make it ahead and reheat it?\nAssistant: Cook it about three "
    "quarters of the way, spread it on a tray to cool, and finish it with hot stock just before serving.\nUser: We are "
    "also planning a trip to Lisbon in spring. Which neighbourhoods are nice to stay in?\nAssistant: Alfama for its "
    "narrow streets and views, Chiado for cafés and bookshops, and Principe Real for quiet gardens. Take the tram up "
    "to the castle early in the morning before the crowds arrive.\nUser: Is it worth a day trip to Sintra?\nAssistant: "
    "Yes, go on a weekday, buy palace tickets in advance and wear comfortable shoes: the paths between the palaces are "
    "steep.\n"
)


def _to_f32(rows: np.ndarray) -> np.ndarray:
    return rows.view(np.float16).astype(np.float32)


def per_head_proxy(k_hist: np.ndarray, n_head_kv: int, head_dim: int) -> np.ndarray:
    """[n_layer, n_cells, n_head_kv*head_dim] F16 bits -> [n_layer, n_head_kv] mean per-component variance."""
    k = _to_f32(k_hist).reshape(k_hist.shape[0], k_hist.shape[1], n_head_kv, head_dim)
    return k.var(axis=1).mean(axis=-1)


def per_head_drift(a: np.ndarray, b: np.ndarray, n_head_kv: int, head_dim: int) -> np.ndarray:
    """Mean over tokens of the per-head L2 distance between two [n_layer, n_tok, row] F16 row sets."""
    d = (_to_f32(a) - _to_f32(b)).reshape(a.shape[0], a.shape[1], n_head_kv, head_dim)
    return np.sqrt((d * d).sum(axis=-1)).mean(axis=1)


def _v_rows(v: np.ndarray, transposed: bool) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(v, 1, 2)) if transposed else v


def spearman_ci(x: np.ndarray, y: np.ndarray, n_boot: int, seed: int) -> dict:
    rho = stats.spearman(x, y)
    rng = np.random.default_rng(seed)
    n = len(x)
    boots = []
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        r = stats.spearman(x[idx], y[idx])
        if r == r:
            boots.append(r)
    lo, hi = (np.quantile(boots, [0.025, 0.975]) if boots else (float("nan"), float("nan")))
    return {"value": rho, "lo": float(lo), "hi": float(hi), "method": f"bootstrap over heads (B={n_boot}, seed={seed})",
            "n": n}


def run(
    model: str = DEFAULT_LLM,
    depths=None,
    tool: str = DEFAULT_TOOL,
    registry_dir: str | None = None,
    flash_attn: bool = False,
    seed: int = 0,
    n_boot: int = 1000,
    out_dir: str = "results",
    quick: bool = False,
    progress: Progress = NULL_PROGRESS,
    write: bool = True,
) -> dict:
    depths = [int(d) for d in (depths or DEFAULT_DEPTHS)]
    params = dict(model=model, depths=depths, tool=tool, flash_attn=flash_attn, n_boot=n_boot, quick=quick,
                  contexts=["on", "off"], recompute_pct=0.0, target_rho=TARGET_RHO,
                  proxy="mean over head_dim of the variance over the preceding n_past cells of the head's K (post-RoPE)",
                  drift="mean over schema tokens of ||K_splice - K_ref||_2 per head (V likewise)")
    run_ = Run(SUITE, params, seed=seed, models={"llm": model_identity(model)}, variant=model_variant(model))
    llm = load_model(model)
    ident = llm.identity
    nkv, hd = ident.n_head_kv, ident.head_dim
    block = compile_block(model, find_tool(tool, registry_dir), flash_attn)
    schema = [int(t) for t in block.tokens]
    S = len(schema)
    prefix = prefix_tokens(llm)
    m0 = len(prefix)
    topic_tokens = {
        "on": llm.tokenize(ON_TOPIC, add_special=False, parse_special=False),
        "off": llm.tokenize(OFF_TOPIC, add_special=False, parse_special=False),
    }
    progress.set_total(len(depths) * 2)
    rows, samples = [], {}
    for depth in depths:
        if depth <= m0:
            raise ValueError(f"depth {depth} must exceed the compile prefix ({m0} tokens)")
        ctx = context(llm, depth + S + 8, flash_attn)
        try:
            engine = SpliceEngine(ctx)
            engine.check(block)
            for topic in ("on", "off"):
                base = topic_tokens[topic]
                filler = (base * ((depth - m0) // len(base) + 1))[: depth - m0]
                hist = prefix + filler
                n_past = len(hist)
                ctx.clear()
                ctx.decode(hist, 0, 0, logits_last=False)
                k_hist, _ = extract_cells(ctx, 0, 0, n_past)
                proxy = per_head_proxy(k_hist, nkv, hd)
                engine.splice(block, n_past, 0.0, then_tokens=None)
                k_spl, v_spl = extract_cells(ctx, 0, n_past, n_past + S)
                ctx.seq_rm(0, n_past, -1)
                ctx.decode(schema, n_past, 0, logits_last=False)
                k_ref, v_ref = extract_cells(ctx, 0, n_past, n_past + S)
                vt = not flash_attn
                drift = per_head_drift(k_spl, k_ref, nkv, hd)
                vdrift = per_head_drift(_v_rows(v_spl, vt), _v_rows(v_ref, vt), nkv, hd)
                x, y, yv = proxy.ravel(), drift.ravel(), vdrift.ravel()
                row = {
                    "n_past": n_past, "ctx": topic, "heads": int(x.size),
                    "max_drift": float(y.max()), "mean_drift": float(y.mean()),
                    "rho": spearman_ci(x, y, n_boot, seed),
                    "max_drift_v": float(yv.max()), "mean_drift_v": float(yv.mean()),
                    "rho_v": spearman_ci(x, yv, n_boot, seed + 1),
                    "max_proxy": float(x.max()), "mean_proxy": float(x.mean()),
                }
                pp = PAPER.get((depth, topic))
                if pp:
                    row["paper"] = {"max_drift": pp[0], "mean_drift": pp[1], "rho": pp[2]}
                rows.append(row)
                samples[f"d{depth}/{topic}"] = {"proxy": x, "drift_k": y, "drift_v": yv}
                progress.advance(f"n_past {depth} {topic}")
        finally:
            ctx.close()
    rhos = [r["rho"]["value"] for r in rows if r["rho"]["value"] == r["rho"]["value"]]
    rhos_v = [r["rho_v"]["value"] for r in rows if r["rho_v"]["value"] == r["rho_v"]["value"]]
    mean_rho = float(np.mean(rhos)) if rhos else None
    summary = {
        "rows": rows,
        "mean_rho": mean_rho,
        "mean_rho_v": float(np.mean(rhos_v)) if rhos_v else None,
        "target_rho": TARGET_RHO,
        "gate_go": bool(mean_rho is not None and mean_rho >= TARGET_RHO),
        "paper_mean_rho": PAPER_MEAN_RHO,
        "m0": m0, "S": S, "heads": f"{ident.n_layer} layers x {nkv} KV heads",
    }
    if not write:
        return run_.document(summary, samples)
    return run_.write(summary, samples, out_dir=out_dir, figure=lambda plt: figure(plt, rows, samples))


def figure(plt, rows, samples):
    n = len(rows)
    cols = min(n, 3)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.4 * nrows), squeeze=False)
    for ax, row in zip(axes.ravel(), rows):
        s = samples[f"d{row['n_past']}/{row['ctx']}"]
        ax.scatter(s["proxy"], s["drift_k"], s=12, alpha=0.7)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_title(f"n_past {row['n_past']}, {row['ctx']}-topic: ρ = {row['rho']['value']:.3f}", fontsize=9)
        ax.set_xlabel("proxy: preceding-context K variance", fontsize=8)
        ax.set_ylabel("true drift: mean ‖K_splice − K_ref‖", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.suptitle("Reference-free drift proxy vs true per-head drift (Table II)", fontsize=10)
    fig.tight_layout()
    return fig
