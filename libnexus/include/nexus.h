/*
 * nexus.h — the one C ABI of libnexus.
 *
 * Rules of this boundary:
 *  - Every function returns an int32 status (NEXUS_OK = 0) unless it is a pure getter documented otherwise.
 *  - No C++ exception ever crosses it: each entry point catches everything and stores a thread-local message,
 *    retrievable with nexus_last_error().
 *  - Callers own every buffer they pass in. libnexus never hands the caller memory to free, except opaque handles,
 *    which have a matching *_free / *_close function.
 *  - Integers are sized; all multi-byte file fields are little-endian.
 */
#ifndef NEXUS_H
#define NEXUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status codes */
#define NEXUS_OK 0
#define NEXUS_ERR_INVALID 1  /* bad argument: null pointer, out-of-range value, wrong size */
#define NEXUS_ERR_IO 2       /* open/read/write/rename/mmap failed (errno text in the message) */
#define NEXUS_ERR_FORMAT 3   /* a file is malformed: wrong magic, version, truncated, checksum, bad field */
#define NEXUS_ERR_NOMEM 4    /* allocation failed or arena exhausted */
#define NEXUS_ERR_INTERNAL 5 /* a caught exception that is not one of the above */

/* Message of the last failing call on this thread ("" if none). Valid until the next call on this thread. */
const char *nexus_last_error(void);
/* Library version string, e.g. "0.1.0". */
const char *nexus_version(void);

/* ---------------------------------------------------------------- SIMD dispatch */
#define NEXUS_SIMD_SCALAR 0
#define NEXUS_SIMD_AVX2 1
#define NEXUS_SIMD_AVX512 2      /* AVX-512F/BW (+F16C) */
#define NEXUS_SIMD_AVX512_VNNI 3 /* AVX-512 with VNNI */
#define NEXUS_SIMD_NEON 4

/* The level in use, chosen once at first use from CPUID, or forced to scalar when the environment variable
 * NEXUS_FORCE_SCALAR is set to a non-empty value other than "0" at the time of the first call. */
int32_t nexus_simd_level(void);
/* Human-readable name of a level ("scalar", "avx2", "avx512", "avx512_vnni", "neon"). */
const char *nexus_simd_name(int32_t level);
/* Override the level for this process (testing). Levels the CPU cannot run are refused with NEXUS_ERR_INVALID. */
int32_t nexus_simd_set_level(int32_t level);

/* ---------------------------------------------------------------- recompute schedule, eq. (2) */
/* R(n_past) in percent: r_base for n_past <= m; then r_base + (n_past - m) / (m (k - 1)) * (100 - r_base), clamped
 * to [r_base, 100]. Requires m > 0, k > 1, 0 <= r_base <= 100, n_past >= 0. */
int32_t nexus_eff_pct(int64_t n_past, int64_t m, double r_base, double k, double *out_pct);

/* ---------------------------------------------------------------- RoPE re-rotation of F16 K rows */
#define NEXUS_ROPE_NORM 0 /* adjacent pairs (x[2i], x[2i+1]); llama.cpp LLAMA_ROPE_TYPE_NORM */
#define NEXUS_ROPE_NEOX 2 /* half-split pairs (x[i], x[i + n_rot/2]); llama.cpp LLAMA_ROPE_TYPE_NEOX */

/* Rotate n_rows K rows, each n_heads * head_dim F16 values (row stride = n_heads * head_dim elements), by the angle
 * delta * freq_scale * freq_base^(-2i / n_rot) for pair i < n_rot/2 of every head. Dims >= n_rot are copied unchanged.
 * `in` and `out` may be the same buffer (in place). n_rot must be even and <= head_dim. */
int32_t nexus_rope_rotate_f16(const uint16_t *in, uint16_t *out, int64_t n_rows, int32_t n_heads, int32_t head_dim,
                              int32_t n_rot, int32_t rope_type, float freq_base, float freq_scale, int64_t delta);

