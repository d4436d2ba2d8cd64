// INT8 semantic lookaside buffer: symmetric quantization, exact int32 dot products and a top-k scan.
//
// Every SIMD path computes the same exact integer dots; scores are then formed by one shared scalar expression,
// ((float)dot * db_scale) * query_scale, so results are identical on every level.
#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

// GCC 12 reports its own _mm512_undefined_* idiom inside the intrinsic headers as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "common.hpp"
#include "kernels.hpp"
#include "simd.hpp"

namespace nexus {

namespace {

constexpr int32_t kMaxDim = 65536;  // keeps every |dot| (up to 128*128*dim) and the VNNI offset sum inside int32
constexpr int32_t kSmallK = 64;     // up to this k the selection is an insertion into a sorted stack buffer
constexpr int64_t kBlock = 256;     // rows whose dots are computed before they are scored (stack buffer)

void dots_scalar(const int8_t *db, int64_t n, int32_t dim, const int8_t *q, int32_t *out) {
    for (int64_t i = 0; i < n; ++i) {
        const int8_t *r = db + i * dim;
        int32_t acc = 0;
        for (int32_t j = 0; j < dim; ++j) acc += static_cast<int32_t>(r[j]) * static_cast<int32_t>(q[j]);
        out[i] = acc;
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) inline __m128i reduce4_avx2(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

__attribute__((target("avx2"))) inline int32_t reduce1_avx2(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    return _mm_cvtsi128_si32(s);
}

// AVX2: sign-extend to int16 and use vpmaddwd (exact; vpmaddubsw would saturate).
__attribute__((target("avx2"))) void dots_avx2(const int8_t *db, int64_t n, int32_t dim, const int8_t *q,
                                               int32_t *out) {
    const int32_t full = dim / 16 * 16;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const int8_t *r0 = db + i * dim, *r1 = r0 + dim, *r2 = r1 + dim, *r3 = r2 + dim;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        for (int32_t j = 0; j < full; j += 16) {
            const __m256i qv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(q + j)));
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_cvtepi8_epi16(
                                          _mm_loadu_si128(reinterpret_cast<const __m128i *>(r0 + j))), qv));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_cvtepi8_epi16(
                                          _mm_loadu_si128(reinterpret_cast<const __m128i *>(r1 + j))), qv));
            a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_cvtepi8_epi16(
                                          _mm_loadu_si128(reinterpret_cast<const __m128i *>(r2 + j))), qv));
            a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_cvtepi8_epi16(
                                          _mm_loadu_si128(reinterpret_cast<const __m128i *>(r3 + j))), qv));
        }
        alignas(16) int32_t s[4];
        _mm_store_si128(reinterpret_cast<__m128i *>(s), reduce4_avx2(a0, a1, a2, a3));
        for (int32_t j = full; j < dim; ++j) {
            s[0] += r0[j] * q[j];
            s[1] += r1[j] * q[j];
            s[2] += r2[j] * q[j];
            s[3] += r3[j] * q[j];
        }
        out[i] = s[0];
        out[i + 1] = s[1];
        out[i + 2] = s[2];
        out[i + 3] = s[3];
    }
    for (; i < n; ++i) {
        const int8_t *r = db + i * dim;
        __m256i a = _mm256_setzero_si256();
        for (int32_t j = 0; j < full; j += 16) {
            const __m256i qv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(q + j)));
            a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_cvtepi8_epi16(
                                        _mm_loadu_si128(reinterpret_cast<const __m128i *>(r + j))), qv));
        }
        int32_t s = reduce1_avx2(a);
        for (int32_t j = full; j < dim; ++j) s += r[j] * q[j];
        out[i] = s;
    }
}

#define NEXUS_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
#define NEXUS_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

NEXUS_AVX512_TARGET inline __m256i fold512(__m512i a) {
    return _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
}

// Eight 512-bit accumulators to one vector of their eight horizontal sums, in order.
NEXUS_AVX512_TARGET inline __m256i reduce8_avx512(const __m512i *a) {
    const __m256i y0 = fold512(a[0]), y1 = fold512(a[1]), y2 = fold512(a[2]), y3 = fold512(a[3]);
    const __m256i y4 = fold512(a[4]), y5 = fold512(a[5]), y6 = fold512(a[6]), y7 = fold512(a[7]);
    const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(y0, y1), _mm256_hadd_epi32(y2, y3));
    const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(y4, y5), _mm256_hadd_epi32(y6, y7));
    return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q0, q1, 0x31));
}

