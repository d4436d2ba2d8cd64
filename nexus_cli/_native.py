"""The one module that loads libnexus and declares its C ABI (libnexus/include/nexus.h) for ctypes.

Nothing else in Nexus imports ctypes. The library is loaded lazily on first use (`lib()`), so importing this module
costs nothing and `nexus --help` stays fast. Every status is checked with `check()`, which raises `NativeError`
(or `NativeFormatError`, also a `FormatError`, for malformed files) carrying the library's own message.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from pathlib import Path

from .errors import FormatError, NativeError, NexusError

# ---------------------------------------------------------------- constants mirrored from nexus.h
OK = 0
ERR_INVALID = 1
ERR_IO = 2
ERR_FORMAT = 3
ERR_NOMEM = 4
ERR_INTERNAL = 5

SIMD_SCALAR = 0
SIMD_AVX2 = 1
SIMD_AVX512 = 2
SIMD_AVX512_VNNI = 3
SIMD_NEON = 4
SIMD_NAMES = {SIMD_SCALAR: "scalar", SIMD_AVX2: "avx2", SIMD_AVX512: "avx512", SIMD_AVX512_VNNI: "avx512_vnni",
              SIMD_NEON: "neon"}

ACT_NONE = 0
ACT_GELU = 1

ROPE_NORM = 0
ROPE_NEOX = 2

ATB_MAGIC = b"NXATB\r\n\x1a"
ATB_VERSION = 1
ATB_HEADER_SIZE = 128
ATB_DEFAULT_ALIGN = 2097152
GGML_TYPE_F16 = 1
V_LAYOUT_ROWS = 0
V_LAYOUT_TRANSPOSED = 1

REPO_ROOT = Path(__file__).resolve().parent.parent


class NativeFormatError(NativeError, FormatError):
    """NEXUS_ERR_FORMAT: a file is malformed (bad magic, version, checksum, field, truncation)."""


class AtbHeader(ctypes.Structure):
    """nexus_atb_header: the 128-byte on-disk header (little-endian, no padding)."""

    _pack_ = 1
    _fields_ = [
        ("magic", ctypes.c_char * 8),
        ("version", ctypes.c_uint16),
        ("header_size", ctypes.c_uint16),
        ("header_crc32", ctypes.c_uint32),
        ("fingerprint", ctypes.c_uint8 * 16),
        ("arch", ctypes.c_char * 12),
        ("tokens_offset", ctypes.c_uint32),
        ("rope_type", ctypes.c_uint8),
        ("k_type", ctypes.c_uint8),
        ("v_type", ctypes.c_uint8),
        ("v_layout", ctypes.c_uint8),
        ("n_rot", ctypes.c_uint32),
        ("n_layer", ctypes.c_uint32),
        ("n_head_kv", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32),
        ("freq_base", ctypes.c_float),
        ("freq_scale", ctypes.c_float),
        ("yarn_ext_factor", ctypes.c_float),
        ("yarn_attn_factor", ctypes.c_float),
        ("yarn_beta_fast", ctypes.c_float),
        ("yarn_beta_slow", ctypes.c_float),
        ("n_ctx_orig", ctypes.c_uint32),
        ("anchor_pos", ctypes.c_uint32),
        ("n_tokens", ctypes.c_uint32),
        ("payload_align", ctypes.c_uint32),
        ("payload_crc32", ctypes.c_uint32),
        ("k_offset", ctypes.c_uint64),
        ("v_offset", ctypes.c_uint64),
    ]


assert ctypes.sizeof(AtbHeader) == ATB_HEADER_SIZE


# The argument records of the packed per-request calls (nexus.h): natural C alignment, as the compiler lays them out.
class ScanTopkArgs(ctypes.Structure):
    """nexus_scan_topk_args."""

    _fields_ = [("slb", ctypes.c_void_p), ("query", ctypes.c_void_p), ("query_scale", ctypes.c_float),
                ("k", ctypes.c_int32), ("idx_out", ctypes.c_void_p), ("score_out", ctypes.c_void_p),
                ("n_out", ctypes.c_void_p)]


class ScanTopkExactArgs(ctypes.Structure):
    """nexus_scan_topk_exact_args."""

    _fields_ = [("slb", ctypes.c_void_p), ("query", ctypes.c_void_p), ("k", ctypes.c_int32),
                ("idx_out", ctypes.c_void_p), ("score_out", ctypes.c_void_p), ("n_out", ctypes.c_void_p),
                ("n_rescored_out", ctypes.c_void_p)]


class ScanRequestArgs(ctypes.Structure):
    """nexus_scan_request_args."""

    _fields_ = [("slb", ctypes.c_void_p), ("queries", ctypes.c_void_p), ("n_texts", ctypes.c_int32),
                ("floor_k", ctypes.c_int32), ("tool_offsets", ctypes.c_void_p), ("n_tools", ctypes.c_int64),
                ("base", ctypes.c_float), ("tokens", ctypes.c_void_p), ("token_offsets", ctypes.c_void_p),
                ("lex_weight", ctypes.c_double), ("out", ctypes.c_void_p)]


class RankArgs(ctypes.Structure):
    """nexus_rank_args."""

    _fields_ = [("scores", ctypes.c_void_p), ("n", ctypes.c_int64), ("k", ctypes.c_int32),
                ("group_of", ctypes.c_void_p), ("order_out", ctypes.c_void_p), ("n_out", ctypes.c_void_p),
                ("margin_out", ctypes.c_void_p)]

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def library_path() -> Path:
    env = os.environ.get("NEXUS_LIB")
    return Path(env) if env else REPO_ROOT / "build" / "libnexus.so"


def _declare(lib: ctypes.CDLL) -> None:
    i32, i64, u64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
    vp, cp, fl, db = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_float, ctypes.c_double
    P = ctypes.POINTER

    def sig(name, restype, *argtypes):
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = list(argtypes)

    # const char *nexus_last_error(void);
    sig("nexus_last_error", cp)
    # const char *nexus_version(void);
    sig("nexus_version", cp)
    # int32_t nexus_simd_level(void);
    sig("nexus_simd_level", i32)
    # const char *nexus_simd_name(int32_t level);
    sig("nexus_simd_name", cp, i32)
    # int32_t nexus_simd_set_level(int32_t level);
    sig("nexus_simd_set_level", i32, i32)
    # int32_t nexus_eff_pct(int64_t n_past, int64_t m, double r_base, double k, double *out_pct);
    sig("nexus_eff_pct", i32, i64, i64, db, db, P(db))
    # int32_t nexus_rope_rotate_f16(const uint16_t *in, uint16_t *out, int64_t n_rows, int32_t n_heads,
    #                               int32_t head_dim, int32_t n_rot, int32_t rope_type, float freq_base,
    #                               float freq_scale, int64_t delta);
    sig("nexus_rope_rotate_f16", i32, vp, vp, i64, i32, i32, i32, i32, fl, fl, i64)
    # int32_t nexus_quantize_i8(const float *x, int64_t n, int32_t dim, int8_t *q_out, float *scales_out);
    sig("nexus_quantize_i8", i32, vp, i64, i32, vp, vp)
    # int32_t nexus_slb_dots(const int8_t *db, int64_t n, int32_t dim, const int8_t *query, int32_t *dots_out);
    sig("nexus_slb_dots", i32, vp, i64, i32, vp, vp)
    # int32_t nexus_slb_topk(const int8_t *db, const float *db_scales, int64_t n, int32_t dim, const int8_t *query,
    #                        float query_scale, int32_t k, int64_t *idx_out, float *score_out, int32_t *n_out);
    sig("nexus_slb_topk", i32, vp, vp, i64, i32, vp, fl, i32, vp, vp, vp)
    # int32_t nexus_slb_tool_scores(const int8_t *db, const float *db_scales, int64_t n, int32_t dim,
    #                               const float *query, const int64_t *tool_offsets, int64_t n_tools, int32_t floor_k,
    #                               float base, float *out);
    sig("nexus_slb_tool_scores", i32, vp, vp, i64, i32, vp, vp, i64, i32, fl, vp)
    # int32_t nexus_slb_row_norms(const int8_t *db, const float *db_scales, const float *db_f32, int64_t n,
    #                             int32_t dim, float *out);
    sig("nexus_slb_row_norms", i32, vp, vp, vp, i64, i32, vp)
    # int32_t nexus_slb_topk_exact(const int8_t *db, const float *db_scales, const float *db_f32,
    #                              const float *row_norms, int64_t n, int32_t dim, const float *query, int32_t k,
    #                              int64_t *idx_out, float *score_out, int32_t *n_out, int64_t *n_rescored_out);
    sig("nexus_slb_topk_exact", i32, vp, vp, vp, vp, i64, i32, vp, i32, vp, vp, vp, vp)
    # int32_t nexus_slb_topk_timed(const int8_t *db, const float *db_scales, int64_t n, int32_t dim,
    #                              const int8_t *query, float query_scale, int32_t k, int32_t n_warmup,
    #                              int32_t n_reps, double *ns_out);
    sig("nexus_slb_topk_timed", i32, vp, vp, i64, i32, vp, fl, i32, i32, i32, vp)
    # int32_t nexus_slb_floor_timed(const nexus_slb *slb, int32_t n_warmup, int32_t n_reps, double *read_ns_out,
    #                               double *dots_ns_out)
    sig("nexus_slb_floor_timed", i32, vp, i32, i32, vp, vp)
    # int32_t nexus_linear_f16(const float *x, int64_t m, int32_t k, const uint16_t *w, int32_t n, const float *bias,
    #                          int32_t activation, float *y);
    sig("nexus_linear_f16", i32, vp, i64, i32, vp, i32, vp, i32, vp)
    # int32_t nexus_pack_f16_rows(const uint16_t *rows, int64_t n_rows, int32_t k, int64_t col0, int64_t n_cols,
    #                             uint16_t *panels)
    sig("nexus_pack_f16_rows", i32, vp, i64, i32, i64, i64, vp)
    # int32_t nexus_layer_norm(const float *x, const float *residual, int64_t m, int32_t n, const float *gamma,
    #                          const float *beta, float eps, float *y);
    sig("nexus_layer_norm", i32, vp, vp, i64, i32, vp, vp, fl, vp)
    # int32_t nexus_slb_create(const int8_t *db, const float *db_scales, const float *db_f32, const float *row_norms,
    #                          int64_t n, int32_t dim, nexus_slb **out);
    sig("nexus_slb_create", i32, vp, vp, vp, vp, i64, i32, P(vp))
    # void nexus_slb_free(nexus_slb *slb);
    sig("nexus_slb_free", None, vp)
    # int32_t nexus_slb_scan_topk(const nexus_slb *slb, const int8_t *query, float query_scale, int32_t k,
    #                             int64_t *idx_out, float *score_out, int32_t *n_out);
    sig("nexus_slb_scan_topk", i32, vp, vp, fl, i32, vp, vp, vp)
    # int32_t nexus_slb_scan_topk_exact(const nexus_slb *slb, const float *query, int32_t k, int64_t *idx_out,
    #                                   float *score_out, int32_t *n_out, int64_t *n_rescored_out);
    sig("nexus_slb_scan_topk_exact", i32, vp, vp, i32, vp, vp, vp, vp)
    # int32_t nexus_slb_scan_tool_scores(const nexus_slb *slb, const float *query, const int64_t *tool_offsets,
    #                                    int64_t n_tools, int32_t floor_k, float base, float *out);
    sig("nexus_slb_scan_tool_scores", i32, vp, vp, vp, i64, i32, fl, vp)
    # int32_t nexus_slb_scan_request(const nexus_slb *slb, const float *queries, int32_t n_texts,
    #                                const int64_t *tool_offsets, int64_t n_tools, int32_t floor_k, float base,
    #                                const nexus_postings *const *tokens, const int64_t *token_offsets,
    #                                double lex_weight, double *out);
    sig("nexus_slb_scan_request", i32, vp, vp, i32, vp, i64, i32, fl, vp, vp, db, vp)
    # int32_t nexus_slb_scan_topk_timed(const nexus_slb *slb, const int8_t *query, float query_scale, int32_t k,
    #                                   int32_t n_warmup, int32_t n_reps, double *ns_out);
    sig("nexus_slb_scan_topk_timed", i32, vp, vp, fl, i32, i32, i32, vp)
    # int32_t nexus_rank_tools(const double *scores, int64_t n, int32_t k, const int32_t *group_of,
    #                          int64_t *order_out, int32_t *n_out, double *margin_out);
    sig("nexus_rank_tools", i32, vp, i64, i32, vp, vp, P(i32), P(db))
    # int32_t nexus_slb_scan_topk_packed(const nexus_scan_topk_args *args); and the two below alike
    sig("nexus_slb_scan_topk_packed", i32, P(ScanTopkArgs))
    sig("nexus_slb_scan_topk_exact_packed", i32, P(ScanTopkExactArgs))
    sig("nexus_slb_scan_request_packed", i32, P(ScanRequestArgs))
    sig("nexus_rank_tools_packed", i32, P(RankArgs))
    # int32_t nexus_trie_create(nexus_trie **out);
    sig("nexus_trie_create", i32, P(vp))
    # void nexus_trie_free(nexus_trie *trie);
    sig("nexus_trie_free", None, vp)
    # int32_t nexus_trie_insert(nexus_trie *trie, const int32_t *tokens, int64_t n, int32_t value);
    sig("nexus_trie_insert", i32, vp, vp, i64, i32)
    # int32_t nexus_trie_next(const nexus_trie *trie, const int32_t *prefix, int64_t n, int32_t *next_out,
    #                         int64_t cap, int64_t *n_next, int32_t *terminal_value);
    sig("nexus_trie_next", i32, vp, vp, i64, vp, i64, P(i64), P(i32))
    # int32_t nexus_trie_size(const nexus_trie *trie, int64_t *n_sequences, int64_t *n_nodes);
    sig("nexus_trie_size", i32, vp, P(i64), P(i64))
    # int32_t nexus_arena_create(int64_t slab_bytes, int64_t n_slabs, nexus_arena **out);
    sig("nexus_arena_create", i32, i64, i64, P(vp))
    # void nexus_arena_destroy(nexus_arena *arena);
    sig("nexus_arena_destroy", None, vp)
    # int32_t nexus_arena_alloc(nexus_arena *arena, int64_t n_bytes, void **out);
    sig("nexus_arena_alloc", i32, vp, i64, P(vp))
    # int32_t nexus_arena_free(nexus_arena *arena, void *ptr);
    sig("nexus_arena_free", i32, vp, vp)
    # int32_t nexus_arena_stats(const nexus_arena *arena, int64_t *used_slabs, int64_t *total_slabs,
    #                           int64_t *n_allocs);
    sig("nexus_arena_stats", i32, vp, P(i64), P(i64), P(i64))
    # int32_t nexus_atb_write(const char *path, const nexus_atb_header *header, const int32_t *tokens,
    #                         const uint16_t *k, const uint16_t *v, nexus_atb_header *written);
    sig("nexus_atb_write", i32, cp, P(AtbHeader), vp, vp, vp, P(AtbHeader))
    # int32_t nexus_atb_open(const char *path, int32_t verify_payload, nexus_atb **out);
    sig("nexus_atb_open", i32, cp, i32, P(vp))
    # void nexus_atb_close(nexus_atb *atb);
    sig("nexus_atb_close", None, vp)
    # int32_t nexus_atb_get_header(const nexus_atb *atb, nexus_atb_header *out);
    sig("nexus_atb_get_header", i32, vp, P(AtbHeader))
    # int32_t nexus_atb_tokens(const nexus_atb *atb, const int32_t **out);
    sig("nexus_atb_tokens", i32, vp, P(vp))
    # int32_t nexus_atb_k(const nexus_atb *atb, const uint16_t **out);
    sig("nexus_atb_k", i32, vp, P(vp))
    # int32_t nexus_atb_v(const nexus_atb *atb, const uint16_t **out);
    sig("nexus_atb_v", i32, vp, P(vp))
    # int32_t nexus_splice_blob_size(const nexus_atb *atb, uint64_t *size_out);
    sig("nexus_splice_blob_size", i32, vp, P(u64))
    # int32_t nexus_splice_build_blob(const nexus_atb *atb, int64_t n_past, int32_t seq_id, uint8_t *buf,
    #                                 uint64_t buf_size);
    sig("nexus_splice_build_blob", i32, vp, i64, i32, vp, u64)


def lib() -> ctypes.CDLL:
    """The loaded library with every signature declared (loaded once, on first call)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not path.is_file():
                where = "$NEXUS_LIB" if os.environ.get("NEXUS_LIB") else "the build directory"
                raise NexusError(f"libnexus not found at {path} ({where})", hint="run `make native` to build it")
            try:
                loaded = ctypes.CDLL(str(path))
            except OSError as e:
                raise NexusError(f"cannot load libnexus from {path}: {e}", hint="run `make native` to rebuild it")
            _declare(loaded)
            _lib = loaded
    return _lib