/* ---------------------------------------------------------------- INT8 semantic lookaside buffer */
/* Per-vector symmetric quantization: scale[i] = max|x[i,:]| / 127 (1.0 for an all-zero row),
 * q[i,j] = clamp(round_half_away(x[i,j] / scale[i]), -127, 127). x is row-major [n, dim] float32. */
int32_t nexus_quantize_i8(const float *x, int64_t n, int32_t dim, int8_t *q_out, float *scales_out);

/* Exact int32 dot products of one query against n vectors: dots[i] = sum_j db[i,j] * query[j]. */
int32_t nexus_slb_dots(const int8_t *db, int64_t n, int32_t dim, const int8_t *query, int32_t *dots_out);

/* Top-k scan. score[i] = (float)dots[i] * db_scales[i] * query_scale (db_scales may be NULL: 1.0 each).
 * Returns min(k, n) results ordered by score descending, ties broken by the lower index.
 * Results are identical on every SIMD level (integer arithmetic, same float expression). */
int32_t nexus_slb_topk(const int8_t *db, const float *db_scales, int64_t n, int32_t dim, const int8_t *query,
                       float query_scale, int32_t k, int64_t *idx_out, float *score_out, int32_t *n_out);

/* Per-tool scores of a float32 query (quantized inside, as nexus_quantize_i8 does) over rows grouped by tool:
 * rows tool_offsets[t] .. tool_offsets[t+1]-1 belong to tool t (tool_offsets[0] = 0, tool_offsets[n_tools] = n,
 * non-decreasing). out[t] = max(lowest, the best score of tool t's rows), scores as in nexus_slb_topk; lowest is the
 * floor_k-th best row score when 0 < floor_k < n (all a top-floor_k scan knows of a tool it did not see), else base.
 * NaN scores never count. The router's whole dense step in one call. */
int32_t nexus_slb_tool_scores(const int8_t *db, const float *db_scales, int64_t n, int32_t dim, const float *query,
                              const int64_t *tool_offsets, int64_t n_tools, int32_t floor_k, float base,
                              float *out);

/* The two float32 norms per row that nexus_slb_topk_exact's error bound needs, from the float32 rows db_f32 [n, dim]
 * and their quantization (db, db_scales from nexus_quantize_i8): out[2i] = |scale_i * db_i| (the dequantized row),
 * out[2i+1] = |db_f32_i - scale_i * db_i| (its quantization residual), each rounded up to float32. */
int32_t nexus_slb_row_norms(const int8_t *db, const float *db_scales, const float *db_f32, int64_t n, int32_t dim,
                            float *out);

/* Exact top-k of a float32 query: the rows with the k largest float32 dot products db_f32[i] . query (summed in
 * float64), descending, ties to the lower index, equal to ranking the float32 vectors themselves. The INT8 scan
 * shortlists: its top k are rescored exactly, and every other row whose INT8 score plus a bound on its quantization
 * error (Cauchy-Schwarz over row_norms and the query's own residual) reaches their lowest exact score is rescored too.
 * score_out holds the exact scores rounded to float32; n_rescored_out (may be NULL) the number of rows rescored. */
int32_t nexus_slb_topk_exact(const int8_t *db, const float *db_scales, const float *db_f32, const float *row_norms,
                             int64_t n, int32_t dim, const float *query, int32_t k, int64_t *idx_out,
                             float *score_out, int32_t *n_out, int64_t *n_rescored_out);

/* Benchmark helper: run nexus_slb_topk n_reps times after n_warmup untimed runs, writing each run's wall time in
 * nanoseconds into ns_out[n_reps] (steady clock, measured inside the library: no FFI in the timing). */
int32_t nexus_slb_topk_timed(const int8_t *db, const float *db_scales, int64_t n, int32_t dim, const int8_t *query,
                             float query_scale, int32_t k, int32_t n_warmup, int32_t n_reps, double *ns_out);