// AVX-512BW without VNNI: 32 int8 at a time sign-extended to int16, vpmaddwd; tails by masked (zeroing) loads.
NEXUS_AVX512_TARGET void dots_avx512(const int8_t *db, int64_t n, int32_t dim, const int8_t *q, int32_t *out) {
    const int32_t full = dim / 32 * 32;
    const int32_t rem = dim - full;
    const __mmask32 tail = rem ? static_cast<__mmask32>((1ull << rem) - 1) : 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const int8_t *r = db + i * dim;
        __m512i acc[8];
        for (int k = 0; k < 8; ++k) acc[k] = _mm512_setzero_si512();
        for (int32_t j = 0; j < full; j += 32) {
            const __m512i qv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + j)));
            for (int k = 0; k < 8; ++k) {
                const __m512i dv =
                    _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(r + k * dim + j)));
                acc[k] = _mm512_add_epi32(acc[k], _mm512_madd_epi16(dv, qv));
            }
        }
        if (rem) {
            const __m512i qv = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(tail, q + full));
            for (int k = 0; k < 8; ++k) {
                const __m512i dv = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(tail, r + k * dim + full));
                acc[k] = _mm512_add_epi32(acc[k], _mm512_madd_epi16(dv, qv));
            }
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i), reduce8_avx512(acc));
    }
    for (; i < n; ++i) {
        const int8_t *r = db + i * dim;
        __m512i acc = _mm512_setzero_si512();
        for (int32_t j = 0; j < full; j += 32) {
            const __m512i qv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + j)));
            const __m512i dv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(r + j)));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(dv, qv));
        }
        if (rem) {
            const __m512i qv = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(tail, q + full));
            const __m512i dv = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(tail, r + full));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(dv, qv));
        }
        out[i] = _mm512_reduce_add_epi32(acc);
    }
}

// AVX-512 VNNI: vpdpbusd multiplies unsigned by signed bytes. The db byte goes in the unsigned slot as db ^ 0x80 =
// db + 128, so each accumulator holds dot + 128 * sum(query); that offset is a per-query constant removed at the
// end. No saturation anywhere (vpdpbusd, not vpdpbusds), so the dots are exact.
NEXUS_VNNI_TARGET void dots_vnni(const int8_t *db, int64_t n, int32_t dim, const int8_t *q, int32_t *out) {
    const int32_t full = dim / 64 * 64;
    const int32_t rem = dim - full;
    const __mmask64 tail = rem ? ((1ull << rem) - 1) : 0;
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    int32_t qsum = 0;
    for (int32_t j = 0; j < dim; ++j) qsum += q[j];
    const int32_t corr = 128 * qsum;  // |corr| <= 2^30
    const __m256i corr8 = _mm256_set1_epi32(corr);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const int8_t *r = db + i * dim;
        __m512i acc[8];
        for (int k = 0; k < 8; ++k) acc[k] = _mm512_setzero_si512();
        for (int32_t j = 0; j < full; j += 64) {
            const __m512i qv = _mm512_loadu_si512(q + j);
            for (int k = 0; k < 8; ++k)
                acc[k] = _mm512_dpbusd_epi32(acc[k], _mm512_xor_si512(_mm512_loadu_si512(r + k * dim + j), flip), qv);
        }
        if (rem) {
            // masked-off db bytes become 0x80 = 128 after the flip, but meet query bytes that are 0
            const __m512i qv = _mm512_maskz_loadu_epi8(tail, q + full);
            for (int k = 0; k < 8; ++k)
                acc[k] = _mm512_dpbusd_epi32(
                    acc[k], _mm512_xor_si512(_mm512_maskz_loadu_epi8(tail, r + k * dim + full), flip), qv);
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i), _mm256_sub_epi32(reduce8_avx512(acc), corr8));
    }
    for (; i < n; ++i) {
        const int8_t *r = db + i * dim;
        __m512i acc = _mm512_setzero_si512();
        for (int32_t j = 0; j < full; j += 64)
            acc = _mm512_dpbusd_epi32(acc, _mm512_xor_si512(_mm512_loadu_si512(r + j), flip),
                                      _mm512_loadu_si512(q + j));
        if (rem)
            acc = _mm512_dpbusd_epi32(acc, _mm512_xor_si512(_mm512_maskz_loadu_epi8(tail, r + full), flip),
                                      _mm512_maskz_loadu_epi8(tail, q + full));
        out[i] = static_cast<int32_t>(static_cast<uint32_t>(_mm512_reduce_add_epi32(acc)) -
                                      static_cast<uint32_t>(corr));
    }
}
#endif

