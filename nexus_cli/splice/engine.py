"""The splice engine: place a compiled `.atb` block into a live llama.cpp sequence at any cursor, repair its seam, and
measure what that costs in fidelity and time (see docs/splice.md).

    engine = SpliceEngine(ctx)                       # ctx: adapters.llama.LlamaContext, n_seq_max >= 2
    engine.check(block)                              # header vs live model: refuses with the differing field
    res = engine.splice(block, n_past, recompute="auto", then_tokens=query)
    res.logits, res.overhead_ms, res.recomputed_tokens, ...

Splice at cursor n_past (the live sequence holds positions [0, n_past)):
  1. rotate + write: the native `nexus_splice_build_blob` rotates every K row of the block by delta = n_past - m0
     (RoPE, the block's own parameters, which `check` proved equal to the model's) and writes a llama.cpp
     sequence-state blob whose cells sit at n_past .. n_past+S-1 of a scratch sequence; V is copied as stored;
  2. merge: `llama_state_seq_set_data` restores that blob into the scratch sequence, `llama_memory_seq_cp` adds the
     cells to the live sequence (a unified cache shares cells, it copies nothing), `llama_memory_seq_rm` drops the
     scratch sequence's claim;
  3. repair: the last r = ceil(S * R / 100) cells are removed from the live sequence and their tokens decoded again
     (fused with the tokens that follow, e.g. the user turn, in one llama_decode), R = eff_pct(n_past) by default.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..atb import open_block
from ..config import SCHEDULE_K, SCHEDULE_M, SCHEDULE_R_BASE
from ..errors import FormatError, ModelError, NexusError, UsageError
from ..kernels import eff_pct
from .state import GGML_TYPE_F16


def _f32(x: float) -> float:
    return float(np.float32(x))


def check_block(header, identity, v_layout: int | None = None, source: str = "block") -> None:
    """Refuse a block that was not compiled for this model and context, naming the first field that differs.

    Checked: fingerprint, architecture, RoPE type, rotated dims, freq base and scale, YaRN parameters, original
    context, geometry (layers, KV heads, head dim), K/V element types (F16) and, when given, the V layout."""
    fp_block = bytes(header.fingerprint).hex()
    if fp_block != identity.fingerprint:
        raise ModelError(
            f"{source} was compiled for model fingerprint {fp_block[:12]}… but the live model "
            f"({identity.name}) is {identity.fingerprint[:12]}…",
            hint="compile the registry again with this model",
        )
    checks = [
        ("architecture", header.arch, identity.arch),
        ("rope type", int(header.rope_type), identity.rope_type),
        ("rope n_rot", int(header.n_rot), identity.n_rot),
        ("rope freq_base", _f32(header.freq_base), _f32(identity.freq_base)),
        ("rope freq_scale", _f32(header.freq_scale), _f32(identity.freq_scale)),
        ("yarn ext_factor", _f32(header.yarn_ext_factor), _f32(identity.yarn_ext_factor)),
        ("yarn attn_factor", _f32(header.yarn_attn_factor), _f32(identity.yarn_attn_factor)),
        ("yarn beta_fast", _f32(header.yarn_beta_fast), _f32(identity.yarn_beta_fast)),
        ("yarn beta_slow", _f32(header.yarn_beta_slow), _f32(identity.yarn_beta_slow)),
        ("n_ctx_orig", int(header.n_ctx_orig), identity.n_ctx_orig),
        ("n_layer", int(header.n_layer), identity.n_layer),
        ("n_head_kv", int(header.n_head_kv), identity.n_head_kv),
        ("head_dim", int(header.head_dim), identity.head_dim),
        ("K type", int(header.k_type), GGML_TYPE_F16),
        ("V type", int(header.v_type), GGML_TYPE_F16),
    ]
    for fname, got, want in checks:
        if got != want:
            raise ModelError(f"{fname} {got!r} in {source} != {want!r} of the model ({identity.name})",
                             hint="compile the registry again with this model")
    if _f32(identity.yarn_ext_factor) != 0.0 or _f32(identity.yarn_attn_factor) != 1.0:
        raise ModelError(
            f"model {identity.name} uses YaRN RoPE scaling (ext_factor {identity.yarn_ext_factor}, attn_factor "
            f"{identity.yarn_attn_factor}); the native re-rotation implements plain RoPE only",
        )
    if v_layout is not None and int(header.v_layout) != v_layout:
        names = {0: "row-major (flash attention on)", 1: "transposed (flash attention off)"}
        raise ModelError(
            f"V layout of {source} is {names.get(int(header.v_layout), header.v_layout)} but the context's is "
            f"{names.get(v_layout, v_layout)}",
            hint="splice with the --flash-attn setting the block was compiled with",
        )


@dataclass(frozen=True)
class Schedule:
    """Eq. (2): R = r_base for n_past <= m, then r_base + (n_past - m) / (m (k - 1)) * (100 - r_base), <= 100."""

    m: int = SCHEDULE_M
    r_base: float = SCHEDULE_R_BASE
    k: float = SCHEDULE_K

    def pct(self, n_past: int) -> float:

        return float(eff_pct(int(n_past), int(self.m), float(self.r_base), float(self.k)))


def parse_recompute(value: str | float | None) -> float | None:
    """"auto" (or None) -> None (use the schedule); "7.5" / "7.5%" / 7.5 -> 7.5 (a fixed percentage)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        pct = float(value)
    else:
        s = value.strip().lower()
        if s == "auto":
            return None
        try:
            pct = float(s.rstrip("%"))
        except ValueError:
            raise UsageError(f"--recompute must be 'auto' or a percentage in [0, 100], not '{value}'") from None
    if not (0.0 <= pct <= 100.0) or math.isnan(pct):
        raise UsageError(f"--recompute must be within [0, 100], not {pct}")
    return pct