def last_error() -> str:
    msg = lib().nexus_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status: int) -> None:
    """Raise the error that a non-zero status stands for, with the library's message."""
    if status == OK:
        return
    message = last_error()
    if status == ERR_FORMAT:
        raise NativeFormatError(status, message)
    raise NativeError(status, message)


def is_loaded() -> bool:
    return _lib is not None


# ---------------------------------------------------------------- helpers so that no other module needs ctypes

_OUT_TYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64, "f64": ctypes.c_double,
              "ptr": ctypes.c_void_p}


def out(kind: str):
    """A fresh out-parameter cell ('i32', 'i64', 'u64', 'f64', 'ptr'); pass ref(cell), read cell.value."""
    return _OUT_TYPES[kind]()


ref = ctypes.byref


def address(cell) -> int:
    """The address of a ctypes value (a cell a native call writes), for an argument record."""
    return ctypes.addressof(cell)


def voidp(addr: int):
    return ctypes.c_void_p(addr)


def bytes_at(addr: int, nbytes: int):
    """A writable ctypes byte array over [addr, addr + nbytes) (for np.frombuffer); it may carry attributes."""
    return (ctypes.c_uint8 * nbytes).from_address(addr)


def u64_cells(array):
    """ctypes uint64 cells over a writable uint64 NumPy array's memory (a Python list is stored into them faster)."""
    return (ctypes.c_uint64 * array.size).from_buffer(array)