/* A prepared SLB: fixed rows scanned many times. The rows are read where they lie (the caller keeps db, db_scales,
 * db_f32 and row_norms alive and unchanged until nexus_slb_free); on a CPU with AVX-512 VNNI the third scan also
 * copies them, once, into 64-row panels that one instruction reads 16 rows of at a time (docs/slb-format.md, "In
 * memory"). db_f32 and row_norms (nexus_slb_row_norms) are optional, both or neither: they enable
 * nexus_slb_scan_topk_exact. Scans of a prepared SLB return exactly what the unprepared calls return on the same
 * rows; a top-k scan of more than 16 MiB of rows is split over the CPU's cores (so is nexus_slb_topk's). A prepared
 * SLB may be scanned from several threads at once. */
typedef struct nexus_slb nexus_slb;
int32_t nexus_slb_create(const int8_t *db, const float *db_scales, const float *db_f32, const float *row_norms,
                         int64_t n, int32_t dim, nexus_slb **out);
void nexus_slb_free(nexus_slb *slb);
/* nexus_slb_topk on the prepared rows. */
int32_t nexus_slb_scan_topk(const nexus_slb *slb, const int8_t *query, float query_scale, int32_t k, int64_t *idx_out,
                            float *score_out, int32_t *n_out);
/* nexus_slb_topk_exact on the prepared rows (created with db_f32 and row_norms). */
int32_t nexus_slb_scan_topk_exact(const nexus_slb *slb, const float *query, int32_t k, int64_t *idx_out,
                                  float *score_out, int32_t *n_out, int64_t *n_rescored_out);
/* nexus_slb_tool_scores on the prepared rows. */
int32_t nexus_slb_scan_tool_scores(const nexus_slb *slb, const float *query, const int64_t *tool_offsets,
                                   int64_t n_tools, int32_t floor_k, float base, float *out);
/* The router's fused scores of one request over prepared rows grouped by tool (tool_offsets as in
 * nexus_slb_tool_scores): for each of its n_texts texts (queries [n_texts, dim] float32), the per-tool dense score
 * d (nexus_slb_tool_scores) plus, when lex_weight > 0, (lex_weight * b) / max(b) where b is the text's BM25 score
 * per tool (nothing is added where max(b) is not positive), in float64; out [n_tools] is their mean over the texts
 * (summed in text order, then divided). Two texts are scanned in one pass over the rows.
 * b of text t is the sum of the term scores of its tokens token_offsets[t] .. token_offsets[t+1]-1, added token by
 * token in that order: token j's postings are *tokens[j] (its `count` tools docs[0..], each in 0..n_tools-1, with
 * term scores terms[0..]), records and arrays the caller owns (its BM25 cache); tokens[j] NULL is a token no tool
 * holds. tokens and token_offsets may be NULL without lex_weight. */
typedef struct nexus_postings {
    const int64_t *docs;
    const double *terms;
    int64_t count;
} nexus_postings;
int32_t nexus_slb_scan_request(const nexus_slb *slb, const float *queries, int32_t n_texts, const int64_t *tool_offsets,
                               int64_t n_tools, int32_t floor_k, float base, const nexus_postings *const *tokens,
                               const int64_t *token_offsets, double lex_weight, double *out);
/* The per-request scans with their arguments in one record that the caller keeps and sets in place between calls:
 * the same calls, with one argument for an interpreter's foreign-function layer to convert instead of seven or
 * eleven (from Python that conversion costs more than a 250-row scan's top-k selection). */
typedef struct nexus_scan_topk_args {
    const nexus_slb *slb;
    const int8_t *query;
    float query_scale;
    int32_t k;
    int64_t *idx_out;
    float *score_out;
    int32_t *n_out;
} nexus_scan_topk_args;
int32_t nexus_slb_scan_topk_packed(const nexus_scan_topk_args *args);
typedef struct nexus_scan_topk_exact_args {
    const nexus_slb *slb;
    const float *query;
    int32_t k;
    int64_t *idx_out;
    float *score_out;
    int32_t *n_out;
    int64_t *n_rescored_out;
} nexus_scan_topk_exact_args;
int32_t nexus_slb_scan_topk_exact_packed(const nexus_scan_topk_exact_args *args);
typedef struct nexus_scan_request_args {
    const nexus_slb *slb;
    const float *queries;
    int32_t n_texts;
    int32_t floor_k;
    const int64_t *tool_offsets;
    int64_t n_tools;
    float base;
    const nexus_postings *const *tokens;
    const int64_t *token_offsets;
    double lex_weight;
    double *out;
} nexus_scan_request_args;
int32_t nexus_slb_scan_request_packed(const nexus_scan_request_args *args);
/* nexus_slb_topk_timed on the prepared rows. */
int32_t nexus_slb_scan_topk_timed(const nexus_slb *slb, const int8_t *query, float query_scale, int32_t k,
                                  int32_t n_warmup, int32_t n_reps, double *ns_out);