#if defined(__aarch64__)
void dots_neon(const int8_t *db, int64_t n, int32_t dim, const int8_t *q, int32_t *out) {
    const int32_t full = dim / 16 * 16;
    for (int64_t i = 0; i < n; ++i) {
        const int8_t *r = db + i * dim;
        int32x4_t acc = vdupq_n_s32(0);
        for (int32_t j = 0; j < full; j += 16) {
            const int8x16_t a = vld1q_s8(r + j);
            const int8x16_t b = vld1q_s8(q + j);
            acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
            acc = vpadalq_s16(acc, vmull_high_s8(a, b));
        }
        int32_t s = vaddvq_s32(acc);
        for (int32_t j = full; j < dim; ++j) s += r[j] * q[j];
        out[i] = s;
    }
}
#endif

void check_dims(int64_t n, int32_t dim) {
    if (n < 0) invalid("n must be >= 0, got " + std::to_string(n));
    if (dim < 1 || dim > kMaxDim) invalid("dim must be in 1.." + std::to_string(kMaxDim) + ", got " + std::to_string(dim));
}

struct Hit {
    float key;  // the score, with NaN ranked as -inf
    float score;
    int64_t idx;
};

inline bool better(const Hit &a, const Hit &b) { return a.key > b.key || (a.key == b.key && a.idx < b.idx); }

// Insert h into top[0..cnt), kept best first; rows arrive in index order, so an equal key stays behind the earlier
// row. Once cnt == k the last entry drops out (callers insert only a key above it).
inline void insert_sorted(Hit *top, int32_t &cnt, int32_t k, const Hit &h) {
    int32_t pos = cnt < k ? cnt++ : k - 1;
    while (pos > 0 && h.key > top[pos - 1].key) {
        top[pos] = top[pos - 1];
        --pos;
    }
    top[pos] = h;
}

// scores[j] = ((float)dots[j] * scale[j]) * qs: one expression on every path (vector int->float conversion and
// multiplies round exactly like the scalar ones), so the ranking cannot depend on the SIMD level.
void score_scalar(const int32_t *dots, const float *scales, float qs, int64_t m, float *out) {
    for (int64_t j = 0; j < m; ++j) out[j] = static_cast<float>(dots[j]) * (scales ? scales[j] : 1.0f) * qs;
}

// First j in [from, m) with s[j] > thr (an ordered compare: NaN never qualifies), or m.
int64_t next_above_scalar(const float *s, int64_t from, int64_t m, float thr) {
    for (int64_t j = from; j < m; ++j)
        if (s[j] > thr) return j;
    return m;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void score_avx2(const int32_t *dots, const float *scales, float qs, int64_t m,
                                                 float *out) {
    const __m256 q = _mm256_set1_ps(qs), one = _mm256_set1_ps(1.0f);
    int64_t j = 0;
    for (; j + 8 <= m; j += 8) {
        const __m256 d = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(dots + j)));
        const __m256 sc = scales ? _mm256_loadu_ps(scales + j) : one;
        _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_mul_ps(d, sc), q));
    }
    score_scalar(dots + j, scales ? scales + j : nullptr, qs, m - j, out + j);
}

__attribute__((target("avx2"))) int64_t next_above_avx2(const float *s, int64_t from, int64_t m, float thr) {
    const __m256 t = _mm256_set1_ps(thr);
    int64_t j = from;
    for (; j + 8 <= m; j += 8) {
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + j), t, _CMP_GT_OQ));
        if (mask) return j + __builtin_ctz(static_cast<unsigned>(mask));
    }
    return next_above_scalar(s, j, m, thr);
}

