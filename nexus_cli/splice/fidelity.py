"""Fidelity of a splice against a full text prefill of the same tokens: KL of the next-token distributions, top-1
agreement, and the numerical floor (the same prefill split in two), with the timings of both paths. `nexus splice`
and the deep-splice benchmark measure with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..adapters.llama import LlamaContext, kl_divergence, load_model
from ..errors import ModelError
from .engine import Schedule, SpliceEngine, SpliceResult, check_block
from .render import prefix_tokens

FILLER_TEXT = (
    "Earlier in this conversation the user and the assistant talked about the following.\n"
    "User: I am moving our team's services from a single virtual machine to containers. Where should I start?\n"
    "Assistant: Start by listing what each service needs at run time: its configuration, the ports it listens on, "
    "the files it writes and the other services it calls. Then write one container image per service, keep the "
    "configuration outside the image, and run them side by side on the old machine before you switch traffic.\n"
    "User: The billing service writes invoices to a local folder. Is that a problem?\n"
    "Assistant: It is, because a container's file system disappears with the container. Mount a volume for that "
    "folder, or better, write the invoices to object storage and keep only a reference in the database.\n"
    "User: We also have a nightly job that cleans old sessions. How do we keep that?\n"
    "Assistant: Turn it into a scheduled task of the orchestrator, with the same image as the service and a "
    "different command. Log its start, its end and how many sessions it removed, so a silent failure is visible.\n"
    "User: Thanks. Last question for now: how do we roll back if the new setup misbehaves?\n"
    "Assistant: Keep the old machine running until the new one has carried real traffic for a week, tag every "
    "image with the commit it was built from, and make the switch a single configuration change you can revert.\n"
)
DEFAULT_QUERY = "Using the tool described above, what arguments would you pass for the task I just described?"


def filler_tokens(model, n: int) -> list[int]:
    """The first n tokens of the fixed filler conversation (repeated as often as needed)."""
    base = model.tokenize(FILLER_TEXT, add_special=False, parse_special=False)
    reps = n // len(base) + 1
    return (base * reps)[:n]


def history_tokens(model, depth: int) -> list[int]:
    """Compile prefix + `depth` filler tokens: n_past = m0 + depth, so depth 0 is the compile anchor."""
    return prefix_tokens(model) + filler_tokens(model, depth)


def query_tokens(model, query: str | None = None) -> list[int]:
    """The user turn that follows the schema: close the system turn, ask, open the assistant turn (ChatML)."""
    text = query if query is not None else DEFAULT_QUERY
    return model.tokenize(f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                          add_special=False, parse_special=True)


def kl_top1(p_logits: np.ndarray, q_logits: np.ndarray) -> tuple[float, bool]:

    return kl_divergence(p_logits, q_logits), int(np.argmax(p_logits)) == int(np.argmax(q_logits))


def prefill_path(ctx, n_past: int, schema: Sequence[int], query: Sequence[int], split: bool = False,
                 seq_id: int = 0) -> tuple[np.ndarray, float]:
    """The text path: decode schema + query after the history (one decode call, or two when split). The live
    sequence is first cut back to [0, n_past). Returns (logits, ms from the end of the history to the logits)."""
    ctx.seq_rm(seq_id, n_past, -1)
    t0 = time.perf_counter()
    if split:
        ctx.decode(schema, n_past, seq_id, logits_last=False)
        ctx.decode(query, n_past + len(schema), seq_id)
    else:
        ctx.decode(list(schema) + list(query), n_past, seq_id)
    logits = ctx.logits()
    return logits, (time.perf_counter() - t0) * 1e3


def splice_path(engine: SpliceEngine, block, n_past: int, query: Sequence[int],
                recompute: float | None) -> SpliceResult:
    engine.ctx.seq_rm(engine.live, n_past, -1)
    return engine.splice(block, n_past, recompute, then_tokens=query)


@dataclass
class FidelityReport:
    model: str
    depth: int
    n_past: int
    n_tokens: int
    n_query: int
    R_pct: float
    recomputed_tokens: int
    kl: float
    top1: bool
    floor_kl: float
    t_prefill_ms: float
    t_splice_ms: float
    splice_overhead_ms: float
    v_layout: int
    repeat: int
    t_prefill_all: list[float] = field(default_factory=list)
    t_splice_all: list[float] = field(default_factory=list)
    overhead_all: list[float] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.t_prefill_ms / self.t_splice_ms if self.t_splice_ms > 0 else float("inf")

    def to_json(self) -> dict:
        return {
            "n_past": self.n_past,
            "R_pct": round(self.R_pct, 4),
            "recomputed_tokens": self.recomputed_tokens,
            "kl": self.kl,
            "top1": self.top1,
            "floor_kl": self.floor_kl,
            "t_prefill_ms": round(self.t_prefill_ms, 3),
            "t_splice_ms": round(self.t_splice_ms, 3),
            "speedup": round(self.speedup, 3),
            "splice_overhead_ms": round(self.splice_overhead_ms, 4),
            "v_layout": self.v_layout,
            "model": self.model,
        }


def context_for(model, n_needed: int, flash_attn: bool, n_batch: int = 512):
    """A LlamaContext with room for n_needed positions (rounded up to 256) and two sequences."""

    n_ctx = max(256, ((n_needed + 255) // 256) * 256)
    return LlamaContext(model, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=2, flash_attn=flash_attn)


def run_fidelity(
    ctx,
    block,
    depth: int,
    query: str | None = None,
    recompute: float | None = None,
    schedule: Schedule | None = None,
    repeat: int = 3,
) -> FidelityReport:
    """One fidelity-and-latency measurement on `ctx` (which needs n_seq_max >= 2 and room for the whole prompt).

    History = compile prefix + `depth` filler tokens (decoded once); n_past = m0 + depth. Then, `repeat` times and
    interleaved, after one untimed warm-up round:
      reference: schema + query decoded as text in one call;
      split:     the same tokens in two calls (schema, then query): KL(reference || split) is the numerical floor;
      splice:    the block spliced at n_past, R % repaired, query decoded (repair + query fused).
    KL = D_KL(p_reference || p_splice) of the next-token distribution after the query; top-1 = argmax agreement.
    Times are medians; fidelity figures come from the last round (the computation is deterministic). repeat=0 runs
    a single untimed-warm-up-free round (for fidelity-only callers such as the tests)."""
    model = ctx.model
    engine = SpliceEngine(ctx, schedule=schedule)
    engine.check(block)
    h = block.header
    hist = history_tokens(model, depth)
    m0 = len(hist) - depth
    if m0 != int(h.anchor_pos):
        raise ModelError(f"the compile prefix is {m0} tokens with {model.name} but the block is anchored at "
                         f"{int(h.anchor_pos)}: it was compiled with another prefix")
    n_past = len(hist)
    schema = [int(t) for t in block.tokens]
    q = query_tokens(model, query)
    need = n_past + len(schema) + len(q)
    if need > ctx.n_ctx:
        raise ModelError(f"context too small for depth {depth}: {need} > n_ctx {ctx.n_ctx}")

    ctx.clear()
    ctx.decode(hist, 0, engine.live, logits_last=False)

    t_pre, t_spl, t_ovh = [], [], []
    ref = split = res = None
    rounds = repeat + 1 if repeat > 0 else 1  # repeat 0: one round, fidelity only (its times are cold)
    for i in range(rounds):
        ref, t_ref = prefill_path(ctx, n_past, schema, q, split=False, seq_id=engine.live)
        split, _ = prefill_path(ctx, n_past, schema, q, split=True, seq_id=engine.live)
        res = splice_path(engine, block, n_past, q, recompute)
        if i > 0 or rounds == 1:  # round 0 warms the compute graphs and the blob buffer
            t_pre.append(t_ref)
            t_spl.append(res.total_ms)
            t_ovh.append(res.overhead_ms)
    ctx.seq_rm(engine.live, n_past, -1)
    kl, top1 = kl_top1(ref, res.logits)
    floor, _ = kl_top1(ref, split)
    return FidelityReport(
        model=model.name,
        depth=depth,
        n_past=n_past,
        n_tokens=len(schema),
        n_query=len(q),
        R_pct=res.R_pct,
        recomputed_tokens=res.recomputed_tokens,
        kl=kl,
        top1=top1,
        floor_kl=floor,
        t_prefill_ms=float(np.median(t_pre)),
        t_splice_ms=float(np.median(t_spl)),
        splice_overhead_ms=float(np.median(t_ovh)),
        v_layout=ctx.v_layout,
        repeat=len(t_pre),
        t_prefill_all=t_pre,
        t_splice_all=t_spl,
        overhead_all=t_ovh,
    )


def run_fidelity_cli(block, model_name: str, depth: int, flash_attn: bool, query: str | None = None,
                     recompute: float | None = None, schedule: Schedule | None = None, repeat: int = 3,
                     source: str = "block") -> FidelityReport:
    """`nexus splice`: load the model, refuse a block that does not match it, size a context, measure."""

    model = load_model(model_name)
    v_layout = 0 if flash_attn else 1
    check_block(block.header, model.identity, v_layout, source)
    need = len(history_tokens(model, depth)) + int(block.header.n_tokens) + len(query_tokens(model, query)) + 8
    ctx = context_for(model, need, flash_attn)
    try:
        return run_fidelity(ctx, block, depth, query=query, recompute=recompute, schedule=schedule, repeat=repeat)
    finally:
        ctx.close()