/* Benchmark helper: the two ceilings of a prepared SLB's scan on this CPU, each timed n_reps times after n_warmup
 * runs, in nanoseconds: read_ns_out[r] reads every byte the scan reads (its panels, or its rows where it has none),
 * 64 at a time, adding them up and nothing else; dots_ns_out[r] issues as many multiply-add instructions as the
 * scan does (one vpdpbusd per 64 bytes; 16 independent chains), on registers, with no memory read. A scan can be no
 * faster than either. Without AVX-512 VNNI on the active level both are 0 (nothing to compare). */
int32_t nexus_slb_floor_timed(const nexus_slb *slb, int32_t n_warmup, int32_t n_reps, double *read_ns_out,
                              double *dots_ns_out);

/* ---------------------------------------------------------------- the router's ranking */
/* The k best of n per-tool scores, descending (NaN last, ties to the lower index: a stable descending sort), into
 * order_out[min(k, n)], and the gate's margin: scores[top] minus the best score of a tool that is neither the top
 * one nor in its group (group_of[i] >= 0 names tool i's group of interchangeable copies, -1 none; group_of may be
 * NULL), or +inf when no such tool has a finite score (a NaN among them gives +inf too). */
int32_t nexus_rank_tools(const double *scores, int64_t n, int32_t k, const int32_t *group_of, int64_t *order_out,
                         int32_t *n_out, double *margin_out);
/* nexus_rank_tools with its arguments in one record (as nexus_slb_scan_request_packed). */
typedef struct nexus_rank_args {
    const double *scores;
    int64_t n;
    int32_t k;
    const int32_t *group_of;
    int64_t *order_out;
    int32_t *n_out;
    double *margin_out;
} nexus_rank_args;
int32_t nexus_rank_tools_packed(const nexus_rank_args *args);

/* ---------------------------------------------------------------- dense layer with float16 weights */

#define NEXUS_ACT_NONE 0
#define NEXUS_ACT_GELU 1 /* x * Phi(x), erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7), as BERT's GELU */

/* y[m, n] = act(x[m, k] @ W + bias): x float32 row-major; W float16 [k, n] in panels of 64 columns: panel p holds
 * columns 64p .. 64p+63 as k rows of 64 halves (row l at offset (p * k + l) * 64), the last panel padded with zeros, so
 * W takes ceil(n / 64) * k * 64 halves; bias float32 [n] or NULL; activation NEXUS_ACT_*; y float32 [m, n], not
 * aliasing x. Products are exact in float32; the order of the sums depends on the SIMD level, so results match a
 * float32 reference to rounding, not bit for bit. A large batch (m * k * n of 2^26 and more) is split by rows over
 * the CPU's threads, with the same bits as one thread's pass. */
int32_t nexus_linear_f16(const float *x, int64_t m, int32_t k, const uint16_t *w, int32_t n, const float *bias,
                         int32_t activation, float *y);

/* The layout nexus_linear_f16 reads, from PyTorch's: rows [n_rows, k] of a Linear weight (one output each, float16)
 * become columns col0 .. col0 + n_rows - 1 of W's panels [ceil(n_cols / 64), k, 64]. Only those columns are written:
 * the caller zeroes the panels once (the padding of the last one) and packs several layers side by side into them.
 * A blocked transpose: a request encoder's one-shot process packs its layers once, ~20 MB of halves. */
int32_t nexus_pack_f16_rows(const uint16_t *rows, int64_t n_rows, int32_t k, int64_t col0, int64_t n_cols,
                            uint16_t *panels);