NEXUS_AVX512_TARGET void score_avx512(const int32_t *dots, const float *scales, float qs, int64_t m, float *out) {
    const __m512 q = _mm512_set1_ps(qs), one = _mm512_set1_ps(1.0f);
    int64_t j = 0;
    for (; j + 16 <= m; j += 16) {
        const __m512 d = _mm512_cvtepi32_ps(_mm512_loadu_si512(dots + j));
        const __m512 sc = scales ? _mm512_loadu_ps(scales + j) : one;
        _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_mul_ps(d, sc), q));
    }
    score_scalar(dots + j, scales ? scales + j : nullptr, qs, m - j, out + j);
}

NEXUS_AVX512_TARGET int64_t next_above_avx512(const float *s, int64_t from, int64_t m, float thr) {
    const __m512 t = _mm512_set1_ps(thr);
    int64_t j = from;
    for (; j + 16 <= m; j += 16) {
        const __mmask16 mask = _mm512_cmp_ps_mask(_mm512_loadu_ps(s + j), t, _CMP_GT_OQ);
        if (mask) return j + __builtin_ctz(static_cast<unsigned>(mask));
    }
    return next_above_scalar(s, j, m, thr);
}
#endif

void score_block(const int32_t *dots, const float *scales, float qs, int64_t m, float *out, int32_t level) {
#if defined(__x86_64__)
    if (level == NEXUS_SIMD_AVX512 || level == NEXUS_SIMD_AVX512_VNNI) return score_avx512(dots, scales, qs, m, out);
    if (level == NEXUS_SIMD_AVX2) return score_avx2(dots, scales, qs, m, out);
#endif
    score_scalar(dots, scales, qs, m, out);
}

int64_t next_above(const float *s, int64_t from, int64_t m, float thr, int32_t level) {
#if defined(__x86_64__)
    if (level == NEXUS_SIMD_AVX512 || level == NEXUS_SIMD_AVX512_VNNI) return next_above_avx512(s, from, m, thr);
    if (level == NEXUS_SIMD_AVX2) return next_above_avx2(s, from, m, thr);
#endif
    return next_above_scalar(s, from, m, thr);
}

// Top-k (k <= kSmallK) of rows [begin, end) into top[0..cnt), best first.
void topk_small(const int8_t *db, const float *db_scales, int64_t begin, int64_t end, int32_t dim, const int8_t *q,
                float query_scale, int32_t k, Hit *top, int32_t *cnt_out, int32_t level) {
    alignas(64) int32_t dots[kBlock];
    alignas(64) float scores[kBlock];
    int32_t cnt = 0;
    for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t m = std::min<int64_t>(kBlock, end - b);
        slb_dots_level(db + b * dim, m, dim, q, dots, level);
        score_block(dots, db_scales ? db_scales + b : nullptr, query_scale, m, scores, level);
        int64_t j = 0;
        // filling: every row goes in (NaN as -inf)
        for (; j < m && cnt < k; ++j)
            insert_sorted(top, cnt, k, Hit{std::isnan(scores[j]) ? -INFINITY : scores[j], scores[j], b + j});
        // full: only a strictly higher score enters (rows come in index order, so ties keep the lower index)
        while (cnt == k && (j = next_above(scores, j, m, top[k - 1].key, level)) < m) {
            insert_sorted(top, cnt, k, Hit{scores[j], scores[j], b + j});
            ++j;
        }
    }
    *cnt_out = cnt;
}

// Every row's score into out[begin..end).
void score_rows(const int8_t *db, const float *db_scales, int64_t begin, int64_t end, int32_t dim, const int8_t *q,
                float query_scale, float *out, int32_t level) {
    alignas(64) int32_t dots[kBlock];
    for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t m = std::min<int64_t>(kBlock, end - b);
        slb_dots_level(db + b * dim, m, dim, q, dots, level);
        score_block(dots, db_scales ? db_scales + b : nullptr, query_scale, m, out + b, level);
    }
}

// The scan itself (validated arguments). Writes min(k, n) results.
void topk_run(const int8_t *db, const float *db_scales, int64_t n, int32_t dim, const int8_t *q, float query_scale,
              int32_t k, int64_t *idx_out, float *score_out, int32_t *n_out, int32_t level) {
    const int32_t want = static_cast<int32_t>(std::min<int64_t>(k, n));
    if (k <= kSmallK) {
        Hit top[kSmallK];
        int32_t cnt = 0;
        topk_small(db, db_scales, 0, n, dim, q, query_scale, k, top, &cnt, level);
        for (int32_t r = 0; r < want; ++r) {
            idx_out[r] = top[r].idx;
            score_out[r] = top[r].score;
        }
    } else {
        std::vector<float> scores(static_cast<size_t>(n));
        score_rows(db, db_scales, 0, n, dim, q, query_scale, scores.data(), level);
        std::vector<Hit> all(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) all[j] = Hit{std::isnan(scores[j]) ? -INFINITY : scores[j], scores[j], j};
        std::partial_sort(all.begin(), all.begin() + want, all.end(), better);
        for (int32_t r = 0; r < want; ++r) {
            idx_out[r] = all[r].idx;
            score_out[r] = all[r].score;
        }
    }
    *n_out = want;
}

