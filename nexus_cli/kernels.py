"""NumPy-facing layer over libnexus: validates dtype, shape and contiguity, allocates outputs in NumPy and passes
pointers down. C never hands Python memory to free; opaque handles (Trie, Arena) are freed by close()/__del__.
"""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from . import _native
from .errors import NexusError, UsageError

__all__ = [
    "simd_level", "simd_level_id", "set_simd_level", "eff_pct", "rope_rotate_f16", "quantize_i8", "slb_dots",
    "native_dense_pays", "slb_topk", "slb_topk_timed", "SlbScanner", "SlbToolScorer", "LINEAR_PANEL", "pack_f16_panels", "LinearF16", "linear_f16", "layer_norm",
    "Trie", "Arena",
]


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _as(a, name: str, dtypes: tuple, ndim: int | None = None) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise UsageError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype not in dtypes:
        want = " or ".join(str(np.dtype(d)) for d in dtypes)
        raise UsageError(f"{name} must have dtype {want}, got {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise UsageError(f"{name} must be {ndim}-D, got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise UsageError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    return a


# ---------------------------------------------------------------- SIMD dispatch

def simd_level_id() -> int:
    return int(_native.lib().nexus_simd_level())


def simd_level() -> str:
    return _native.lib().nexus_simd_name(simd_level_id()).decode()


def native_dense_pays() -> bool:
    """Whether nexus_linear_f16 (one core) runs a request encoder's dense layers faster than NumPy's float32 BLAS
    (every core): on AVX-512, 6.9 against 12.1 ms a request (results/latency/latency-20261204T224538Z.json); on an
    AVX2-only CPU, 38.4 against 28.6 ms (results/avx2/latency/latency-20261205T070255Z.json); the other levels have
    only the scalar loop."""
    return simd_level_id() in (_native.SIMD_AVX512, _native.SIMD_AVX512_VNNI)


def set_simd_level(level: str | int) -> None:
    """Force a SIMD level for this process ('scalar', 'avx2', 'avx512', 'avx512_vnni', 'neon' or its id)."""
    if isinstance(level, str):
        ids = {v: k for k, v in _native.SIMD_NAMES.items()}
        if level not in ids:
            raise UsageError(f"unknown SIMD level {level!r} (one of {', '.join(ids)})")
        level = ids[level]
    _native.check(_native.lib().nexus_simd_set_level(int(level)))


# ---------------------------------------------------------------- eq. (2)

def eff_pct(n_past: int, m: int = 256, r_base: float = 5.0, k: float = 4.0) -> float:
    out = _native.out("f64")
    _native.check(_native.lib().nexus_eff_pct(int(n_past), int(m), float(r_base), float(k), _native.ref(out)))
    return out.value


# ---------------------------------------------------------------- RoPE

def rope_rotate_f16(k: np.ndarray, n_heads: int, head_dim: int, n_rot: int, rope_type: int, freq_base: float,
                    freq_scale: float, delta: int, out: np.ndarray | None = None) -> np.ndarray:
    """Rotate F16 K rows [n_rows, n_heads * head_dim] by delta positions. `out is k` rotates in place."""
    k = _as(k, "k", (np.dtype(np.uint16), np.dtype(np.float16)))
    if k.ndim == 1:
        k = k.reshape(1, -1)
    if k.ndim != 2 or k.shape[1] != n_heads * head_dim:
        raise UsageError(f"k must have shape (n_rows, {n_heads * head_dim}), got {k.shape}")
    if out is None:
        out = np.empty_like(k)
    else:
        out = _as(out, "out", (k.dtype,))
        if out.size != k.size:
            raise UsageError(f"out must have {k.size} elements, got {out.size}")
    _native.check(_native.lib().nexus_rope_rotate_f16(
        _ptr(k), _ptr(out), k.shape[0], int(n_heads), int(head_dim), int(n_rot), int(rope_type), float(freq_base),
        float(freq_scale), int(delta)))
    return out


# ---------------------------------------------------------------- INT8 SLB

def quantize_i8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric INT8 quantization of float32 [n, d]: (q int8 [n, d], scales float32 [n])."""
    x = _as(x, "x", (np.dtype(np.float32),), 2)
    n, d = x.shape
    q = np.empty((n, d), dtype=np.int8)
    scales = np.empty(n, dtype=np.float32)
    _native.check(_native.lib().nexus_quantize_i8(_ptr(x), n, d, _ptr(q), _ptr(scales)))
    return q, scales


def _check_db_query(db: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    db = _as(db, "db", (np.dtype(np.int8),), 2)
    query = _as(query, "query", (np.dtype(np.int8),), 1)
    if query.shape[0] != db.shape[1]:
        raise UsageError(f"query has {query.shape[0]} dims, db rows have {db.shape[1]}")
    return db, query


def _check_scales(db_scales, n: int):
    if db_scales is None:
        return None
    db_scales = _as(db_scales, "db_scales", (np.dtype(np.float32),), 1)
    if db_scales.shape[0] != n:
        raise UsageError(f"db_scales has {db_scales.shape[0]} entries, db has {n} rows")
    return db_scales


def slb_dots(db: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Exact int32 dot products of an int8 query against int8 rows."""
    db, query = _check_db_query(db, query)
    out = np.empty(db.shape[0], dtype=np.int32)
    _native.check(_native.lib().nexus_slb_dots(_ptr(db), db.shape[0], db.shape[1], _ptr(query), _ptr(out)))
    return out


def slb_topk(db: np.ndarray, db_scales: np.ndarray | None, query_q: np.ndarray, query_scale: float,
             k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k rows by score = dot * db_scale * query_scale, descending, ties to the lower index."""
    db, query_q = _check_db_query(db, query_q)
    db_scales = _check_scales(db_scales, db.shape[0])
    if k < 1:
        raise UsageError(f"k must be >= 1, got {k}")
    kk = min(int(k), db.shape[0])
    idx = np.empty(max(kk, 1), dtype=np.int64)
    scores = np.empty(max(kk, 1), dtype=np.float32)
    n_out = _native.out("i32")
    _native.check(_native.lib().nexus_slb_topk(
        _ptr(db), _ptr(db_scales) if db_scales is not None else None, db.shape[0], db.shape[1], _ptr(query_q),
        float(query_scale), kk if kk > 0 else 1, _ptr(idx), _ptr(scores), _native.ref(n_out)))
    return idx[: n_out.value], scores[: n_out.value]


def slb_topk_timed(db: np.ndarray, db_scales: np.ndarray | None, query_q: np.ndarray, query_scale: float, k: int,
                   n_warmup: int, n_reps: int) -> np.ndarray:
    """Per-run wall time (ns, float64 [n_reps]) of the native top-k scan, timed inside the library."""
    db, query_q = _check_db_query(db, query_q)
    db_scales = _check_scales(db_scales, db.shape[0])
    ns = np.empty(max(int(n_reps), 1), dtype=np.float64)
    _native.check(_native.lib().nexus_slb_topk_timed(
        _ptr(db), _ptr(db_scales) if db_scales is not None else None, db.shape[0], db.shape[1], _ptr(query_q),
        float(query_scale), int(k), int(n_warmup), int(n_reps), _ptr(ns)))
    return ns[: int(n_reps)]


class PreparedSlb:
    """A prepared SLB (nexus_slb_create) over fixed INT8 rows, optionally with their float32 originals and row norms
    (exact scans). It holds references to the arrays the native side reads, so they outlive the handle; on a CPU
    with AVX-512 VNNI the rows are also laid out once as panels. Scans return what the unprepared calls return."""

    def __init__(self, db: np.ndarray, db_scales: np.ndarray | None, db_f32: np.ndarray | None = None,
                 row_norms: np.ndarray | None = None):
        self._lib = _native.lib()
        self._h = None
        self._keep = (db, db_scales, db_f32, row_norms)
        h = _native.out("ptr")
        _native.check(self._lib.nexus_slb_create(
            _ptr(db), _ptr(db_scales) if db_scales is not None else None,
            _ptr(db_f32) if db_f32 is not None else None, _ptr(row_norms) if row_norms is not None else None,
            db.shape[0], db.shape[1], _native.ref(h)))
        self._h = h

    @property
    def handle(self):
        if not self._h:
            raise NexusError("the prepared SLB is closed")
        return self._h

    def close(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._lib.nexus_slb_free(h)

    def __del__(self):
        self.close()


class SlbExactScanner:
    """The exact top-k over fixed float32 rows (nexus_slb_topk_exact): the rows are quantized and their two error
    norms computed once, here; `topk(query_f32)` shortlists by the INT8 scan and decides by exact float32 dot
    products, so its answer is the float32 ranking's (ties to the lower index). `last_rescored` is how many rows the
    last call rescored exactly. Returned arrays are the scanner's own buffers, overwritten by the next call."""

    def __init__(self, db_f32: np.ndarray, k: int):
        self._f32 = _as(db_f32, "db_f32", (np.dtype(np.float32),), 2)
        if k < 1:
            raise UsageError(f"k must be >= 1, got {k}")
        self.n, self.dim = self._f32.shape
        self.db, self.scales = quantize_i8(self._f32)
        self.row_norms = np.empty((self.n, 2), dtype=np.float32)
        if self.n:
            _native.check(_native.lib().nexus_slb_row_norms(_ptr(self.db), _ptr(self.scales), _ptr(self._f32),
                                                            self.n, self.dim, _ptr(self.row_norms)))
        self.k = max(1, min(int(k), self.n))
        self.query = np.zeros(self.dim, dtype=np.float32)
        self._query_floats = memoryview(self.query)
        self._idx = np.empty(self.k, dtype=np.int64)
        self._scores = np.empty(self.k, dtype=np.float32)
        self._n_out = _native.c_i32(0)
        self._rescored = _native.c_i64(0)
        self._slb = PreparedSlb(self.db, self.scales, self._f32, self.row_norms)
        self._args = _native.ScanTopkExactArgs(  # one record: one argument to convert per call
            self._slb.handle.value, _ptr(self.query), self.k, _ptr(self._idx), _ptr(self._scores),
            _native.address(self._n_out), _native.address(self._rescored))
        self._status = _native.FastCall("nexus_slb_scan_topk_exact_packed", _native.ref(self._args)).status

    @property
    def last_rescored(self) -> int:
        return int(self._rescored.value)

    def topk(self, query_f32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        try:
            self._query_floats[:] = query_f32  # float32 of the right length: a plain copy, the cheapest
        except (TypeError, ValueError, NotImplementedError):
            try:  # another float type: converted, as before
                np.copyto(self.query, query_f32, casting="same_kind")
            except (TypeError, ValueError):
                raise UsageError(f"query must be a float array of {self.dim} values") from None
        if st := self._status():  # the bound call (FastCall.status): a status to check, 0 for success
            _native.check(st)
        if self.n:  # the scan writes min(k, n) results: self.k of them, unless there are no rows
            return self._idx, self._scores
        return self._idx[:0], self._scores[:0]


class SlbScanner:
    """A prepared top-k scan over a fixed database: validation and pointer conversion happen once, here.

    `topk(query_q, query_scale)` is the lean per-query path: the query is copied into a buffer the scanner owns
    (cheaper than taking a new array's address) and one ctypes call runs with pre-converted arguments. The returned
    arrays are the scanner's own buffers, overwritten by the next call: copy them to keep them.
    """

    def __init__(self, db: np.ndarray, db_scales: np.ndarray | None, k: int):
        db = _as(db, "db", (np.dtype(np.int8),), 2)
        self._db = db
        self._scales = _check_scales(db_scales, db.shape[0])
        if k < 1:
            raise UsageError(f"k must be >= 1, got {k}")
        self.n, self.dim = db.shape
        self.k = max(1, min(int(k), self.n))
        self.query = np.zeros(self.dim, dtype=np.int8)
        self._query_bytes = memoryview(self.query)
        self._idx = np.empty(self.k, dtype=np.int64)
        self._scores = np.empty(self.k, dtype=np.float32)
        self._n_out = _native.c_i32(0)
        self.prepared = PreparedSlb(db, self._scales)
        # the call's arguments in one record (nexus_slb_scan_topk_packed); the scale, the one that changes per call,
        # is set in it in place
        self._args = _native.ScanTopkArgs(self.prepared.handle.value, _ptr(self.query), 0.0, self.k, _ptr(self._idx),
                                          _ptr(self._scores), _native.address(self._n_out))
        self._status = _native.FastCall("nexus_slb_scan_topk_packed", _native.ref(self._args)).status

    def topk(self, query_q: np.ndarray, query_scale: float) -> tuple[np.ndarray, np.ndarray]:
        try:
            # a memoryview's slice assignment copies the bytes with less work than np.copyto, and as strictly: the
            # same format (int8) and length, or an error
            self._query_bytes[:] = query_q
        except (TypeError, ValueError, NotImplementedError):
            raise UsageError(f"query must be an int8 array of {self.dim} values") from None
        self._args.query_scale = query_scale
        if st := self._status():  # the bound call (FastCall.status): a status to check, 0 for success
            _native.check(st)
        if self.n:  # the scan writes min(k, n) results: self.k of them, unless there are no rows
            return self._idx, self._scores
        return self._idx[:0], self._scores[:0]


def slb_scan_topk_timed(scanner: "SlbScanner", query_q: np.ndarray, query_scale: float, n_warmup: int,
                        n_reps: int) -> np.ndarray:
    """Per-run wall times (ns) of the scanner's prepared top-k scan, timed inside libnexus (no FFI in the timing)."""
    q = np.ascontiguousarray(query_q, dtype=np.int8).reshape(-1)
    if q.size != scanner.dim:
        raise UsageError(f"query must be an int8 array of {scanner.dim} values")
    if n_reps < 1 or n_warmup < 0:
        raise UsageError("n_reps must be >= 1 and n_warmup >= 0")
    ns = np.empty(int(n_reps), dtype=np.float64)
    _native.check(_native.lib().nexus_slb_scan_topk_timed(scanner.prepared.handle, _ptr(q), float(query_scale),
                                                          scanner.k, int(n_warmup), int(n_reps), _ptr(ns)))
    return ns


def slb_floor_timed(scanner: "SlbScanner", n_warmup: int, n_reps: int) -> tuple[np.ndarray, np.ndarray]:
    """The two ceilings of the scanner's scan on this CPU, per run in ns (nexus_slb_floor_timed): reading the bytes
    it reads, and issuing its multiply-add instructions with no memory read. Zeros without AVX-512 VNNI."""
    if n_reps < 1 or n_warmup < 0:
        raise UsageError("n_reps must be >= 1 and n_warmup >= 0")
    read, dots = np.empty(int(n_reps), dtype=np.float64), np.empty(int(n_reps), dtype=np.float64)
    _native.check(_native.lib().nexus_slb_floor_timed(scanner.prepared.handle, int(n_warmup), int(n_reps),
                                                      _ptr(read), _ptr(dots)))
    return read, dots


def postings_record(docs: np.ndarray, terms: np.ndarray) -> np.ndarray:
    """One token's BM25 postings as nexus_slb_scan_request reads them (struct nexus_postings: the address of its
    tools, int64; of their term scores, float64; their count), as three uint64 words. The arrays must be contiguous
    and outlive the record (their owner keeps both: routing.lexical.BM25)."""
    if not (docs.dtype == np.int64 and terms.dtype == np.float64 and docs.ndim == terms.ndim == 1
            and docs.flags.c_contiguous and terms.flags.c_contiguous and docs.size == terms.size):
        raise UsageError("postings need contiguous int64 tools and float64 term scores of one length")
    return np.array([docs.ctypes.data, terms.ctypes.data, docs.size], dtype=np.uint64)


class SlbToolScorer:
    """Per-tool scores of float32 queries over a fixed database whose rows are grouped by tool
    (nexus_slb_tool_scores): the query is quantized, every row scored and each tool's best row kept, in one native
    call. `owners` [n] is each row's tool (non-decreasing); a tool with no row scores `base`. floor_k > 0 raises every
    tool to the floor_k-th best row score, as a top-floor_k scan would see it.

    `scores(query)` returns the scorer's own buffer, overwritten by the next call: copy it to keep it."""

    def __init__(self, db: np.ndarray, db_scales: np.ndarray | None, owners: np.ndarray, n_tools: int,
                 floor_k: int = 0, base: float = -1.0):
        db = _as(db, "db", (np.dtype(np.int8),), 2)
        self._db = db
        self._scales = _check_scales(db_scales, db.shape[0])
        owners = np.asarray(owners, dtype=np.int64)
        if owners.shape != (db.shape[0],):
            raise UsageError(f"owners has shape {owners.shape}, db has {db.shape[0]} rows")
        if n_tools < 1 or (owners.size and (owners.min() < 0 or owners.max() >= n_tools or np.any(np.diff(owners) < 0))):
            raise UsageError("owners must be tool indices in 0..n_tools-1, grouped by tool (non-decreasing)")
        if floor_k < 0:
            raise UsageError(f"floor_k must be >= 0, got {floor_k}")
        self.n, self.dim = db.shape
        self.n_tools = int(n_tools)
        self._offsets = np.searchsorted(owners, np.arange(self.n_tools + 1), side="left").astype(np.int64)
        self.query = np.zeros(self.dim, dtype=np.float32)
        self._out = np.empty(self.n_tools, dtype=np.float32)
        self._floor_k, self._base = int(floor_k), float(base)
        self._slb = PreparedSlb(db, self._scales)
        self._call = _native.FastCall(
            "nexus_slb_scan_tool_scores", self._slb.handle, _native.voidp(_ptr(self.query)),
            _native.voidp(_ptr(self._offsets)), _native.c_i64(self.n_tools), _native.c_i32(self._floor_k),
            _native.c_f32(self._base), _native.voidp(_ptr(self._out)))
        self._grow(2)  # a request is scored as one or two texts (scoring.request_texts)

    def _grow(self, n_texts: int, n_tokens: int = 64) -> None:
        """Buffers and the pre-converted call of the request scan for up to n_texts texts and n_tokens tokens."""
        self._queries = np.zeros((n_texts, self.dim), dtype=np.float32)
        self._query_rows = [self._queries[:n] for n in range(n_texts + 1)]  # views made once, not per request
        self._token_records = np.zeros(n_tokens, dtype=np.uint64)  # the address of each token's postings record
        # the same memory as ctypes cells: a list is stored into them faster than into the NumPy array
        self._token_record_cells = _native.u64_cells(self._token_records)
        self._token_offsets = np.zeros(n_texts + 1, dtype=np.int64)
        self._fused = np.empty(self.n_tools, dtype=np.float64)
        # the call's arguments in one record (nexus_slb_scan_request_packed); n_texts and lex_weight, the ones that
        # change per request, are set in it in place
        self._request_args = _native.ScanRequestArgs(
            self._slb.handle.value, _ptr(self._queries), 1, self._floor_k, _ptr(self._offsets), self.n_tools,
            self._base, _ptr(self._token_records), _ptr(self._token_offsets), 0.0, _ptr(self._fused))
        self._request_status = _native.FastCall("nexus_slb_scan_request_packed",
                                                _native.ref(self._request_args)).status

    def scores(self, query: np.ndarray) -> np.ndarray:
        try:
            np.copyto(self.query, query, casting="same_kind")
        except (TypeError, ValueError):
            raise UsageError(f"query must be a float array of {self.dim} values") from None
        self._call()
        return self._out

    def request(self, vectors: Sequence[np.ndarray], lexical: tuple | None = None,
                lex_weight: float = 0.0) -> np.ndarray:
        """The fused float64 scores of one request scored as several texts, in one native call
        (nexus_slb_scan_request): per text the dense per-tool score plus, with `lexical` and lex_weight > 0,
        lex_weight * BM25 / max(BM25), then the mean over the texts. lexical: (the address of each token's postings
        record, where each text's tokens end), as BM25.request_postings gives them: records (postings_record) whose
        arrays stay alive during the call (the native side checks every tool index it reads). Returns the scorer's
        own buffer, overwritten by the next call."""
        # this runs on every request: each check is one comparison, the copies go into buffers made once
        n = len(vectors)
        if n < 1:
            raise UsageError("a request needs at least one text")
        with_lex = lex_weight > 0
        if with_lex:
            if lexical is None or len(lexical) != 2 or len(lexical[1]) != n:
                raise UsageError("give the postings of each text")
            records, ends = lexical
            m = len(records)
            if ends[n - 1] != m:
                raise UsageError("the last text's tokens must end at the last postings record")
            if n >= len(self._query_rows) or m > self._token_records.size:
                self._grow(max(n, self._queries.shape[0]), max(m, self._token_records.size))
            self._token_record_cells[:m] = records
            offsets = self._token_offsets
            for t in range(n):  # one or two texts: item by item is cheaper than converting a list
                offsets[t + 1] = ends[t]
        elif n >= len(self._query_rows):
            self._grow(n, self._token_records.size)
        try:
            if type(vectors) is np.ndarray and vectors.ndim == 2:  # the texts' rows at once (one copy)
                np.copyto(self._query_rows[n], vectors, casting="same_kind")
            else:
                for t, v in enumerate(vectors):
                    np.copyto(self._queries[t], v, casting="same_kind")
        except (TypeError, ValueError):
            raise UsageError(f"each query must be a float array of {self.dim} values") from None
        args = self._request_args
        args.n_texts = n
        args.lex_weight = lex_weight if with_lex else 0.0
        if st := self._request_status():
            _native.check(st)
        return self._fused


class ToolRanker:
    """The router's ranking of per-tool scores (nexus_rank_tools): the k best tools (a stable descending sort's first
    k, NaN last) and the gate's margin against the best tool outside the top one's group of interchangeable copies
    (group_ids[i] >= 0, -1 none), in one native call with pre-converted arguments."""

    def __init__(self, group_ids: np.ndarray, k: int):
        self._groups = np.ascontiguousarray(group_ids, dtype=np.int32).reshape(-1)
        self.n = int(self._groups.size)
        if self.n < 1 or k < 1:
            raise UsageError("a ranking needs at least one tool and k >= 1")
        self.k = min(int(k), self.n)
        self.scores = np.zeros(self.n, dtype=np.float64)
        self._order = np.empty(self.k, dtype=np.int64)
        self._n_out = _native.c_i32(0)
        self._margin = _native.c_f64(0.0)
        self._args = _native.RankArgs(_ptr(self.scores), self.n, self.k, _ptr(self._groups), _ptr(self._order),
                                      _native.address(self._n_out), _native.address(self._margin))
        # one record: one argument to convert per call
        self._status = _native.FastCall("nexus_rank_tools_packed", _native.ref(self._args)).status

    def rank(self, scores: np.ndarray) -> tuple[np.ndarray, float]:
        """(the k best tools' indices, a new array; the margin)."""
        try:
            np.copyto(self.scores, scores, casting="same_kind")
        except (TypeError, ValueError):
            raise UsageError(f"scores must be a float array of {self.n} values") from None
        if st := self._status():  # the bound call (FastCall.status): a status to check, 0 for success
            _native.check(st)
        return self._order.copy(), self._margin.value  # k <= n, so the native call always fills all k


# ---------------------------------------------------------------- dense layer, float16 weights

LINEAR_PANEL = 64  # columns per panel of nexus_linear_f16's weight layout


def pack_f16_panels(w: np.ndarray) -> np.ndarray:
    """A dense layer's weight W [k, n] (input-major: the transpose of PyTorch's Linear weight) as nexus_linear_f16
    reads it: float16 panels of LINEAR_PANEL columns, [ceil(n / 64), k, 64], the last panel padded with zeros."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise UsageError(f"w must be 2-D, got shape {w.shape}")
    k, n = w.shape
    panels = -(-n // LINEAR_PANEL)
    padded = np.zeros((k, panels * LINEAR_PANEL), dtype=np.float16)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, panels, LINEAR_PANEL).transpose(1, 0, 2))


def pack_f16_panels_rows(weights: Sequence[np.ndarray]) -> np.ndarray:
    """pack_f16_panels of the layers `weights` side by side, each given as PyTorch's Linear weight [n_i, k] (output
    rows): libnexus writes the panels straight from those rows (nexus_pack_f16_rows, a blocked transpose), with no
    transposed or concatenated copy. Equal to pack_f16_panels(np.concatenate(weights).T), its NumPy reference."""
    weights = [np.asarray(w) for w in weights]
    if not weights or any(w.ndim != 2 or w.shape[1] != weights[0].shape[1] for w in weights):
        raise UsageError("weights must be 2-D arrays [n_i, k] with one k")
    k, n = weights[0].shape[1], sum(w.shape[0] for w in weights)
    out = np.zeros((-(-n // LINEAR_PANEL), k, LINEAR_PANEL), dtype=np.float16)
    fn = _native.lib().nexus_pack_f16_rows
    col = 0
    for w in weights:
        rows = np.ascontiguousarray(w, dtype=np.float16)
        _native.check(fn(_ptr(rows), rows.shape[0], k, col, n, _ptr(out)))
        col += rows.shape[0]
    return out


class LinearF16:
    """A dense layer y = act(x @ W + b) with W kept as float16 panels (pack_f16_panels): no float32 copy of W,
    converted in registers by nexus_linear_f16. act: None or "gelu" (BERT's erf GELU)."""

    ACTIVATIONS = {None: _native.ACT_NONE, "gelu": _native.ACT_GELU}

    def __init__(self, panels: np.ndarray, n: int, bias: np.ndarray | None = None, act: str | None = None):
        panels = _as(panels, "panels", (np.dtype(np.float16), np.dtype(np.uint16)), 3)
        if panels.shape[2] != LINEAR_PANEL or panels.shape[0] != -(-int(n) // LINEAR_PANEL):
            raise UsageError(f"panels of shape {panels.shape} do not hold {n} columns in panels of {LINEAR_PANEL}")
        if act not in self.ACTIVATIONS:
            raise UsageError(f"unknown activation {act!r} (none or gelu)")
        self.panels, self.k, self.n, self.act = panels, int(panels.shape[1]), int(n), self.ACTIVATIONS[act]
        self.bias = None
        if bias is not None:
            self.bias = _as(np.asarray(bias, dtype=np.float32), "bias", (np.dtype(np.float32),), 1)
            if self.bias.shape[0] != self.n:
                raise UsageError(f"bias has {self.bias.shape[0]} entries, the layer has {self.n} outputs")
        self._fn = _native.lib().nexus_linear_f16

    @classmethod
    def from_weight(cls, w: np.ndarray, bias: np.ndarray | None = None, act: str | None = None) -> "LinearF16":
        return cls(pack_f16_panels(w), w.shape[1], bias, act)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """float32 [..., k] -> float32 [..., n]."""
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim < 1 or x.shape[-1] != self.k:
            raise UsageError(f"x must be a float32 array of shape [..., {self.k}]")
        x2 = np.ascontiguousarray(x).reshape(-1, self.k)
        y = np.empty((x2.shape[0], self.n), dtype=np.float32)
        _native.check(self._fn(_ptr(x2), x2.shape[0], self.k, _ptr(self.panels), self.n,
                               _ptr(self.bias) if self.bias is not None else None, self.act, _ptr(y)))
        return y.reshape(*x.shape[:-1], self.n)


def linear_f16(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, act: str | None = None) -> np.ndarray:
    """act(x @ w + bias) for float32 x [..., k] and w [k, n] rounded to float16 (one-off calls; LinearF16 keeps the
    packed weight)."""
    return LinearF16.from_weight(w, bias, act)(x)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float,
               residual: np.ndarray | None = None) -> np.ndarray:
    """LayerNorm(x + residual) over the last axis, float32 (nexus_layer_norm)."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim < 1:
        raise UsageError("x must be a float32 numpy array")
    n = x.shape[-1]
    x2 = np.ascontiguousarray(x).reshape(-1, n)
    r2 = None
    if residual is not None:
        if not isinstance(residual, np.ndarray) or residual.shape != x.shape or residual.dtype != np.float32:
            raise UsageError(f"residual must be a float32 array of shape {x.shape}")
        r2 = np.ascontiguousarray(residual).reshape(-1, n)
    gamma = _as(gamma, "gamma", (np.dtype(np.float32),), 1)
    beta = _as(beta, "beta", (np.dtype(np.float32),), 1)
    if gamma.shape[0] != n or beta.shape[0] != n:
        raise UsageError(f"gamma and beta must have {n} entries")
    y = np.empty_like(x2)
    _native.check(_native.lib().nexus_layer_norm(_ptr(x2), _ptr(r2) if r2 is not None else None, x2.shape[0], n,
                                                 _ptr(gamma), _ptr(beta), float(eps), _ptr(y)))
    return y.reshape(x.shape)


# ---------------------------------------------------------------- trie

class Trie:
    """Token-id trie: insert(tokens, value); next(prefix) -> (sorted next tokens, terminal value or None)."""

    def __init__(self):
        self._lib = _native.lib()
        h = _native.out("ptr")
        _native.check(self._lib.nexus_trie_create(_native.ref(h)))
        self._h = h
        self._buf = np.empty(64, dtype=np.int32)
        self._mu = threading.Lock()  # insert mutates; next reuses a shared buffer

    def _handle(self):
        if not self._h:
            raise NexusError("trie is closed")
        return self._h

    @staticmethod
    def _tokens(tokens) -> np.ndarray:
        t = np.asarray(tokens)
        if t.dtype != np.int32:
            t = np.asarray(tokens, dtype=np.int64).reshape(-1)
            if t.size and (t.min() < -(2**31) or t.max() >= 2**31):
                raise UsageError("token ids must fit in int32")
            t = t.astype(np.int32)
        return np.ascontiguousarray(t.reshape(-1))

    def insert(self, tokens, value: int) -> None:
        t = self._tokens(tokens)
        with self._mu:
            _native.check(self._lib.nexus_trie_insert(self._handle(), _ptr(t) if t.size else None, t.size, int(value)))

    def next(self, prefix=()) -> tuple[list[int], int | None]:
        p = self._tokens(prefix)
        n_next = _native.out("i64")
        term = _native.out("i32")
        with self._mu:
            while True:
                _native.check(self._lib.nexus_trie_next(
                    self._handle(), _ptr(p) if p.size else None, p.size, _ptr(self._buf), self._buf.size,
                    _native.ref(n_next), _native.ref(term)))
                if n_next.value <= self._buf.size:
                    break
                self._buf = np.empty(int(n_next.value), dtype=np.int32)
            toks = self._buf[: n_next.value].tolist()
        return toks, (None if term.value < 0 else int(term.value))

    @property
    def size(self) -> int:
        """Number of distinct sequences stored."""
        return self.stats()[0]

    def stats(self) -> tuple[int, int]:
        n_seq, n_nodes = _native.out("i64"), _native.out("i64")
        _native.check(self._lib.nexus_trie_size(self._handle(), _native.ref(n_seq), _native.ref(n_nodes)))
        return int(n_seq.value), int(n_nodes.value)

    def __len__(self) -> int:
        return self.size

    def close(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._lib.nexus_trie_free(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


# ---------------------------------------------------------------- arena

class Arena:
    """Buddy allocator of 128-byte aligned slabs (thread-safe). alloc() returns an address (int)."""

    def __init__(self, slab_bytes: int, n_slabs: int):
        self._lib = _native.lib()
        h = _native.out("ptr")
        _native.check(self._lib.nexus_arena_create(int(slab_bytes), int(n_slabs), _native.ref(h)))
        self._h = h
        self.slab_bytes = int(slab_bytes)
        self.n_slabs = int(n_slabs)

    def _handle(self):
        if not self._h:
            raise NexusError("arena is closed")
        return self._h

    def alloc(self, n_bytes: int) -> int:
        p = _native.out("ptr")
        _native.check(self._lib.nexus_arena_alloc(self._handle(), int(n_bytes), _native.ref(p)))
        return int(p.value)

    def free(self, addr: int) -> None:
        _native.check(self._lib.nexus_arena_free(self._handle(), _native.voidp(int(addr))))

    def view(self, addr: int, n_bytes: int) -> np.ndarray:
        """A uint8 NumPy view of [addr, addr + n_bytes) (valid until that block is freed)."""
        return np.frombuffer(_native.bytes_at(int(addr), int(n_bytes)), dtype=np.uint8)

    def stats(self) -> dict:
        used, total, n = _native.out("i64"), _native.out("i64"), _native.out("i64")
        _native.check(self._lib.nexus_arena_stats(self._handle(), _native.ref(used), _native.ref(total),
                                                  _native.ref(n)))
        return {"used_slabs": used.value, "total_slabs": total.value, "n_allocs": n.value,
                "slab_bytes": self.slab_bytes}

    def close(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._lib.nexus_arena_destroy(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