/* y[m, n] = LayerNorm(x + residual) over each row: (v - mean) / sqrt(var + eps) * gamma + beta, mean and variance
 * accumulated in double. residual may be NULL; y may alias x. */
int32_t nexus_layer_norm(const float *x, const float *residual, int64_t m, int32_t n, const float *gamma,
                         const float *beta, float eps, float *y);

/* ---------------------------------------------------------------- radix trie over token-id sequences */
typedef struct nexus_trie nexus_trie;
int32_t nexus_trie_create(nexus_trie **out);
void nexus_trie_free(nexus_trie *trie);
/* Insert a non-empty sequence with a caller-chosen value (e.g. the tool index, >= 0). Re-inserting replaces it. */
int32_t nexus_trie_insert(nexus_trie *trie, const int32_t *tokens, int64_t n, int32_t value);
/* For a prefix (n may be 0): the distinct allowed next tokens in ascending order (at most cap written; *n_next is the
 * total count, so a caller can retry with a bigger buffer), and *terminal_value = the value of the sequence that ends
 * exactly at this prefix, or -1. A prefix that is in no sequence gives *n_next = 0, *terminal_value = -1 and
 * NEXUS_OK (the caller decides). */
int32_t nexus_trie_next(const nexus_trie *trie, const int32_t *prefix, int64_t n, int32_t *next_out, int64_t cap,
                        int64_t *n_next, int32_t *terminal_value);
int32_t nexus_trie_size(const nexus_trie *trie, int64_t *n_sequences, int64_t *n_nodes);

/* ---------------------------------------------------------------- block arena (buddy allocator of aligned slabs) */
typedef struct nexus_arena nexus_arena;
/* slab_bytes: power of two >= 128; n_slabs: power of two >= 1. Memory is 128-byte (cache-line pair) aligned. */
int32_t nexus_arena_create(int64_t slab_bytes, int64_t n_slabs, nexus_arena **out);
void nexus_arena_destroy(nexus_arena *arena);
/* Allocate at least n_bytes (rounded up to a power-of-two number of slabs). NEXUS_ERR_NOMEM when no block fits. */
int32_t nexus_arena_alloc(nexus_arena *arena, int64_t n_bytes, void **out);
/* Free a pointer returned by nexus_arena_alloc; a foreign or double-freed pointer is NEXUS_ERR_INVALID. */
int32_t nexus_arena_free(nexus_arena *arena, void *ptr);
int32_t nexus_arena_stats(const nexus_arena *arena, int64_t *used_slabs, int64_t *total_slabs, int64_t *n_allocs);

/* ---------------------------------------------------------------- .atb tool blocks (spec: docs/atb-format.md) */
#define NEXUS_ATB_MAGIC "NXATB\r\n\x1a" /* 8 bytes */
#define NEXUS_ATB_VERSION 1
#define NEXUS_ATB_HEADER_SIZE 128
#define NEXUS_ATB_DEFAULT_ALIGN 2097152
#define NEXUS_GGML_TYPE_F16 1
#define NEXUS_V_LAYOUT_ROWS 0       /* per layer [n_tokens][n_head_kv*head_dim] (flash attention on) */
#define NEXUS_V_LAYOUT_TRANSPOSED 1 /* per layer [n_head_kv*head_dim][n_tokens] (flash attention off) */