// Symmetric INT8 quantization of one row: scale = max|x| / 127 (1 for a zero row), values rounded half away from
// zero. Returns the scale.
float quantize_row(const float *row, int32_t dim, int64_t i, int8_t *qr) {
    float amax = 0.0f;
    for (int32_t j = 0; j < dim; ++j) {
        if (!std::isfinite(row[j])) invalid("x[" + std::to_string(i) + ", " + std::to_string(j) + "] is not finite");
        amax = std::max(amax, std::fabs(row[j]));
    }
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    // a tiny amax can make amax / 127 underflow to 0; then every x / scale would be inf
    if (!(scale > 0.0f))
        invalid("row " + std::to_string(i) + " is too small to quantize (max |x| = " + std::to_string(amax) + ")");
    for (int32_t j = 0; j < dim; ++j) {
        const float v = std::round(row[j] / scale);  // std::round: halves away from zero
        qr[j] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, v)));
    }
    return scale;
}

// Per-tool scores (see nexus_slb_tool_scores): every row scored once, block by block, then each tool's maximum over
// its rows (rows are grouped by tool: offsets), raised to the floor.
void tool_scores_run(const int8_t *db, const float *db_scales, int64_t n, int32_t dim, const int8_t *q, float qs,
                     const int64_t *offsets, int64_t n_tools, int32_t floor_k, float base, float *out, int32_t level) {
    thread_local std::vector<float> all;
    if (all.size() < static_cast<size_t>(n)) all.resize(static_cast<size_t>(n));
    float *scores = all.data();
    score_rows(db, db_scales, 0, n, dim, q, qs, scores, level);
    for (int64_t t = 0; t < n_tools; ++t) {
        float best = -INFINITY;
        for (int64_t r = offsets[t]; r < offsets[t + 1]; ++r)
            if (all[r] > best) best = all[r];  // an ordered compare: a NaN score never wins
        out[t] = best;
    }
    float lowest = base;
    if (floor_k > 0 && floor_k < n) {
        // the floor_k-th best row score: a tool with no row among the floor_k best is only known to be below it
        // (the top-k scan's view), so every tool is raised to it. NaN ranks lowest.
        for (int64_t r = 0; r < n; ++r)
            if (std::isnan(all[r])) all[r] = -INFINITY;
        std::nth_element(all.begin(), all.begin() + (floor_k - 1), all.begin() + n, std::greater<float>());
        lowest = all[floor_k - 1];
    }
    for (int64_t t = 0; t < n_tools; ++t) out[t] = std::max(out[t], lowest);
}

void check_offsets(const int64_t *offsets, int64_t n_tools, int64_t n) {
    require_ptr(offsets, "tool_offsets");
    if (n_tools < 1) invalid("n_tools must be >= 1, got " + std::to_string(n_tools));
    if (offsets[0] != 0 || offsets[n_tools] != n)
        invalid("tool_offsets must run from 0 to n (" + std::to_string(n) + ")");
    for (int64_t t = 0; t < n_tools; ++t)
        if (offsets[t + 1] < offsets[t]) invalid("tool_offsets must be non-decreasing (at tool " + std::to_string(t) + ")");
}

void check_topk_args(const int8_t *db, int64_t n, int32_t dim, const int8_t *query, float query_scale, int32_t k) {
    check_dims(n, dim);
    if (n > 0) require_ptr(db, "db");
    require_ptr(query, "query");
    if (k < 1) invalid("k must be >= 1, got " + std::to_string(k));
    if (!std::isfinite(query_scale)) invalid("query_scale must be finite");
}

