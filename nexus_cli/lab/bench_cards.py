"""Compiled tool cards in sessions (arguments/cards.py): the argument step after a live conversation, with the tool's
card spliced against the same card decoded again, side by side in one run, and the card repair calibrated per model.

Conversations: every case of the argument sets (benchmarks/queries/args_cases*.jsonl) becomes the last turn of a
session whose earlier turns are the cases before it in its file (each: the user's request, the assistant's call with
its gold arguments), after the case's own history if it has one. Depth = the card's cursor n_past (the argument
prompt's tokens before the card). Depth 0 means the product's window (arguments/prompt.py: the last 6 messages,
1,200 characters); 512, 1024, 2048 mean a window that keeps the fewest earlier turns putting the card at least
that deep.

Split: development = the cases of args_cases, _b, _c, _d; test = _e, _f, _g, _h. The repair is chosen on
development only: per depth band, the smallest share H of the card's first tokens decoded after the conversation
(grid HEAD_GRID) whose mean KL against the re-prefill stays within 2x the mean floor of that band. Eq. (2)'s repair
(the card's last tokens decoded again, TAIL_GRID) is measured on the same conversations for comparison. The test part then
measures, with the calibrated repair, per conversation:

  re-prefill   the work sequence holds the conversation [0, head); the card, the request and the assistant header are
               decoded -> next-token logits (the reference) and the time to them (argument-step TTFT);
  splice       the same sequence; the card placed (first H % decoded, the rest spliced from its compiled block, which
               is compiled before timing, as a session finds it after its first use), then the request decoded;
  floor        the re-prefill again with its cells FLOOR_SHIFT places further in the cache (another sequence's cells
               taken first): llama.cpp's CPU attention sums in cell order, so this is the noise of placement alone,
               which any reuse of cached cells (the L0 arena's included) also carries;
  alt          the splice with a fixed share ALT_HEAD decoded instead of the calibrated one (the trade-off);
  arguments    `generate_arguments` over the three paths (greedy, grammar, repairs): the share of turns whose
               arguments are identical to the re-prefill's.

The order of the timed paths is drawn at random per conversation. KL = D_KL(p_reprefill || p_splice) of the next token.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from ..adapters.llama import LlamaContext, kl_divergence, load_model
from ..arguments.cards import CARD_REPAIR_FILE, CardRepair, CardSplicer, CardStore, card_span
from ..arguments.pipeline import generate_arguments
from ..arguments.prompt import build_messages, tool_block
from ..config import DEFAULT_LLM, REPO_ROOT
from ..files import atomic_write_json
from ..schema import compile_tool
from ..splice.engine import recompute_tokens
from ..splice.state import parse_state_blob
from . import stats
from .bench_routing import load_queries, pool_tools
from .common import NULL_PROGRESS, Progress, registry_dir_default
from .results import Run, model_identity, model_variant

SUITE = "card-splice"
QUERIES = REPO_ROOT / "benchmarks" / "queries"
DEV_FILES = ("args_cases.jsonl", "args_cases_b.jsonl", "args_cases_c.jsonl", "args_cases_d.jsonl")
TEST_FILES = ("args_cases_e.jsonl", "args_cases_f.jsonl", "args_cases_g.jsonl", "args_cases_h.jsonl")
HEAD_GRID = (0.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0)
ALT_HEAD = 30.0  # a fixed share measured beside the calibrated one on the test part: where more decoding stopped
#                 helping on the development conversations (the knee of the KL curve)
TAIL_GRID = (5.0, 30.0, 50.0)  # eq. (2)'s repair (the card's last tokens decoded again), compared on the same runs
# CacheBlend's choice of the tokens to recompute (those whose K/V deviate most from a full prefill's), compared with
# the first tokens on the same runs at the same shares
DEVIATION_GRID = (10.0, 20.0, 30.0, 50.0, 75.0)
BANDS = (512, 1024, 2048)  # depth bands of the repair: up to 512, 1024, 2048 tokens; beyond, the last one's share
WIDE = (100_000, 10_000_000)  # a window that keeps every earlier turn (its depth is set by the turns given)
DEFAULTS = dict(model=DEFAULT_LLM, depths=[0, 512, 1024, 2048], dev_cases=3, test_cases=6, max_fold=2.0)
QUICK = dict(model="smollm2-135m", depths=[0, 512], dev_cases=1, test_cases=1)
N_CTX = 4096
WORK, SCRATCH, SHIFT = 0, 1, 2  # sequences: the conversation, the splice's landing (and compile), the floor's shift
FLOOR_SHIFT = 37  # cells the floor's re-prefill is moved by


def _cases(files, per_file: int) -> list[tuple[dict, list[dict]]]:
    """(case, the turns of its file before it) for the first `per_file` cases of each file with a known tool."""
    out = []
    for name in files:
        rows = load_queries(QUERIES / name)
        for i, case in enumerate(rows[:per_file]):
            earlier = rows[:i][::-1] + rows[per_file:][::-1]  # the nearest earlier turns first
            out.append((case, earlier))
    return out


def _turn(case: dict) -> list[dict]:
    call = {"tool": f"{case['server']}/{case['tool']}", "arguments": case.get("arguments") or {}}
    return [{"role": "user", "content": case["query"]},
            {"role": "assistant", "content": json.dumps(call, ensure_ascii=False)}]


def conversation(model, spec, case: dict, earlier: list[dict], depth: int):
    """(history, window_size, messages, tokens, span) of the case as the last turn at `depth` (0: the product's
    window over the earlier turns), or None when its prompt does not split at the card (or does not fit)."""
    own = list(case.get("history") or [])
    if depth == 0:
        history = [m for c in earlier[:6][::-1] for m in _turn(c)] + own
        size = None
    else:
        size = WIDE
        history = own
        for c in earlier:  # the fewest earlier turns that put the card at `depth` or deeper
            msgs, _ = build_messages(spec, case["query"], history, window_size=size)
            toks = model.chat_tokens(msgs)
            span = card_span(model, msgs, tool_block(spec), toks)
            if span is None or span.head >= depth:
                break
            history = _turn(c) + history
    messages, _ = build_messages(spec, case["query"], history, window_size=size)
    tokens = model.chat_tokens(messages)
    span = card_span(model, messages, tool_block(spec), tokens)
    if span is None or len(tokens) + 320 > N_CTX:
        return None
    return history, size, tokens, span


class _Held:
    """An argument call's prompt cache for the benchmark: the work sequence holds the conversation [0, n) already
    (a session's live KV), and, with a CardSplicer, the card is spliced after it."""

    def __init__(self, n: int, cards: CardSplicer | None, head_pct: float | None = None):
        self.n = n
        self.cards = cards
        self.head_pct = head_pct  # None: the splicer's repair
        self.prefixes = None
        self.report = None

    def start(self, ctx, tokens, n_tool_prefix, seq_id, card=None):
        if card is not None and self.cards is not None:
            start, self.report = self.cards.prepare(tokens, card, self.n, self.head_pct)
            return start
        return self.n

    def kept(self, ctx, tokens, generated, seq_id):
        pass


def _tail(ctx, tokens, start: int) -> np.ndarray:
    ctx.decode(list(tokens[start:]), start, WORK)
    return np.array(ctx.logits(), copy=True)


def _reprefill(ctx, tokens, head: int) -> tuple[np.ndarray, float]:
    ctx.seq_rm(WORK, head, -1)
    t0 = time.perf_counter()
    logits = _tail(ctx, tokens, head)
    return logits, (time.perf_counter() - t0) * 1e3


def _spliced(ctx, splicer: CardSplicer, tokens, span, head_pct: float | None = None) -> tuple[np.ndarray, float]:
    ctx.seq_rm(WORK, span.head, -1)
    t0 = time.perf_counter()
    start, _ = splicer.prepare(tokens, span, span.head, head_pct)
    logits = _tail(ctx, tokens, start)
    return logits, (time.perf_counter() - t0) * 1e3


def _tail_repaired(ctx, splicer: CardSplicer, tokens, span, pct: float) -> np.ndarray:
    """The card spliced whole with eq. (2)'s repair instead: its last ceil(S * pct / 100) tokens decoded again."""
    ctx.seq_rm(WORK, span.head, -1)
    block, _ = splicer.store.block_for(ctx, span, SCRATCH)
    placed = splicer.engine.place(block, span.head, pct)
    return _tail(ctx, tokens, span.end - placed.recomputed_tokens)


def _floor(ctx, tokens, head: int, ref: np.ndarray) -> float:
    ctx.seq_rm(WORK, head, -1)
    # FLOOR_SHIFT cells taken first: the tail lands after them (a shift of one cell often sums in the same order)
    ctx.decode(list(tokens[:FLOOR_SHIFT]), 0, SHIFT, logits_last=False)
    try:
        shifted = _tail(ctx, tokens, head)
    finally:
        ctx.seq_rm(SHIFT, -1, -1)
    return kl_divergence(ref, shifted)


def _card_cells(ctx, span) -> tuple[np.ndarray, np.ndarray]:
    """The K and V rows of the card's cells in the work sequence, float32 [layer, card token, row]."""
    st = parse_state_blob(ctx.state_seq_get(WORK))
    at = np.nonzero((st.pos >= span.head) & (st.pos < span.end))[0]
    at = at[np.argsort(st.pos[at], kind="stable")]
    if at.size != len(span.tokens):
        raise ValueError(f"the work sequence holds {at.size} of the card's {len(span.tokens)} cells")
    k = st.k[:, at].view(np.float16).astype(np.float32)
    v = (st.v[:, :, at].transpose(0, 2, 1) if st.v_trans else st.v[:, at]).view(np.float16).astype(np.float32)
    return k, v


def _deviations(full, spliced) -> tuple[np.ndarray, np.ndarray]:
    """Per card token, how far its spliced K/V lie from the full prefill's: summed over the layers (each layer's
    squared error over its mean squared norm, so that every layer counts alike), and in layer 1 alone (the first
    whose K/V depend on what came before; layer 0's only on the position)."""
    (fk, fv), (sk, sv) = full, spliced
    err = ((fk - sk) ** 2).sum(-1) + ((fv - sv) ** 2).sum(-1)  # [layer, token]
    scale = (fk ** 2).sum(-1).mean(-1, keepdims=True) + (fv ** 2).sum(-1).mean(-1, keepdims=True)
    rel = err / np.maximum(scale, 1e-30)
    return rel.sum(0), rel[min(1, rel.shape[0] - 1)]


def _selective(ctx, tokens, span, chosen: set[int]) -> np.ndarray:
    """The card assembled from its spliced cells (held by the SHIFT sequence) and the `chosen` card tokens decoded
    anew in place, in order, each attending to the conversation and to every card cell before it; then the tail."""
    ctx.seq_rm(WORK, span.head, -1)
    n, j = len(span.tokens), 0
    while j < n:
        fresh, j2 = j in chosen, j
        while j2 < n and (j2 in chosen) == fresh:
            j2 += 1
        if fresh:
            ctx.decode(list(tokens[span.head + j:span.head + j2]), span.head + j, WORK, logits_last=False)
        else:
            ctx.seq_cp(SHIFT, WORK, span.head + j, span.head + j2)
        j = j2
    return _tail(ctx, tokens, span.end)


def _by_deviation(ctx, splicer, tokens, span, ref) -> dict:
    """KL against the re-prefill with the H % of the card's tokens recomputed that deviate most (all layers; layer
    1), and with its first H % recomputed in the same way (the check that the assembly adds nothing of its own)."""
    _reprefill(ctx, tokens, span.head)
    full = _card_cells(ctx, span)
    _spliced(ctx, splicer, tokens, span, 0.0)
    bare = _card_cells(ctx, span)
    ctx.seq_rm(SHIFT, -1, -1)
    ctx.seq_cp(WORK, SHIFT, span.head, span.end)  # the spliced card, kept aside
    try:
        dev_all, dev_first = _deviations(full, bare)
        out = {"deviation": {}, "layer1": {}, "first": {}}
        n = len(span.tokens)
        for h in DEVIATION_GRID:
            r = recompute_tokens(n, h)
            picks = {"deviation": np.argsort(-dev_all, kind="stable")[:r],
                     "layer1": np.argsort(-dev_first, kind="stable")[:r], "first": np.arange(r)}
            for name, idx in picks.items():
                out[name][f"{h:g}"] = kl_divergence(ref, _selective(ctx, tokens, span, {int(i) for i in idx}))
        # where the deviation lies along the card: the share of it in the card's first 20 % of tokens
        first20 = max(1, recompute_tokens(n, 20.0))
        out["deviation_in_first_20pct"] = float(dev_all[:first20].sum() / max(dev_all.sum(), 1e-30))
        return out
    finally:
        ctx.seq_rm(SHIFT, -1, -1)


def _band(depth: int) -> int | None:
    return next((b for b in BANDS if depth <= b), None)


def _calibrate(rows: list[dict], max_fold: float) -> tuple[list, dict]:
    """Per band, the smallest H of HEAD_GRID whose mean KL is within max_fold x the band's mean floor."""
    bands, detail = [], {}
    for b in (*BANDS, None):
        sel = [r for r in rows if _band(r["head"]) == b]
        if not sel:
            continue
        floor = float(np.mean([r["floor_kl"] for r in sel]))
        means = {h: float(np.mean([r["kl_by_head"][f"{h:g}"] for r in sel])) for h in HEAD_GRID}
        chosen = next((h for h in HEAD_GRID if means[h] <= max_fold * floor), 100.0)
        bands.append([b, chosen])
        tails = {f"{t:g}": float(np.mean([r["kl_by_tail"][f"{t:g}"] for r in sel])) for t in TAIL_GRID}
        detail[str(b)] = {"n": len(sel), "depth_median": float(np.median([r["head"] for r in sel])),
                          "floor_kl_mean": floor, "kl_mean_by_head": {f"{h:g}": v for h, v in means.items()},
                          "kl_mean_by_tail": tails, "chosen_head_pct": chosen}
        if all("kl_by_choice" in r for r in sel):  # which tokens to recompute: first, or deviating most
            by = {}
            for name in ("first", "deviation", "layer1"):
                m = {f"{h:g}": float(np.mean([r["kl_by_choice"][name][f"{h:g}"] for r in sel])) for h in DEVIATION_GRID}
                by[name] = {"kl_mean": m, "smallest_within": next(
                    (h for h in DEVIATION_GRID if m[f"{h:g}"] <= max_fold * floor), 100.0)}
            by["deviation_in_first_20pct_mean"] = float(np.mean(
                [r["kl_by_choice"]["deviation_in_first_20pct"] for r in sel]))
            detail[str(b)]["by_choice"] = by
    if bands and bands[-1][0] is not None:
        bands.append([None, bands[-1][1]])  # beyond the deepest band measured: its share
    return bands, detail


def run(model: str = DEFAULTS["model"], depths=None, dev_cases: int = DEFAULTS["dev_cases"],
        test_cases: int = DEFAULTS["test_cases"], max_fold: float = DEFAULTS["max_fold"],
        registry_dir: str | None = None, seed: int = 0, n_boot: int = 2000, out_dir: str = "results",
        quick: bool = False, write_repair: bool = False, progress: Progress = NULL_PROGRESS, write: bool = True) -> dict:
    depths = [int(d) for d in (depths or DEFAULTS["depths"])]
    params = dict(model=model, depths=depths, dev_cases_per_file=dev_cases, test_cases_per_file=test_cases,
                  max_fold=max_fold, head_grid=list(HEAD_GRID), bands=list(BANDS), dev_files=list(DEV_FILES),
                  test_files=list(TEST_FILES), n_ctx=N_CTX, flash_attn=True, quick=quick, write_repair=write_repair)
    run_ = Run(SUITE, params, seed=seed, models={"llm": model_identity(model)}, variant=model_variant(model))
    llm = load_model(model)
    tools = {t.key: t for t in pool_tools(Path(registry_dir) if registry_dir else registry_dir_default())}
    specs: dict[str, object] = {}

    def spec_of(case):
        key = f"{case['server']}/{case['tool']}"
        if key not in specs:
            specs[key] = compile_tool(tools[key]) if key in tools else None
        return specs[key]

    dev = [(c, e) for c, e in _cases(DEV_FILES, dev_cases) if spec_of(c) is not None]
    test = [(c, e) for c, e in _cases(TEST_FILES, test_cases) if spec_of(c) is not None]
    progress.set_total((len(dev) + len(test)) * len(depths))
    ctx = LlamaContext(llm, n_ctx=N_CTX, n_batch=512, n_seq_max=3, flash_attn=True)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="nexus-bench-cards-") as cache:
        store = CardStore(cache)
        splicer = CardSplicer(ctx, store, WORK, SCRATCH, repair=CardRepair(((None, 0.0),)))
        try:
            dev_rows = _measure(ctx, llm, splicer, dev, depths, spec_of, calibrate=True, progress=progress)
            bands, detail = _calibrate(dev_rows, max_fold)
            repair = CardRepair(tuple((b, float(h)) for b, h in bands), source=SUITE)
            splicer.repair = repair
            test_rows = _measure(ctx, llm, splicer, test, depths, spec_of, calibrate=False, progress=progress,
                                 seed=seed)
        finally:
            ctx.close()
    summary = {"repair": {"bands": bands, "dev": detail}, "test": _summarize(test_rows, depths, n_boot, seed),
               "dev_conversations": len(dev_rows), "test_conversations": len(test_rows),
               "skipped": {"dev": len(dev) * len(depths) - len(dev_rows),
                           "test": len(test) * len(depths) - len(test_rows)}}
    samples = {"dev": dev_rows, "test": test_rows}
    doc = run_.write(summary, samples, out_dir=out_dir) if write else run_.document(summary, samples)
    if write_repair:
        save_repair(llm.identity, bands, doc.get("files", {}).get("json", ""))
    return doc