/* The 128-byte on-disk header, little-endian, no padding (static_assert'ed in the implementation). */
typedef struct nexus_atb_header {
    char magic[8];              /*   0 */
    uint16_t version;           /*   8 */
    uint16_t header_size;       /*  10 */
    uint32_t header_crc32;      /*  12: CRC-32 (zlib) of the 128 header bytes with this field zeroed */
    uint8_t fingerprint[16];    /*  16: model fingerprint (first 16 bytes of the GGUF file's sha256) */
    char arch[12];              /*  32: GGUF general.architecture, NUL-padded */
    uint32_t tokens_offset;     /*  44: byte offset of n_tokens int32 token ids */
    uint8_t rope_type;          /*  48: NEXUS_ROPE_NORM / NEXUS_ROPE_NEOX */
    uint8_t k_type;             /*  49: ggml type of K (1 = F16) */
    uint8_t v_type;             /*  50: ggml type of V (1 = F16) */
    uint8_t v_layout;           /*  51: NEXUS_V_LAYOUT_* */
    uint32_t n_rot;             /*  52: rotated dims per head */
    uint32_t n_layer;           /*  56 */
    uint32_t n_head_kv;         /*  60 */
    uint32_t head_dim;          /*  64 */
    float freq_base;            /*  68 */
    float freq_scale;           /*  72 */
    float yarn_ext_factor;      /*  76 */
    float yarn_attn_factor;     /*  80 */
    float yarn_beta_fast;       /*  84 */
    float yarn_beta_slow;       /*  88 */
    uint32_t n_ctx_orig;        /*  92 */
    uint32_t anchor_pos;        /*  96: compile anchor m0 (position of the first block token) */
    uint32_t n_tokens;          /* 100 */
    uint32_t payload_align;     /* 104: alignment of the K and V sections (power of two, >= 64) */
    uint32_t payload_crc32;     /* 108: CRC-32 of token bytes, then K bytes, then V bytes (padding excluded) */
    uint64_t k_offset;          /* 112 */
    uint64_t v_offset;          /* 120 */
} nexus_atb_header;

/* Write a block atomically (temp file in the same directory, fsync, rename). The caller fills the identity and
 * geometry fields (fingerprint, arch, rope_type, k_type, v_type, v_layout, n_rot, n_layer, n_head_kv, head_dim,
 * freq_*, yarn_*, n_ctx_orig, anchor_pos, n_tokens, payload_align (0 = default)); the writer fills magic, version,
 * header_size, offsets and both checksums, and returns the final header in *written (may be NULL).
 * k: n_layer * n_tokens * row F16 values, layer-major; v: the same count, each layer in v_layout order. */
int32_t nexus_atb_write(const char *path, const nexus_atb_header *header, const int32_t *tokens, const uint16_t *k,
                        const uint16_t *v, nexus_atb_header *written);

typedef struct nexus_atb nexus_atb;
/* Memory-map and validate a block: magic, version, header size, header CRC, every field's range, offsets and
 * sizes within the file, alignment, payload CRC (skipped when verify_payload == 0). Failure: NEXUS_ERR_FORMAT or
 * NEXUS_ERR_IO with a precise reason in nexus_last_error(). */
int32_t nexus_atb_open(const char *path, int32_t verify_payload, nexus_atb **out);
void nexus_atb_close(nexus_atb *atb);
int32_t nexus_atb_get_header(const nexus_atb *atb, nexus_atb_header *out);
/* Zero-copy views into the mapping, valid until nexus_atb_close. */
int32_t nexus_atb_tokens(const nexus_atb *atb, const int32_t **out);
int32_t nexus_atb_k(const nexus_atb *atb, const uint16_t **out); /* [n_layer][n_tokens][row] */
int32_t nexus_atb_v(const nexus_atb *atb, const uint16_t **out); /* [n_layer] x layout */

/* ---------------------------------------------------------------- splice blob (llama.cpp sequence state) */
/* Size in bytes of the llama.cpp sequence-state blob (format of llama_state_seq_get_data with one stream and one
 * sequence per cell, no M-RoPE cell extension; see ../shared/design/llama-state.md) that holds this block. */
int32_t nexus_splice_blob_size(const nexus_atb *atb, uint64_t *size_out);
/* Build that blob for destination sequence seq_id with cells at positions n_past .. n_past + n_tokens - 1: every K row
 * is re-rotated by delta = n_past - anchor_pos with the header's RoPE parameters (native kernel, straight into buf);
 * V is copied in the block's own layout (v_trans = v_layout). buf must hold nexus_splice_blob_size bytes. */
int32_t nexus_splice_build_blob(const nexus_atb *atb, int64_t n_past, int32_t seq_id, uint8_t *buf, uint64_t buf_size);

#ifdef __cplusplus
}
#endif
#endif /* NEXUS_H */