// A float32 dot product in float64: each product of two floats is exact in float64, so the result is the exact dot
// up to the roundings of the additions (far below any float32 difference). Eight partial sums (element j into sum
// j % 8, combined in a fixed tree) keep the additions independent, so the loop is not one long dependency chain;
// the order is the same on every machine.
double dot_f64(const float *x, const float *y, int32_t dim) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t j = 0;
    for (; j + 8 <= dim; j += 8)
        for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(x[j + l]) * static_cast<double>(y[j + l]);
    for (int l = 0; j < dim; ++j, ++l) acc[l] += static_cast<double>(x[j]) * static_cast<double>(y[j]);
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// ||x - scale * q||_2 and ||scale * q||_2 of one quantized row, in float64 (the quantization residual and the
// dequantized row): the two numbers the exact scan's error bound needs per row.
void residual_norms(const float *x, const int8_t *q, float scale, int32_t dim, double *res, double *deq) {
    double r2 = 0.0, d2 = 0.0;
    for (int32_t j = 0; j < dim; ++j) {
        const double dq = static_cast<double>(scale) * static_cast<double>(q[j]);
        const double e = static_cast<double>(x[j]) - dq;
        r2 += e * e;
        d2 += dq * dq;
    }
    *res = std::sqrt(r2);
    *deq = std::sqrt(d2);
}

// Exact top-k by float32 dot products (see nexus_slb_topk_exact). With x = x' + e (x' the dequantized row) and
// y = y' + d (the query), x.y - x'.y' = x'.d + e.y' + e.d, so by Cauchy-Schwarz the INT8 score is off by at most
// bound = |x'| |d| + |e| |y'| + |e| |d| (plus the float32 rounding of the INT8 score, covered by a relative slack).
// The INT8 top-k rows are rescored exactly; their lowest exact score L is a floor under the true k-th best, so a row
// whose INT8 score plus bound stays below L cannot be in the top k; every other row is rescored exactly.
void topk_exact_run(const int8_t *db, const float *db_scales, const float *db_f32, const float *row_norms, int64_t n,
                    int32_t dim, const float *query, int32_t k, int64_t *idx_out, float *score_out, int32_t *n_out,
                    int64_t *n_rescored, int32_t level) {
    thread_local std::vector<int8_t> q;
    thread_local std::vector<float> approx;
    thread_local std::vector<uint8_t> done;
    thread_local std::vector<std::pair<double, int64_t>> exact;
    q.resize(static_cast<size_t>(dim));
    const float qs = quantize_row(query, dim, 0, q.data());
    double q_res = 0.0, q_deq = 0.0;
    residual_norms(query, q.data(), qs, dim, &q_res, &q_deq);
    const int32_t want = static_cast<int32_t>(std::min<int64_t>(k, n));
    exact.clear();
    if (want > 0) {
        if (approx.size() < static_cast<size_t>(n)) approx.resize(static_cast<size_t>(n));
        score_rows(db, db_scales, 0, n, dim, q.data(), qs, approx.data(), level);
        done.assign(static_cast<size_t>(n), 0);
        // the INT8 top k of the scores just computed: insertion into a sorted list, NaN as -inf; once it is full,
        // a SIMD pass skips to the next row that beats its last entry
        thread_local std::vector<Hit> top;
        top.resize(static_cast<size_t>(want));
        int32_t cnt = 0;
        const auto insert = [&](int64_t j) {
            insert_sorted(top.data(), cnt, want, Hit{std::isnan(approx[j]) ? -INFINITY : approx[j], approx[j], j});
        };
        int64_t j = 0;
        for (; j < n && cnt < want; ++j) insert(j);
        while ((j = next_above(approx.data(), j, n, top[want - 1].key, level)) < n) insert(j++);
        double floor = INFINITY;
        for (int32_t r = 0; r < cnt; ++r) {
            const int64_t i = top[r].idx;
            const double v = dot_f64(db_f32 + i * dim, query, dim);
            exact.emplace_back(v, i);
            done[i] = 1;
            floor = std::min(floor, v);
        }
        // A SIMD pass finds the rows above a threshold that the largest bound of any row allows (with the margin
        // that covers the slack below for every row it skips); only those get their own bound.
        // the norms are >= 0, whose float order is their bits' integer order: an integer max the compiler vectorizes
        uint32_t deq_bits = 0, res_bits = 0;
        for (int64_t i = 0; i < n; ++i) {
            uint32_t d, r;
            std::memcpy(&d, row_norms + 2 * i, 4);
            std::memcpy(&r, row_norms + 2 * i + 1, 4);
            deq_bits = std::max(deq_bits, d);
            res_bits = std::max(res_bits, r);
        }
        float deq_max, res_max;
        std::memcpy(&deq_max, &deq_bits, 4);
        std::memcpy(&res_max, &res_bits, 4);
        // (norms not from nexus_slb_row_norms, negative or NaN, turn the shortcut off: every row gets its own test)
        const double bound_max = deq_max >= 0.0f && res_max >= 0.0f
                                     ? deq_max * q_res + res_max * q_deq + res_max * q_res
                                     : INFINITY;
        const double margin = 3e-5 * (std::fabs(floor) + bound_max + 1.0);
        float thr = static_cast<float>(floor - bound_max - margin);
        if (static_cast<double>(thr) > floor - bound_max - margin) thr = std::nextafter(thr, -INFINITY);
        for (int64_t i = next_above(approx.data(), 0, n, thr, level); i < n;
             i = next_above(approx.data(), i + 1, n, thr, level)) {
            if (done[i]) continue;
            const double deq = row_norms[2 * i], res = row_norms[2 * i + 1];
            const double a = static_cast<double>(approx[i]);
            const double bound = deq * q_res + res * q_deq + res * q_res;
            // slack: the float32 rounding of the INT8 score and of the stored norms (relative 1e-6 is ~8 ulps)
            const double slack = 1e-6 * (std::fabs(a) + bound + std::fabs(floor)) + 1e-30;
            if (!(a + bound + slack < floor)) exact.emplace_back(dot_f64(db_f32 + i * dim, query, dim), i);
        }
        std::sort(exact.begin(), exact.end(), [](const auto &x, const auto &y) {
            const double kx = std::isnan(x.first) ? -INFINITY : x.first, ky = std::isnan(y.first) ? -INFINITY : y.first;
            return kx > ky || (kx == ky && x.second < y.second);
        });
    }
    for (int32_t r = 0; r < want; ++r) {
        idx_out[r] = exact[r].second;
        score_out[r] = static_cast<float>(exact[r].first);
    }
    *n_out = want;
    if (n_rescored) *n_rescored = static_cast<int64_t>(exact.size());
}

}  // namespace