def u8_pointer(addr: int):
    """A `uint8_t *` (ctypes POINTER(c_uint8)) at addr, the argument type of llama_state_seq_set_data."""
    return ctypes.cast(addr, ctypes.POINTER(ctypes.c_uint8))


def header_from_bytes(raw: bytes) -> AtbHeader:
    return AtbHeader.from_buffer_copy(raw)


class FastCall:
    """One libnexus function with every argument converted to a ctypes value once; a call passes them as they are.

    It goes through a separate function object without argtypes, which skips per-call conversion; the caller keeps
    the buffers the pointers name alive and writes its inputs into them (or into a ctypes cell it passed) in place.
    The lean per-call paths (kernels.SlbScanner, kernels.SlbToolScorer, `nexus bench slb`) use it."""

    def __init__(self, name: str, *args):
        self._fn = lib()[name]  # __getitem__ gives a new function object: its own (empty) argtypes
        self._fn.restype = ctypes.c_int32
        self._args = args
        # the bound call itself, for the hottest paths: returns the status, which the caller passes to check()
        self.status = functools.partial(self._fn, *args)

    def __call__(self) -> None:
        st = self._fn(*self._args)
        if st:
            check(st)


def c_i64(v: int):
    return ctypes.c_int64(v)


def c_i32(v: int):
    return ctypes.c_int32(v)


def c_f32(v: float):
    return ctypes.c_float(v)


def c_f64(v: float):
    return ctypes.c_double(v)