def recompute_tokens(n_tokens: int, pct: float) -> int:
    """r = ceil(S * R / 100), computed so that float noise never adds a token (R = 5, S = 200 gives exactly 10)."""
    return min(n_tokens, max(0, math.ceil(round(n_tokens * pct / 100.0, 9))))


@dataclass
class SpliceResult:
    n_past: int
    n_tokens: int
    R_pct: float
    recomputed_tokens: int
    t_blob_ms: float  # native rotate + write of the blob
    t_merge_ms: float  # state_seq_set_data + seq_cp + seq_rm
    t_decode_ms: float  # repair (+ then_tokens) decode
    logits: np.ndarray | None = None

    @property
    def overhead_ms(self) -> float:
        """rotate + write + merge: the splice's own cost, decoding excluded."""
        return self.t_blob_ms + self.t_merge_ms

    @property
    def total_ms(self) -> float:
        return self.t_blob_ms + self.t_merge_ms + self.t_decode_ms


class SpliceEngine:
    """Splices blocks into `live_seq` of a LlamaContext, using `scratch_seq` as the landing sequence."""

    def __init__(self, ctx, live_seq: int = 0, scratch_seq: int = 1, schedule: Schedule | None = None):
        if ctx.n_seq_max <= max(live_seq, scratch_seq) or live_seq == scratch_seq:
            raise ModelError(f"the splice needs two sequence ids below n_seq_max ({ctx.n_seq_max})")
        self.ctx = ctx
        self.live = live_seq
        self.scratch = scratch_seq
        self.schedule = schedule or Schedule()
        self._bufs: dict[int, np.ndarray] = {}

    def check(self, block, source: str = "block") -> None:
        check_block(block.header, self.ctx.identity, self.ctx.v_layout, source)

    def recompute_pct(self, n_past: int, recompute: float | None) -> float:
        return self.schedule.pct(n_past) if recompute is None else float(recompute)

    def _buffer(self, block) -> np.ndarray:
        buf = self._bufs.get(id(block))
        if buf is None or buf.size != int(block.blob_size):  # an id can be reused by a later block
            buf = np.empty(int(block.blob_size), dtype=np.uint8)
            buf.fill(0)  # touch the pages now, not inside the timed path
            self._bufs[id(block)] = buf
        return buf

    def splice(
        self,
        block,
        n_past: int,
        recompute: float | str | None = "auto",
        then_tokens: Sequence[int] | None = None,
    ) -> SpliceResult:
        """Splice `block` at cursor n_past of the live sequence (which must hold exactly [0, n_past)), repair the
        seam, then decode `then_tokens` (fused with the repair into one decode). Returns timings and, when anything
        was decoded, the logits of the last token."""
        ctx = self.ctx
        pct = self.recompute_pct(n_past, parse_recompute(recompute) if isinstance(recompute, str) else recompute)
        h = block.header
        S = int(h.n_tokens)
        then = list(then_tokens or [])
        if n_past < 0:
            raise UsageError(f"n_past must be >= 0, not {n_past}")
        if n_past + S + len(then) > ctx.n_ctx:
            raise ModelError(f"context too small: {n_past} + {S} block + {len(then)} tokens > n_ctx {ctx.n_ctx}")
        placed = self.place(block, n_past, pct)
        r = placed.recomputed_tokens
        t2 = time.perf_counter()
        logits = None
        toks = [int(t) for t in block.tokens[S - r:]] + then
        if toks:
            ctx.decode(toks, n_past + S - r, self.live)
            logits = ctx.logits()
        placed.t_decode_ms = (time.perf_counter() - t2) * 1e3
        placed.logits = logits
        return placed

    def place(self, block, n_past: int, pct: float, head: int = 0) -> SpliceResult:
        """Steps 1 and 2 of a splice, and the first half of the repair: the block's cells land at n_past .. of the
        live sequence (which holds exactly [0, n_past)), then its last r = ceil(S * pct / 100) cells are removed
        again, so the sequence holds [0, n_past + S - r) and the caller decodes block.tokens[S - r:] (the repair)
        with whatever follows, in one decode of its own (arguments/cards.py fuses it with the rest of the prompt).
        Nothing is decoded here; t_decode_ms is 0.

        head > 0: the block's first `head` tokens were decoded by the caller after the live tokens (they attend to the
        conversation, as EPIC recomputes a block's first tokens), so the live sequence holds [0, n_past + head) and
        only the cells after them are copied in."""
        ctx = self.ctx
        self.check(block)  # every time: a few comparisons, and an id can be reused by a later block
        S = int(block.header.n_tokens)
        if n_past + S > ctx.n_ctx:
            raise ModelError(f"context too small: {n_past} + {S} block tokens > n_ctx {ctx.n_ctx}")
        if ctx.seq_pos_max(self.live) != n_past + head - 1:
            raise ModelError(f"live sequence ends at position {ctx.seq_pos_max(self.live)}, "
                             f"not at n_past + head - 1 = {n_past + head - 1}")
        r = min(recompute_tokens(S, pct), S - head)
        buf = self._buffer(block)
        t0 = time.perf_counter()
        blob = block.splice_blob_into(buf, n_past, self.scratch)  # native: rotate K by n_past - m0, write cells
        t1 = time.perf_counter()
        ctx.state_seq_set(blob.view, self.scratch)
        ctx.seq_cp(self.scratch, self.live, n_past + head, n_past + S - r)  # the repair's cells stay out
        ctx.seq_rm(self.scratch, -1, -1)
        t2 = time.perf_counter()
        return SpliceResult(n_past=n_past, n_tokens=S, R_pct=pct, recomputed_tokens=r,
                            t_blob_ms=(t1 - t0) * 1e3, t_merge_ms=(t2 - t1) * 1e3, t_decode_ms=0.0)


def open_checked_block(path, verify: bool = True):
    """Open and validate a block file (format, checksums); a bad file becomes a FormatError naming it."""


    p = Path(path)
    if not p.is_file():
        raise FormatError(f"block {p} does not exist")
    try:
        return open_block(str(p), verify=verify)
    except NexusError as e:
        msg = e.message if e.message.startswith(str(p)) or p.name in e.message else f"{p.name}: {e.message}"
        raise FormatError(msg, hint=e.hint) from None