void slb_dots_level(const int8_t *db, int64_t n, int32_t dim, const int8_t *query, int32_t *out, int32_t level) {
    switch (level) {
#if defined(__x86_64__)
        case NEXUS_SIMD_AVX2: dots_avx2(db, n, dim, query, out); return;
        case NEXUS_SIMD_AVX512: dots_avx512(db, n, dim, query, out); return;
        case NEXUS_SIMD_AVX512_VNNI: dots_vnni(db, n, dim, query, out); return;
#endif
#if defined(__aarch64__)
        case NEXUS_SIMD_NEON: dots_neon(db, n, dim, query, out); return;
#endif
        default: dots_scalar(db, n, dim, query, out); return;
    }
}

}  // namespace nexus

using namespace nexus;

extern "C" {

int32_t nexus_quantize_i8(const float *x, int64_t n, int32_t dim, int8_t *q_out, float *scales_out) {
    return guard([&] {
        check_dims(n, dim);
        if (n == 0) return;
        require_ptr(x, "x");
        require_ptr(q_out, "q_out");
        require_ptr(scales_out, "scales_out");
        for (int64_t i = 0; i < n; ++i) scales_out[i] = quantize_row(x + i * dim, dim, i, q_out + i * dim);
    });
}

int32_t nexus_slb_dots(const int8_t *db, int64_t n, int32_t dim, const int8_t *query, int32_t *dots_out) {
    return guard([&] {
        check_dims(n, dim);
        if (n == 0) return;
        require_ptr(db, "db");
        require_ptr(query, "query");
        require_ptr(dots_out, "dots_out");
        slb_dots_level(db, n, dim, query, dots_out, simd_level());
    });
}

int32_t nexus_slb_topk(const int8_t *db, const float *db_scales, int64_t n, int32_t dim, const int8_t *query,
                       float query_scale, int32_t k, int64_t *idx_out, float *score_out, int32_t *n_out) {
    return guard([&] {
        check_topk_args(db, n, dim, query, query_scale, k);
        require_ptr(idx_out, "idx_out");
        require_ptr(score_out, "score_out");
        require_ptr(n_out, "n_out");
        topk_run(db, db_scales, n, dim, query, query_scale, k, idx_out, score_out, n_out, simd_level());
    });
}

int32_t nexus_slb_tool_scores(const int8_t *db, const float *db_scales, int64_t n, int32_t dim, const float *query,
                              const int64_t *tool_offsets, int64_t n_tools, int32_t floor_k, float base,
                              float *out) {
    return guard([&] {
        check_dims(n, dim);
        if (n > 0) require_ptr(db, "db");
        require_ptr(query, "query");
        require_ptr(out, "out");
        check_offsets(tool_offsets, n_tools, n);
        if (floor_k < 0) invalid("floor_k must be >= 0, got " + std::to_string(floor_k));
        thread_local std::vector<int8_t> q;
        q.resize(static_cast<size_t>(dim));
        const float qs = quantize_row(query, dim, 0, q.data());
        tool_scores_run(db, db_scales, n, dim, q.data(), qs, tool_offsets, n_tools, floor_k, base, out, simd_level());
    });
}

int32_t nexus_slb_row_norms(const int8_t *db, const float *db_scales, const float *db_f32, int64_t n, int32_t dim,
                            float *out) {
    return guard([&] {
        check_dims(n, dim);
        if (n == 0) return;
        require_ptr(db, "db");
        require_ptr(db_scales, "db_scales");
        require_ptr(db_f32, "db_f32");
        require_ptr(out, "out");
        for (int64_t i = 0; i < n; ++i) {
            double res = 0.0, deq = 0.0;
            residual_norms(db_f32 + i * dim, db + i * dim, db_scales[i], dim, &res, &deq);
            if (!std::isfinite(res) || !std::isfinite(deq)) invalid("row " + std::to_string(i) + " is not finite");
            // rounded up, so the float32 copy never understates the bound
            out[2 * i] = std::nextafter(static_cast<float>(deq), INFINITY);
            out[2 * i + 1] = std::nextafter(static_cast<float>(res), INFINITY);
        }
    });
}

int32_t nexus_slb_topk_exact(const int8_t *db, const float *db_scales, const float *db_f32, const float *row_norms,
                             int64_t n, int32_t dim, const float *query, int32_t k, int64_t *idx_out,
                             float *score_out, int32_t *n_out, int64_t *n_rescored_out) {
    return guard([&] {
        check_dims(n, dim);
        if (n > 0) {
            require_ptr(db, "db");
            require_ptr(db_scales, "db_scales");
            require_ptr(db_f32, "db_f32");
            require_ptr(row_norms, "row_norms");
        }
        require_ptr(query, "query");
        if (k < 1) invalid("k must be >= 1, got " + std::to_string(k));
        require_ptr(idx_out, "idx_out");
        require_ptr(score_out, "score_out");
        require_ptr(n_out, "n_out");
        topk_exact_run(db, db_scales, db_f32, row_norms, n, dim, query, k, idx_out, score_out, n_out, n_rescored_out,
                       simd_level());
    });
}

int32_t nexus_slb_topk_timed(const int8_t *db, const float *db_scales, int64_t n, int32_t dim, const int8_t *query,
                             float query_scale, int32_t k, int32_t n_warmup, int32_t n_reps, double *ns_out) {
    return guard([&] {
        check_topk_args(db, n, dim, query, query_scale, k);
        if (n_warmup < 0) invalid("n_warmup must be >= 0, got " + std::to_string(n_warmup));
        if (n_reps < 1) invalid("n_reps must be >= 1, got " + std::to_string(n_reps));
        require_ptr(ns_out, "ns_out");
        std::vector<int64_t> idx(static_cast<size_t>(k));
        std::vector<float> score(static_cast<size_t>(k));
        int32_t n_got = 0;
        const int32_t level = simd_level();
        for (int32_t r = 0; r < n_warmup; ++r)
            topk_run(db, db_scales, n, dim, query, query_scale, k, idx.data(), score.data(), &n_got, level);
        for (int32_t r = 0; r < n_reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            topk_run(db, db_scales, n, dim, query, query_scale, k, idx.data(), score.data(), &n_got, level);
            const auto t1 = std::chrono::steady_clock::now();
            ns_out[r] = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
        }
    });
}

}  // extern "C"
