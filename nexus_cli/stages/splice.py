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
import struct
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..config import SCHEDULE_K, SCHEDULE_M, SCHEDULE_R_BASE
from ..errors import FormatError, ModelError, UsageError

STATE_MAGIC = 0xAF143CD8  # llama_context io_magic at the head of every llama_state_seq_get_data blob
GGML_TYPE_F16 = 1

# --------------------------------------------------------------------------------- llama.cpp sequence-state blobs


@dataclass
class SeqState:
    """One parsed `llama_state_seq_get_data` blob (single stream, one sequence per cell, F16 K and V)."""

    seq_id: int
    pos: np.ndarray  # int32 [n_cells], in cell order
    v_trans: bool
    k: np.ndarray  # uint16 [n_layer, n_cells, row]
    v: np.ndarray  # uint16 [n_layer, n_cells, row] (v_trans False) or [n_layer, row, n_cells] (v_trans True)

    @property
    def n_cells(self) -> int:
        return int(self.pos.shape[0])

    @property
    def n_layer(self) -> int:
        return int(self.k.shape[0])


def parse_state_blob(blob: bytes | np.ndarray) -> SeqState:
    """Parse the blob of llama_state_seq_get_data (the layout of llama.cpp's llama_kv_cache::state_write at the
    vendored commit; written out in docs/splice.md). A NumPy reader, independent of libnexus, used by compile to
    extract a schema's cells and by the tests to check the native blob builder against llama.cpp's own blobs."""
    buf = memoryview(bytes(blob) if not isinstance(blob, (bytes, bytearray)) else blob)
    off = 0

    def take(fmt: str):
        nonlocal off
        size = struct.calcsize(fmt)
        if off + size > len(buf):
            raise FormatError(f"state blob truncated at byte {off} (needs {size} more)")
        vals = struct.unpack_from(fmt, buf, off)
        off += size
        return vals

    magic, seq_id, n_stream = take("<IiI")
    if magic != STATE_MAGIC:
        raise FormatError(f"state blob magic {magic:#x} != {STATE_MAGIC:#x}")
    if n_stream != 1:
        raise FormatError(f"state blob has {n_stream} streams; Nexus contexts use one (kv_unified)")
    (cell_count,) = take("<I")
    if cell_count == 0:
        empty = np.zeros((0, 0, 0), np.uint16)
        return SeqState(seq_id, np.zeros(0, np.int32), False, empty, empty)
    pos = np.empty(cell_count, np.int32)
    for i in range(cell_count):
        p, n_seq = take("<iI")
        take(f"<{n_seq}i")
        pos[i] = p
    v_trans, n_layer = take("<II")
    ks = []
    for il in range(n_layer):
        k_type, row_bytes = take("<iQ")
        if k_type != GGML_TYPE_F16:
            raise FormatError(f"layer {il}: K type {k_type} is not F16")
        n = cell_count * row_bytes
        if off + n > len(buf):
            raise FormatError("state blob truncated in the K rows")
        ks.append(np.frombuffer(buf, np.uint16, n // 2, off).reshape(cell_count, row_bytes // 2))
        off += n
    vs = []
    for il in range(n_layer):
        if not v_trans:
            v_type, row_bytes = take("<iQ")
            if v_type != GGML_TYPE_F16:
                raise FormatError(f"layer {il}: V type {v_type} is not F16")
            n = cell_count * row_bytes
            if off + n > len(buf):
                raise FormatError("state blob truncated in the V rows")
            vs.append(np.frombuffer(buf, np.uint16, n // 2, off).reshape(cell_count, row_bytes // 2))
        else:
            v_type, el, n_embd_v = take("<iII")
            if v_type != GGML_TYPE_F16 or el != 2:
                raise FormatError(f"layer {il}: V type {v_type} (element {el} bytes) is not F16")
            n = n_embd_v * cell_count * el
            if off + n > len(buf):
                raise FormatError("state blob truncated in the V columns")
            vs.append(np.frombuffer(buf, np.uint16, n // 2, off).reshape(n_embd_v, cell_count))
        off += n
    if off != len(buf):
        raise FormatError(f"state blob has {len(buf) - off} trailing bytes (a cell extension this reader lacks?)")
    return SeqState(seq_id, pos, bool(v_trans), np.stack(ks), np.stack(vs))


def build_state_blob(seq_id: int, positions: Sequence[int], k: np.ndarray, v: np.ndarray, v_trans: bool) -> bytes:
    """The inverse of parse_state_blob, in NumPy: a blob llama_state_seq_set_data accepts, each cell in one sequence.
    The reference the native `nexus_splice_build_blob` is checked against (tests/test_splice.py)."""
    k = np.asarray(k, np.uint16)
    v = np.asarray(v, np.uint16)
    n_layer, n_cells, row = k.shape
    parts = [struct.pack("<IiII", STATE_MAGIC, seq_id, 1, n_cells)]
    parts.append(b"".join(struct.pack("<iIi", int(p), 1, seq_id) for p in positions))
    parts.append(struct.pack("<II", 1 if v_trans else 0, n_layer))
    for il in range(n_layer):
        parts.append(struct.pack("<iQ", GGML_TYPE_F16, row * 2))
        parts.append(np.ascontiguousarray(k[il]).tobytes())
    for il in range(n_layer):
        if v_trans:
            parts.append(struct.pack("<iII", GGML_TYPE_F16, 2, v.shape[1]))
        else:
            parts.append(struct.pack("<iQ", GGML_TYPE_F16, v.shape[2] * 2))
        parts.append(np.ascontiguousarray(v[il]).tobytes())
    return b"".join(parts)


# ------------------------------------------------------------------------------------------- header vs live model


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


# --------------------------------------------------------------------------------------------- recompute schedule


@dataclass(frozen=True)
class Schedule:
    """Eq. (2): R = r_base for n_past <= m, then r_base + (n_past - m) / (m (k - 1)) * (100 - r_base), <= 100."""

    m: int = SCHEDULE_M
    r_base: float = SCHEDULE_R_BASE
    k: float = SCHEDULE_K

    def pct(self, n_past: int) -> float:
        from ..kernels import eff_pct

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


# ----------------------------------------------------------------------------------------------------- the engine


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
        self._checked: set[int] = set()
        self._bufs: dict[int, np.ndarray] = {}

    def check(self, block, source: str = "block") -> None:
        check_block(block.header, self.ctx.identity, self.ctx.v_layout, source)
        self._checked.add(id(block))

    def recompute_pct(self, n_past: int, recompute: float | None) -> float:
        return self.schedule.pct(n_past) if recompute is None else float(recompute)

    def _buffer(self, block) -> np.ndarray:
        buf = self._bufs.get(id(block))
        if buf is None:
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
        if id(block) not in self._checked:
            self.check(block)
        pct = self.recompute_pct(n_past, parse_recompute(recompute) if isinstance(recompute, str) else recompute)
        h = block.header
        S = int(h.n_tokens)
        then = list(then_tokens or [])
        if n_past < 0:
            raise UsageError(f"n_past must be >= 0, not {n_past}")
        if n_past + S + len(then) > ctx.n_ctx:
            raise ModelError(f"context too small: {n_past} + {S} block + {len(then)} tokens > n_ctx {ctx.n_ctx}")
        if ctx.seq_pos_max(self.live) != n_past - 1:
            raise ModelError(f"live sequence ends at position {ctx.seq_pos_max(self.live)}, not at n_past - 1 = {n_past - 1}")
        r = recompute_tokens(S, pct)
        buf = self._buffer(block)

        t0 = time.perf_counter()
        blob = block.splice_blob_into(buf, n_past, self.scratch)  # native: rotate K by n_past - m0, write cells
        t1 = time.perf_counter()
        ctx.state_seq_set(blob.view, self.scratch)
        ctx.seq_cp(self.scratch, self.live, n_past, n_past + S)
        ctx.seq_rm(self.scratch, -1, -1)
        t2 = time.perf_counter()
        logits = None
        if r > 0:
            start = n_past + S - r
            ctx.seq_rm(self.live, start, -1)
            toks = [int(t) for t in block.tokens[S - r:]] + then
            ctx.decode(toks, start, self.live)
            logits = ctx.logits()
        elif then:
            ctx.decode(then, n_past + S, self.live)
            logits = ctx.logits()
        t3 = time.perf_counter()
        return SpliceResult(
            n_past=n_past,
            n_tokens=S,
            R_pct=pct,
            recomputed_tokens=r,
            t_blob_ms=(t1 - t0) * 1e3,
            t_merge_ms=(t2 - t1) * 1e3,
            t_decode_ms=(t3 - t2) * 1e3,
            logits=logits,
        )


# ------------------------------------------------------------------------------------------------- fidelity run

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
    from .compile import prefix_tokens

    return prefix_tokens(model) + filler_tokens(model, depth)


def query_tokens(model, query: str | None = None) -> list[int]:
    """The user turn that follows the schema: close the system turn, ask, open the assistant turn (ChatML)."""
    text = query if query is not None else DEFAULT_QUERY
    return model.tokenize(f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                          add_special=False, parse_special=True)


def kl_top1(p_logits: np.ndarray, q_logits: np.ndarray) -> tuple[float, bool]:
    from ..adapters.llama import kl_divergence

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
    from ..adapters.llama import LlamaContext

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


def open_checked_block(path, verify: bool = True):
    """Open and validate a block file (format, checksums); a bad file becomes a FormatError naming it."""
    from pathlib import Path

    from ..atb import open_block
    from ..errors import NexusError

    p = Path(path)
    if not p.is_file():
        raise FormatError(f"block {p} does not exist")
    try:
        return open_block(str(p), verify=verify)
    except NexusError as e:
        msg = e.message if e.message.startswith(str(p)) or p.name in e.message else f"{p.name}: {e.message}"
        raise FormatError(msg, hint=e.hint) from None


def run_fidelity_cli(block, model_name: str, depth: int, flash_attn: bool, query: str | None = None,
                     recompute: float | None = None, schedule: Schedule | None = None, repeat: int = 3,
                     source: str = "block") -> FidelityReport:
    """`nexus splice`: load the model, refuse a block that does not match it, size a context, measure."""
    from ..adapters.llama import load_model

    model = load_model(model_name)
    v_layout = 0 if flash_attn else 1
    check_block(block.header, model.identity, v_layout, source)
    need = len(history_tokens(model, depth)) + int(block.header.n_tokens) + len(query_tokens(model, query)) + 8
    ctx = context_for(model, need, flash_attn)
    try:
        return run_fidelity(ctx, block, depth, query=query, recompute=recompute, schedule=schedule, repeat=repeat)
    finally:
        ctx.close()