def save_repair(identity, bands: list, source: str) -> None:
    """Record the calibrated repair of a model in CARD_REPAIR_FILE (what CardRepair.for_model reads)."""
    try:
        table = json.loads(CARD_REPAIR_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        table = {}
    models = table.setdefault("models", {})
    models[identity.sha256] = {"name": identity.name, "bands": bands,
                               "source": Path(source).name if source else ""}
    atomic_write_json(CARD_REPAIR_FILE, table)


def _measure(ctx, llm, splicer, cases, depths, spec_of, calibrate: bool, progress, seed: int = 0) -> list[dict]:
    rows = []
    rng = np.random.default_rng(seed)
    for case, earlier in cases:
        spec = spec_of(case)
        for depth in depths:
            progress.advance(f"{'dev' if calibrate else 'test'} {case['id']} d{depth}")
            conv = conversation(llm, spec, case, earlier, depth)
            if conv is None:
                continue
            history, size, tokens, span = conv
            ctx.seq_rm(WORK, -1, -1)
            ctx.decode(list(tokens[:span.head]), 0, WORK, logits_last=False)  # the live conversation
            splicer.store.block_for(ctx, span, SCRATCH)  # compiled once, before anything is timed
            row = {"id": case["id"], "tool": f"{case['server']}/{case['tool']}", "depth": depth, "head": span.head,
                   "card_tokens": len(span.tokens), "tail_tokens": len(tokens) - span.end}
            ref, _ = _reprefill(ctx, tokens, span.head)  # untimed: the first decode of the tail warms its pages
            row["floor_kl"] = _floor(ctx, tokens, span.head, ref)
            if calibrate:
                row["kl_by_head"] = {f"{h:g}": kl_divergence(ref, _spliced(ctx, splicer, tokens, span, h)[0])
                                     for h in HEAD_GRID}
                row["kl_by_tail"] = {f"{t:g}": kl_divergence(ref, _tail_repaired(ctx, splicer, tokens, span, t))
                                     for t in TAIL_GRID}
                row["kl_by_choice"] = _by_deviation(ctx, splicer, tokens, span, ref)
            else:
                paths = {"reprefill": lambda: _reprefill(ctx, tokens, span.head),
                         "splice": lambda: _spliced(ctx, splicer, tokens, span),
                         "alt": lambda: _spliced(ctx, splicer, tokens, span, ALT_HEAD)}
                order = [list(paths)[i] for i in rng.permutation(len(paths))]  # a random order per conversation
                timed = {name: paths[name]() for name in order}
                bare, _ = _spliced(ctx, splicer, tokens, span, 0.0)
                spl, alt = timed["splice"][0], timed["alt"][0]
                row.update(head_pct=splicer.repair.head_pct(span.head), order=order,
                           reprefill_ms=timed["reprefill"][1], splice_ms=timed["splice"][1], alt_ms=timed["alt"][1],
                           kl=kl_divergence(ref, spl), kl_alt=kl_divergence(ref, alt), kl_bare=kl_divergence(ref, bare),
                           top1_same=bool(int(np.argmax(ref)) == int(np.argmax(spl))))
                args = {}
                for name, cards, pct in (("reprefill", None, None), ("splice", splicer, None),
                                         ("alt", splicer, ALT_HEAD)):
                    ctx.seq_rm(WORK, span.head, -1)
                    a = generate_arguments(ctx, spec, case["query"], history, seq_id=WORK,
                                           cache=_Held(span.head, cards, pct), window_size=size)
                    args[name] = {"arguments": a.arguments, "valid": a.valid}
                row["arguments"] = args
                row["same_arguments"] = args["reprefill"] == args["splice"]
                row["same_arguments_alt"] = args["reprefill"] == args["alt"]
            ctx.seq_rm(WORK, -1, -1)
            rows.append(row)
    return rows


def _summarize(rows: list[dict], depths: list[int], n_boot: int, seed: int) -> dict:
    out = {}
    for depth in depths:
        sel = [r for r in rows if r["depth"] == depth]
        if not sel:
            continue
        same = sum(r["same_arguments"] for r in sel)
        floor = float(np.mean([r["floor_kl"] for r in sel]))
        kl = float(np.mean([r["kl"] for r in sel]))
        out[str(depth)] = {
            "n": len(sel),
            "head_median": float(np.median([r["head"] for r in sel])),
            "card_tokens_median": float(np.median([r["card_tokens"] for r in sel])),
            "head_pct": sorted({r["head_pct"] for r in sel}),
            "reprefill_ms": stats.median_ci([r["reprefill_ms"] for r in sel], n_boot, seed),
            "splice_ms": stats.median_ci([r["splice_ms"] for r in sel], n_boot, seed + 1),
            "speedup": stats.speedup_ci([r["reprefill_ms"] for r in sel], [r["splice_ms"] for r in sel], n_boot,
                                        seed + 2),
            "same_arguments": stats.wilson(same, len(sel)),
            "alt": {"head_pct": ALT_HEAD,
                    "splice_ms": stats.median_ci([r["alt_ms"] for r in sel], n_boot, seed + 3),
                    "speedup": stats.speedup_ci([r["reprefill_ms"] for r in sel], [r["alt_ms"] for r in sel], n_boot,
                                                seed + 4),
                    "same_arguments": stats.wilson(sum(r["same_arguments_alt"] for r in sel), len(sel)),
                    "kl_mean": float(np.mean([r["kl_alt"] for r in sel]))},
            "top1_same": stats.wilson(sum(r["top1_same"] for r in sel), len(sel)),
            "kl_mean": kl, "kl_bare_mean": float(np.mean([r["kl_bare"] for r in sel])),
            "floor_kl_mean": floor, "kl_over_floor": kl / floor if floor > 0 else math.inf,
        }
    deep = [r for r in rows if r["head"] >= 512]  # the product's window can reach it too
    out["targets"] = {
        "depth_ge_512": {
            "n": len(deep),
            # with a repair of 100 % nothing is spliced: the same arguments and the KL then hold trivially
            "spliced": any(r["head_pct"] < 100.0 for r in deep),
            "speedup_ge_2x": bool(deep) and stats.speedup_ci([r["reprefill_ms"] for r in deep],
                                                            [r["splice_ms"] for r in deep], n_boot, seed).value >= 2.0,
            "same_arguments_ge_98pct": bool(deep) and sum(r["same_arguments"] for r in deep) / len(deep) >= 0.98,
            "kl_le_2x_floor": bool(deep) and float(np.mean([r["kl"] for r in deep]))
            <= 2.0 * float(np.mean([r["floor_kl"] for r in deep])),
        }
    }
    return out
