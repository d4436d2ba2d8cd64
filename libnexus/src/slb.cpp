// INT8 semantic lookaside buffer: symmetric quantization, exact int32 dot products and a top-k scan.
//
// Every SIMD path computes the same exact integer dots; scores are then formed by one shared scalar expression,
// ((float)dot * db_scale) * query_scale, so results are identical on every level.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <chrono>
#include <functional>
#include <memory>
#include <new>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

// GCC 12 reports its own _mm512_undefined_* idiom inside the intrinsic headers as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "common.hpp"
#include "kernels.hpp"
#include "simd.hpp"
#include "threads.hpp"

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

// The VNNI panel layout of a prepared SLB (nexus_slb_new): rows in groups of 64, dims padded to a multiple of 4. In
// group g, 4-dim step j holds 256 bytes: four 16-row blocks of 64 bytes, row 16b + r's dims 4j..4j+3 at 64b + 4r,
// each byte stored as db ^ 0x80 (db + 128, the unsigned operand of vpdpbusd); padding is 0x80 (a zero). One
// vpdpbusd then yields 16 rows' partial dots with no horizontal sums, and a scan reads one sequential stream.
constexpr int64_t kPanelRows = 64;

int32_t padded_dim(int32_t dim) { return (dim + 3) / 4 * 4; }

void pack_panels(const int8_t *db, int64_t n, int32_t dim, uint8_t *out) {
    const int64_t dim4 = padded_dim(dim), groups = (n + kPanelRows - 1) / kPanelRows;
    std::memset(out, 0x80, static_cast<size_t>(groups * kPanelRows * dim4));
    const int32_t whole = dim / 4;  // 4-byte words each row has in full; a short last word is padded below
    for (int64_t i = 0; i < n; ++i) {
        uint8_t *lane = out + (i / kPanelRows) * kPanelRows * dim4 + (i % kPanelRows) / 16 * 64 + (i % 16) * 4;
        const int8_t *row = db + i * dim;
        for (int32_t j = 0; j < whole; ++j) {  // a word at a time: one load, one flip, one store
            uint32_t w;
            std::memcpy(&w, row + 4 * j, 4);
            w ^= 0x80808080u;
            std::memcpy(lane + j * 256, &w, 4);
        }
        for (int32_t j = whole * 4; j < dim; ++j)
            lane[(j / 4) * 256 + (j % 4)] = static_cast<uint8_t>(row[j]) ^ 0x80u;
    }
}

// Dots of rows [begin, begin + m) from the panels (begin a multiple of kPanelRows). q4: the query padded to dim4
// bytes and read as int32 words of 4 bytes; corr = 128 * sum(query), the offset the +128 adds to every dot.
NEXUS_VNNI_TARGET void dots_panels(const uint8_t *panels, int64_t begin, int64_t m, int32_t dim4, const int32_t *q4,
                                   int32_t corr, int32_t *out) {
    const __m512i c = _mm512_set1_epi32(corr);
    const int32_t steps = dim4 / 4;
    for (int64_t r = 0; r < m; r += kPanelRows) {
        const uint8_t *p = panels + (begin + r) * dim4;
        // sixteen independent accumulators (four blocks x four phases of the 4-dim steps): vpdpbusd has a latency
        // of several cycles and two issue ports, so fewer chains leave the scan waiting on its own sums
        __m512i acc[4][4];
        for (auto &phase : acc)
            for (auto &a : phase) a = _mm512_setzero_si512();
        int32_t j = 0;
        for (; j + 4 <= steps; j += 4, p += 1024) {
            for (int ph = 0; ph < 4; ++ph) {
                const __m512i qv = _mm512_set1_epi32(q4[j + ph]);
                for (int b = 0; b < 4; ++b)
                    acc[ph][b] = _mm512_dpbusd_epi32(acc[ph][b], _mm512_load_si512(p + ph * 256 + b * 64), qv);
            }
        }
        for (; j < steps; ++j, p += 256) {
            const __m512i qv = _mm512_set1_epi32(q4[j]);
            for (int b = 0; b < 4; ++b) acc[0][b] = _mm512_dpbusd_epi32(acc[0][b], _mm512_load_si512(p + b * 64), qv);
        }
        const __m512i a0 = _mm512_add_epi32(_mm512_add_epi32(acc[0][0], acc[1][0]), _mm512_add_epi32(acc[2][0], acc[3][0]));
        const __m512i a1 = _mm512_add_epi32(_mm512_add_epi32(acc[0][1], acc[1][1]), _mm512_add_epi32(acc[2][1], acc[3][1]));
        const __m512i a2 = _mm512_add_epi32(_mm512_add_epi32(acc[0][2], acc[1][2]), _mm512_add_epi32(acc[2][2], acc[3][2]));
        const __m512i a3 = _mm512_add_epi32(_mm512_add_epi32(acc[0][3], acc[1][3]), _mm512_add_epi32(acc[2][3], acc[3][3]));
        alignas(64) int32_t d[kPanelRows];
        int32_t *dst = m - r >= kPanelRows ? out + r : d;
        _mm512_storeu_si512(dst, _mm512_sub_epi32(a0, c));
        _mm512_storeu_si512(dst + 16, _mm512_sub_epi32(a1, c));
        _mm512_storeu_si512(dst + 32, _mm512_sub_epi32(a2, c));
        _mm512_storeu_si512(dst + 48, _mm512_sub_epi32(a3, c));
        if (dst == d) std::memcpy(out + r, d, static_cast<size_t>(m - r) * sizeof(int32_t));
    }
}

// dots_panels for two queries in one pass: each panel block is loaded once and multiplied with both (a request is
// scored as its text and its value-masked text, and the scan is bound by reading the rows).
NEXUS_VNNI_TARGET void dots_panels2(const uint8_t *panels, int64_t begin, int64_t m, int32_t dim4, const int32_t *qa,
                                    const int32_t *qb, int32_t corr_a, int32_t corr_b, int32_t *out_a,
                                    int32_t *out_b) {
    const __m512i ca = _mm512_set1_epi32(corr_a), cb = _mm512_set1_epi32(corr_b);
    const int32_t steps = dim4 / 4;
    for (int64_t r = 0; r < m; r += kPanelRows) {
        const uint8_t *p = panels + (begin + r) * dim4;
        __m512i a[2][4], b[2][4];  // [phase][block]: sixteen independent accumulators
        for (int ph = 0; ph < 2; ++ph)
            for (int k = 0; k < 4; ++k) a[ph][k] = b[ph][k] = _mm512_setzero_si512();
        int32_t j = 0;
        for (; j + 2 <= steps; j += 2, p += 512) {
            for (int ph = 0; ph < 2; ++ph) {
                const __m512i va = _mm512_set1_epi32(qa[j + ph]), vb = _mm512_set1_epi32(qb[j + ph]);
                for (int k = 0; k < 4; ++k) {
                    const __m512i x = _mm512_load_si512(p + ph * 256 + k * 64);
                    a[ph][k] = _mm512_dpbusd_epi32(a[ph][k], x, va);
                    b[ph][k] = _mm512_dpbusd_epi32(b[ph][k], x, vb);
                }
            }
        }
        if (j < steps) {
            const __m512i va = _mm512_set1_epi32(qa[j]), vb = _mm512_set1_epi32(qb[j]);
            for (int k = 0; k < 4; ++k) {
                const __m512i x = _mm512_load_si512(p + k * 64);
                a[0][k] = _mm512_dpbusd_epi32(a[0][k], x, va);
                b[0][k] = _mm512_dpbusd_epi32(b[0][k], x, vb);
            }
        }
        alignas(64) int32_t da[kPanelRows], db[kPanelRows];
        const bool whole = m - r >= kPanelRows;
        int32_t *oa = whole ? out_a + r : da, *ob = whole ? out_b + r : db;
        for (int k = 0; k < 4; ++k) {
            _mm512_storeu_si512(oa + 16 * k, _mm512_sub_epi32(_mm512_add_epi32(a[0][k], a[1][k]), ca));
            _mm512_storeu_si512(ob + 16 * k, _mm512_sub_epi32(_mm512_add_epi32(b[0][k], b[1][k]), cb));
        }
        if (!whole) {
            std::memcpy(out_a + r, da, static_cast<size_t>(m - r) * sizeof(int32_t));
            std::memcpy(out_b + r, db, static_cast<size_t>(m - r) * sizeof(int32_t));
        }
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

#if defined(__x86_64__)
constexpr int32_t kLaneK = 16;  // up to this k a block's rows are first filtered by its 16 lane maxima

// The lanes of a 16-wide step at j that fall before n.
inline __mmask16 lanes_before(int64_t j, int64_t n) {
    return n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1u);
}

// 16 keys from s[j..m) (NaN and the lanes past m as -inf).
NEXUS_AVX512_TARGET inline __m512 keys16(const float *s, int64_t j, int64_t m) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512 v = _mm512_mask_loadu_ps(ninf, lanes_before(j, m), s + j);
    return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), ninf);
}

// One block's rows s[0..m) (row base + j) into the top-k as topk_small's insertion takes them (k <= kLaneK), without
// visiting the rows that cannot enter. Lane l's maximum over the block is one row, a different row for each lane,
// so the k-th largest of the 16 lane maxima is at most the block's k-th largest score: a row below it has k rows
// of this block strictly above it and is never among the k best. The rows at or above it (about k to 2k of 256 for
// spread scores) are inserted in index order, so the answer is the row-by-row insertion's, ties and NaN included;
// the row-by-row loop spent most of a 250-row scan's selection on mispredicted branches.
NEXUS_AVX512_TARGET void select_block_avx512(const float *s, int64_t m, int64_t base, int32_t k, Hit *top,
                                             int32_t &cnt) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 lanes = ninf;
    for (int64_t j = 0; j < m; j += 16) lanes = _mm512_max_ps(lanes, keys16(s, j, m));
    // The k-th largest lane maximum: the least of the lanes that fewer than k lanes exceed. Each lane's count of
    // greater lanes comes from the 15 rotations of the vector, independent steps rather than k dependent reductions.
    __m512i above = _mm512_setzero_si512();
    const __m512i one = _mm512_set1_epi32(1), lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2,
                                                                      1, 0);
    for (int32_t r = 1; r < 16; ++r) {
        const __m512 other = _mm512_permutexvar_ps(_mm512_and_si512(_mm512_add_epi32(lane, _mm512_set1_epi32(r)),
                                                                    _mm512_set1_epi32(15)), lanes);
        above = _mm512_mask_add_epi32(above, _mm512_cmp_ps_mask(other, lanes, _CMP_GT_OQ), above, one);
    }
    const __mmask16 in_top = _mm512_cmplt_epi32_mask(above, _mm512_set1_epi32(k));
    const float thr = _mm512_mask_reduce_min_ps(in_top, lanes);
    for (int64_t j = 0; j < m; j += 16) {
        const __m512 keys = keys16(s, j, m);
        // masked to the block's rows: a -inf threshold would take the padding lanes too
        uint32_t pick = _mm512_mask_cmp_ps_mask(lanes_before(j, m), keys, _mm512_set1_ps(thr), _CMP_GE_OQ);
        if (cnt == k) pick &= _mm512_cmp_ps_mask(keys, _mm512_set1_ps(top[k - 1].key), _CMP_GT_OQ);
        while (pick) {
            const int32_t l = __builtin_ctz(pick);
            pick &= pick - 1;
            const int64_t r = j + l;
            const float key = std::isnan(s[r]) ? -INFINITY : s[r];
            if (cnt < k || key > top[k - 1].key) insert_sorted(top, cnt, k, Hit{key, s[r], base + r});
        }
    }
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

// The rows a scan reads: the INT8 matrix (row-major) with its scales, and, for a prepared SLB (nexus_slb_new) on
// the VNNI level, the same rows as panels (dots_panels).
struct Rows {
    const int8_t *db;
    const float *scales;  // may be NULL: 1.0 each
    int64_t n;
    int32_t dim;
    const uint8_t *panels;  // NULL: the row-major kernels
};

// One query as the kernels read it: the bytes, and for the panels the same bytes padded to 4-byte words with the
// +128 offset they add to every dot.
struct Query {
    const int8_t *q;
    const int32_t *q4;
    int32_t corr;
};

// The sum of a query's bytes, from its words (zero-padded). Panels exist only on a VNNI CPU, so vpdpbusd (unsigned
// ones times the signed bytes) adds them, 64 bytes a step.
#if defined(__x86_64__)
NEXUS_VNNI_TARGET int32_t sum_padded_query(const int32_t *words, int32_t n_words) {
    __m512i acc = _mm512_setzero_si512();
    const __m512i ones = _mm512_set1_epi8(1);
    for (int32_t w = 0; w < n_words; w += 16)
        acc = _mm512_dpbusd_epi32(acc, ones, _mm512_maskz_loadu_epi32(lanes_before(w, n_words), words + w));
    return _mm512_reduce_add_epi32(acc);
}
#else
int32_t sum_padded_query(const int32_t *words, int32_t n_words) {
    int32_t sum = 0;
    const int8_t *b = reinterpret_cast<const int8_t *>(words);
    for (int32_t j = 0; j < 4 * n_words; ++j) sum += b[j];
    return sum;
}
#endif

Query make_query(const Rows &rows, const int8_t *q, std::vector<int32_t> &words) {
    Query out{q, nullptr, 0};
    if (rows.panels) {
        words.assign(static_cast<size_t>((rows.dim + 3) / 4), 0);
        std::memcpy(words.data(), q, static_cast<size_t>(rows.dim));
        const int32_t sum = sum_padded_query(words.data(), static_cast<int32_t>(words.size()));
        out.q4 = words.data();
        out.corr = 128 * sum;  // |sum| <= 127 * kMaxDim, so 128 * sum fits in int32
    }
    return out;
}

// Exact int32 dots of rows [b, b + m) (b a multiple of kBlock), from the panels where the level can read them.
void rows_dots(const Rows &rows, const Query &query, int64_t b, int64_t m, int32_t *out, int32_t level) {
#if defined(__x86_64__)
    if (rows.panels && level == NEXUS_SIMD_AVX512_VNNI)
        return dots_panels(rows.panels, b, m, padded_dim(rows.dim), query.q4, query.corr, out);
#endif
    slb_dots_level(rows.db + b * rows.dim, m, rows.dim, query.q, out, level);
}

// Top-k (k <= kSmallK) of rows [begin, end) (begin a multiple of kBlock) into top[0..cnt), best first.
void topk_small(const Rows &rows, const Query &query, int64_t begin, int64_t end, float query_scale, int32_t k,
                Hit *top, int32_t *cnt_out, int32_t level) {
    alignas(64) int32_t dots[kBlock];
    alignas(64) float scores[kBlock];
    int32_t cnt = 0;
    for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t m = std::min<int64_t>(kBlock, end - b);
        rows_dots(rows, query, b, m, dots, level);
        score_block(dots, rows.scales ? rows.scales + b : nullptr, query_scale, m, scores, level);
#if defined(__x86_64__)
        // the lane filter pays where the row-by-row loop inserts often: while the top-k is still filling (the first
        // block); after it, that loop's vector search for the next higher score skips most blocks whole
        if (cnt < k && k <= kLaneK && (level == NEXUS_SIMD_AVX512 || level == NEXUS_SIMD_AVX512_VNNI)) {
            select_block_avx512(scores, m, b, k, top, cnt);
            continue;
        }
#endif
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

// A scan this large is split over threads (each part at least this many bytes): one core's loads do not reach the
// memory bandwidth (100,000 x 384 bytes: 29 GB/s on one core, 49 GB/s on two), and a thread costs tens of µs.
constexpr int64_t kThreadBytes = int64_t{8} << 20;
constexpr int64_t kMaxThreads = 8;

int64_t scan_parts(int64_t n, int32_t dim) {
    if (n * dim < 2 * kThreadBytes) return 1;
    return std::max<int64_t>(1, std::min({hardware_threads(), kMaxThreads, n * dim / kThreadBytes}));
}

// part(p, begin, end) for every part p in [0, parts) of the rows [0, n), split in whole blocks in index order, over
// threads as run_on_threads runs them.
template <typename Part>
void run_parts(int64_t n, int64_t parts, const Part &part) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    run_on_threads(parts, [&](int64_t p) {
        part(p, blocks * p / parts * kBlock, std::min(n, blocks * (p + 1) / parts * kBlock));
    });
}

// The scores of rows [begin, end) (begin a multiple of kBlock) into out[begin..end).
void score_range(const Rows &rows, const Query &query, float query_scale, int64_t begin, int64_t end, float *out,
                 int32_t level) {
    alignas(64) int32_t dots[kBlock];
    for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t m = std::min<int64_t>(kBlock, end - b);
        rows_dots(rows, query, b, m, dots, level);
        score_block(dots, rows.scales ? rows.scales + b : nullptr, query_scale, m, out + b, level);
    }
}

// Every row's score into out[0..n), split over threads as the top-k scan splits a scan this large (each row's score
// is computed the same way whatever the split).
void score_rows(const Rows &rows, const Query &query, float query_scale, float *out, int32_t level) {
    run_parts(rows.n, scan_parts(rows.n, rows.dim), [&](int64_t, int64_t begin, int64_t end) {
        score_range(rows, query, query_scale, begin, end, out, level);
    });
}

// score_rows for two queries; one pass over the panels where the level reads them, split over threads as
// score_rows splits it.
void score_rows2(const Rows &rows, const Query &qa, float sa, const Query &qb, float sb, float *out_a, float *out_b,
                 int32_t level) {
#if defined(__x86_64__)
    if (rows.panels && level == NEXUS_SIMD_AVX512_VNNI) {
        run_parts(rows.n, scan_parts(rows.n, rows.dim), [&](int64_t, int64_t begin, int64_t end) {
            alignas(64) int32_t da[kBlock], db[kBlock];
            for (int64_t b = begin; b < end; b += kBlock) {
                const int64_t m = std::min<int64_t>(kBlock, end - b);
                dots_panels2(rows.panels, b, m, padded_dim(rows.dim), qa.q4, qb.q4, qa.corr, qb.corr, da, db);
                score_block(da, rows.scales ? rows.scales + b : nullptr, sa, m, out_a + b, level);
                score_block(db, rows.scales ? rows.scales + b : nullptr, sb, m, out_b + b, level);
            }
        });
        return;
    }
#endif
    score_rows(rows, qa, sa, out_a, level);
    score_rows(rows, qb, sb, out_b, level);
}

// The k <= kSmallK top-k over parts of the rows, one thread each (the caller runs the first), merged by the same
// order a single pass keeps (score descending, then index), so the answer does not depend on the split.
int32_t topk_parallel(const Rows &rows, const Query &query, float query_scale, int32_t k, int64_t parts, Hit *top,
                      int32_t level) {
    std::vector<Hit> found(static_cast<size_t>(parts * k));
    std::vector<int32_t> counts(static_cast<size_t>(parts), 0);
    run_parts(rows.n, parts, [&](int64_t p, int64_t begin, int64_t end) {
        topk_small(rows, query, begin, end, query_scale, k, found.data() + p * k, &counts[p], level);
    });
    std::vector<Hit> merged;
    for (int64_t i = 0; i < parts; ++i) merged.insert(merged.end(), found.begin() + i * k, found.begin() + i * k + counts[i]);
    const int32_t cnt = static_cast<int32_t>(std::min<int64_t>(k, static_cast<int64_t>(merged.size())));
    std::partial_sort(merged.begin(), merged.begin() + cnt, merged.end(), better);
    std::copy(merged.begin(), merged.begin() + cnt, top);
    return cnt;
}

// The scan itself (validated arguments). Writes min(k, n) results.
void topk_run(const Rows &rows, const int8_t *q, float query_scale, int32_t k, int64_t *idx_out, float *score_out,
              int32_t *n_out, int32_t level) {
    thread_local std::vector<int32_t> words;
    const Query query = make_query(rows, q, words);
    const int64_t n = rows.n;
    const int32_t want = static_cast<int32_t>(std::min<int64_t>(k, n));
    if (k <= kSmallK) {
        Hit top[kSmallK];
        int32_t cnt = 0;
        const int64_t parts = scan_parts(n, rows.dim);
        if (parts > 1)
            cnt = topk_parallel(rows, query, query_scale, k, parts, top, level);
        else
            topk_small(rows, query, 0, n, query_scale, k, top, &cnt, level);
        for (int32_t r = 0; r < want; ++r) {
            idx_out[r] = top[r].idx;
            score_out[r] = top[r].score;
        }
    } else {
        std::vector<float> scores(static_cast<size_t>(n));
        score_rows(rows, query, query_scale, scores.data(), level);
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
float quantize_row_scalar(const float *row, int32_t dim, int64_t i, int8_t *qr) {
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

#if defined(__x86_64__)
// The same quantization, 16 values at a time, bit for bit: the division is IEEE on both paths, and rounding half away
// from zero is trunc(v) plus the sign of v where |v - trunc(v)| >= 0.5 (that difference is exact). A row the fast
// path cannot take (a non-finite value, a scale that underflows) goes to the scalar path for its error.
NEXUS_AVX512_TARGET float quantize_row_avx512(const float *row, int32_t dim, int64_t i, int8_t *qr) {
    const __m512 fmax = _mm512_set1_ps(3.402823466e38f);
    __m512 amax_v = _mm512_setzero_ps();
    bool finite = true;
    for (int32_t j = 0; j < dim; j += 16) {
        const __mmask16 m = dim - j >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (dim - j)) - 1);
        const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, row + j));
        finite = finite && _mm512_cmp_ps_mask(a, fmax, _CMP_LE_OQ) == 0xffff;  // NaN compares false
        amax_v = _mm512_max_ps(amax_v, a);
    }
    const float amax = _mm512_reduce_max_ps(amax_v);
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    if (!finite || !(scale > 0.0f)) return quantize_row_scalar(row, dim, i, qr);
    const __m512 s = _mm512_set1_ps(scale), half = _mm512_set1_ps(0.5f);
    const __m512i one_bits = _mm512_castps_si512(_mm512_set1_ps(1.0f)), sign_bit = _mm512_set1_epi32(INT32_MIN);
    const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    for (int32_t j = 0; j < dim; j += 16) {
        const __mmask16 m = dim - j >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (dim - j)) - 1);
        const __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(m, row + j), s);
        const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), half, _CMP_GE_OQ);
        const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(  // +-1 with the sign of v
            one_bits, _mm512_and_si512(_mm512_castps_si512(v), sign_bit)));
        const __m512 r = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mask_add_ps(t, up, t, step)));
        _mm_mask_storeu_epi8(qr + j, m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
    }
    return scale;
}
#endif

float quantize_row(const float *row, int32_t dim, int64_t i, int8_t *qr) {
#if defined(__x86_64__)
    const int32_t level = simd_level();
    if (level == NEXUS_SIMD_AVX512 || level == NEXUS_SIMD_AVX512_VNNI) return quantize_row_avx512(row, dim, i, qr);
#endif
    return quantize_row_scalar(row, dim, i, qr);
}

// Per-tool scores (see nexus_slb_tool_scores): every row scored once, block by block, then each tool's maximum over
// its rows (rows are grouped by tool: offsets), raised to the floor.
// A float's bits as an unsigned key in the float's order (negative floats flipped whole, positive ones with the
// sign bit set), and back.
inline uint32_t order_key(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

inline float from_order_key(uint32_t k) {
    const uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Keeps the keys of keys[i..m) that are at or above v (above: true) or below it, in order, at keys[w..); returns the
// new w, with the kept keys folded into lo and hi (their least and greatest). In place: the write position never
// passes the read position.
int64_t keep_from(uint32_t *keys, int64_t w, int64_t i, int64_t m, uint32_t v, bool above, uint32_t &lo,
                  uint32_t &hi) {
    for (; i < m; ++i) {
        const uint32_t x = keys[i];
        const bool kept = (x >= v) == above;
        keys[w] = x;
        w += kept;  // no branch: a key that is not kept is overwritten by the next one
        lo = std::min(lo, kept ? x : UINT32_MAX);
        hi = std::max(hi, kept ? x : 0u);
    }
    return w;
}

// keep_from over all of keys[0..m): returns how many are kept, and their least and greatest in *lo and *hi.
int64_t keep_scalar(uint32_t *keys, int64_t m, uint32_t v, bool above, uint32_t *lo, uint32_t *hi) {
    *lo = UINT32_MAX;
    *hi = 0;
    return keep_from(keys, 0, 0, m, v, above, *lo, *hi);
}

int64_t count_at_least_scalar(const uint32_t *keys, int64_t n, uint32_t v) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i) c += keys[i] >= v;
    return c;
}

#if defined(__x86_64__)
// Counts in vector lanes (a masked add per 16 keys, two independent sums), not through a scalar popcount chain.
NEXUS_AVX512_TARGET int64_t count_at_least_avx512(const uint32_t *keys, int64_t n, uint32_t v) {
    const __m512i t = _mm512_set1_epi32(static_cast<int32_t>(v)), one = _mm512_set1_epi32(1);
    __m512i c0 = _mm512_setzero_si512(), c1 = c0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        c0 = _mm512_mask_add_epi32(c0, _mm512_cmpge_epu32_mask(_mm512_loadu_si512(keys + i), t), c0, one);
        c1 = _mm512_mask_add_epi32(c1, _mm512_cmpge_epu32_mask(_mm512_loadu_si512(keys + i + 16), t), c1, one);
    }
    for (; i + 16 <= n; i += 16)
        c0 = _mm512_mask_add_epi32(c0, _mm512_cmpge_epu32_mask(_mm512_loadu_si512(keys + i), t), c0, one);
    return _mm512_reduce_add_epi32(_mm512_add_epi32(c0, c1)) + count_at_least_scalar(keys + i, n - i, v);
}

// order_key (NaN as -inf) over all[0..16 * floor(n / 16)) in place, sixteen at a time, with their least and
// greatest key; returns how many it converted (the caller does the rest).
NEXUS_AVX512_TARGET int64_t to_order_keys_avx512(float *all, int64_t n, uint32_t *lo, uint32_t *hi) {
    const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
    const __m512i nan_key = _mm512_set1_epi32(static_cast<int32_t>(order_key(-INFINITY)));
    __m512i vlo = _mm512_set1_epi32(-1), vhi = _mm512_setzero_si512();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(all + i);
        const __m512i u = _mm512_castps_si512(v);
        const __mmask16 neg = _mm512_test_epi32_mask(u, sign);
        __m512i key = _mm512_mask_mov_epi32(_mm512_or_si512(u, sign), neg, _mm512_ternarylogic_epi32(u, u, u, 0x55));
        key = _mm512_mask_mov_epi32(key, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nan_key);
        _mm512_storeu_si512(all + i, key);
        vlo = _mm512_min_epu32(vlo, key);
        vhi = _mm512_max_epu32(vhi, key);
    }
    *lo = std::min(*lo, static_cast<uint32_t>(_mm512_reduce_min_epu32(vlo)));
    *hi = std::max(*hi, static_cast<uint32_t>(_mm512_reduce_max_epu32(vhi)));
    return i;
}

// keep_scalar sixteen keys at a time: the kept lanes compressed into a register and stored whole (a compressing
// store to memory is slow on some cores); the store's extra lanes fall on keys already read.
NEXUS_AVX512_TARGET int64_t keep_avx512(uint32_t *keys, int64_t m, uint32_t v, bool above, uint32_t *lo,
                                        uint32_t *hi) {
    const __m512i t = _mm512_set1_epi32(static_cast<int32_t>(v));
    __m512i vlo = _mm512_set1_epi32(-1), vhi = _mm512_setzero_si512();
    int64_t w = 0, i = 0;
    for (; i + 16 <= m; i += 16) {
        const __m512i x = _mm512_loadu_si512(keys + i);
        const __mmask16 ge = _mm512_cmpge_epu32_mask(x, t);
        const __mmask16 keep = above ? ge : static_cast<__mmask16>(~ge);
        _mm512_storeu_si512(keys + w, _mm512_maskz_compress_epi32(keep, x));
        w += __builtin_popcount(keep);
        vlo = _mm512_mask_min_epu32(vlo, keep, vlo, x);
        vhi = _mm512_mask_max_epu32(vhi, keep, vhi, x);
    }
    *lo = static_cast<uint32_t>(_mm512_reduce_min_epu32(vlo));
    *hi = static_cast<uint32_t>(_mm512_reduce_max_epu32(vhi));
    return keep_from(keys, w, i, m, v, above, *lo, *hi);
}
#endif

// The k-th largest of n floats (1 <= k <= n; NaN counts as -inf), as a radix selection on the floats' order keys:
// each pass splits the keys left at the highest bit where their least and greatest differ, keeps the side that holds
// the answer (compacted in place, with its least and greatest), and the selection stops when the wanted rank is the
// first or last of those left. Each pass reads fewer keys (about half as many, for scores spread over their range).
// Passes are counts and compactions without data-dependent branches. `all` is overwritten.
float kth_largest(float *all, int64_t n, int64_t k, int32_t level) {
    uint32_t *keys = reinterpret_cast<uint32_t *>(all);
    uint32_t lo = UINT32_MAX, hi = 0;
#if defined(__x86_64__)
    const bool wide = level == NEXUS_SIMD_AVX512 || level == NEXUS_SIMD_AVX512_VNNI;
    const int64_t head = wide ? to_order_keys_avx512(all, n, &lo, &hi) : 0;
#else
    const bool wide = false;
    const int64_t head = 0;
    (void)level;
#endif
    for (int64_t i = head; i < n; ++i) {
        const float v = all[i];
        keys[i] = order_key(v == v ? v : -INFINITY);  // NaN ranks lowest
        lo = std::min(lo, keys[i]);
        hi = std::max(hi, keys[i]);
    }
    // invariant: the answer is the k-th largest of keys[0..m), whose least and greatest are lo and hi
    int64_t m = n;
    for (;;) {
        if (k == 1) return from_order_key(hi);
        if (k == m || lo == hi) return from_order_key(lo);
        // the highest bit where lo and hi differ splits the keys left (lo < cand <= hi), so no pass is wasted on a
        // bit they all share
        const int bit = 31 - __builtin_clz(lo ^ hi);
        const uint32_t cand = (hi >> bit) << bit;
#if defined(__x86_64__)
        const int64_t c = wide ? count_at_least_avx512(keys, m, cand) : count_at_least_scalar(keys, m, cand);
#else
        const int64_t c = count_at_least_scalar(keys, m, cand);
#endif
        const bool above = c >= k;
        if (!above) k -= c;
#if defined(__x86_64__)
        m = wide ? keep_avx512(keys, m, cand, above, &lo, &hi) : keep_scalar(keys, m, cand, above, &lo, &hi);
#else
        m = keep_scalar(keys, m, cand, above, &lo, &hi);
#endif
    }
}

#if defined(__x86_64__)
// Sixteen int64 offsets (the lanes of k) as int32 lanes.
NEXUS_AVX512_TARGET inline __m512i offsets16(const int64_t *p, __mmask16 k) {
    const __m256i lo = _mm512_cvtepi64_epi32(_mm512_maskz_loadu_epi64(static_cast<__mmask8>(k), p));
    const __m256i hi = _mm512_cvtepi64_epi32(_mm512_maskz_loadu_epi64(static_cast<__mmask8>(k >> 8), p + 8));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Each tool's best row score, as the scalar loop in reduce_tools finds it (max is exact; a NaN never wins; a tool
// with no row gets -inf), for sixteen tools at once: step j gathers each tool's j-th row. The scalar loop's exit,
// one per tool at a length that varies from tool to tool, mispredicts; here one exit per sixteen tools does.
// Row indices are int32 lanes: the caller keeps n below 2^31.
NEXUS_AVX512_TARGET void tool_maxima_avx512(const float *all, const int64_t *offsets, int64_t n_tools, float *out) {
    const __m512 none = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < n_tools; t += 16) {
        const __mmask16 lanes = lanes_before(t, n_tools);
        const __m512i start = offsets16(offsets + t, lanes);
        const __m512i len = _mm512_sub_epi32(offsets16(offsets + t + 1, lanes), start);
        const int32_t longest = _mm512_mask_reduce_max_epi32(lanes, len);
        __m512 best = none;
        __m512i idx = start;
        for (int32_t j = 0; j < longest; ++j, idx = _mm512_add_epi32(idx, _mm512_set1_epi32(1))) {
            const __mmask16 in = _mm512_mask_cmpgt_epi32_mask(lanes, len, _mm512_set1_epi32(j));
            const __m512 v = _mm512_mask_i32gather_ps(none, in, idx, all, 4);
            best = _mm512_mask_max_ps(best, _mm512_mask_cmp_ps_mask(in, v, v, _CMP_ORD_Q), v, best);
        }
        _mm512_mask_storeu_ps(out + t, lanes, best);
    }
}
#endif

// Each tool's best row score raised to the floor (see nexus_slb_tool_scores), from every row's score; all[0..n) is
// the caller's scratch (overwritten).
void reduce_tools(float *all, int64_t n, const int64_t *offsets, int64_t n_tools, int32_t floor_k, float base,
                  float *out, int32_t level) {
#if defined(__x86_64__)
    if ((level == NEXUS_SIMD_AVX512 || level == NEXUS_SIMD_AVX512_VNNI) && n <= INT32_MAX) {
        tool_maxima_avx512(all, offsets, n_tools, out);
    } else
#endif
        for (int64_t t = 0; t < n_tools; ++t) {
            float best = -INFINITY;
            for (int64_t r = offsets[t]; r < offsets[t + 1]; ++r)
                best = best < all[r] ? all[r] : best;  // an ordered compare: a NaN score never wins; no branch
            out[t] = best;
        }
    float lowest = base;
    if (floor_k > 0 && floor_k < n) {
        // the floor_k-th best row score: a tool with no row among the floor_k best is only known to be below it
        // (the top-k scan's view), so every tool is raised to it. NaN ranks lowest (kth_largest).
        lowest = kth_largest(all, n, floor_k, level);
    }
    for (int64_t t = 0; t < n_tools; ++t) out[t] = std::max(out[t], lowest);
}

void tool_scores_run(const Rows &rows, const int8_t *q, float qs, const int64_t *offsets, int64_t n_tools,
                     int32_t floor_k, float base, float *out, int32_t level) {
    thread_local std::vector<float> all;
    thread_local std::vector<int32_t> words;
    const int64_t n = rows.n;
    if (all.size() < static_cast<size_t>(n)) all.resize(static_cast<size_t>(n));
    score_rows(rows, make_query(rows, q, words), qs, all.data(), level);
    reduce_tools(all.data(), n, offsets, n_tools, floor_k, base, out, level);
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
// up to the roundings of the additions (far below any float32 difference). 32 partial sums (element j into sum
// j % 32, combined in a fixed tree) keep the additions independent: the SIMD path holds them in four vectors, so
// four chains of additions run at once instead of one (with one chain the rescoring waited on the adder's latency:
// ~19 % of an exact scan of 250 rows under perf, Xeon). The order is the same on every machine and every path.
constexpr int kDotSums = 32;

double combine_dot_sums(const double *a) {
    double v[8];
    for (int l = 0; l < 8; ++l) v[l] = (a[l] + a[16 + l]) + (a[8 + l] + a[24 + l]);
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

double dot_f64_scalar(const float *x, const float *y, int32_t dim) {
    double acc[kDotSums] = {};
    for (int32_t j = 0; j < dim; ++j)
        acc[j % kDotSums] += static_cast<double>(x[j]) * static_cast<double>(y[j]);
    return combine_dot_sums(acc);
}

#if defined(__x86_64__)
// The 32 partial sums as the lanes of four vectors (sum j % 32 in vector (j / 8) % 4, lane j % 8), the tail by masked
// adds, and the first step of the combination lane by lane: each sum adds the same products in the same order as the
// scalar loop (no fused multiply-add on either path), so the result is the same bits. The combination stays in this
// function: calling the plain x86-64 helper after 512-bit code cost ~160 ns a call under perf (Xeon).
NEXUS_AVX512_TARGET double dot_f64_avx512(const float *x, const float *y, int32_t dim) {
    __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
    int32_t j = 0;
    for (; j + kDotSums <= dim; j += kDotSums)
        for (int v = 0; v < 4; ++v)
            acc[v] = _mm512_add_pd(acc[v], _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + j + 8 * v)),
                                                         _mm512_cvtps_pd(_mm256_loadu_ps(y + j + 8 * v))));
    for (int v = 0; j < dim; j += 8, ++v) {
        const __mmask8 m = dim - j >= 8 ? __mmask8(0xff) : static_cast<__mmask8>((1u << (dim - j)) - 1);
        const __m512d p = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + j)),
                                        _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, y + j)));
        acc[v] = _mm512_mask_add_pd(acc[v], m, acc[v], p);  // lanes past the end keep their sum untouched
    }
    alignas(64) double l[8];
    _mm512_store_pd(l, _mm512_add_pd(_mm512_add_pd(acc[0], acc[2]), _mm512_add_pd(acc[1], acc[3])));
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}
#endif

double dot_f64(const float *x, const float *y, int32_t dim, int32_t level) {
#if defined(__x86_64__)
    if (level == NEXUS_SIMD_AVX512 || level == NEXUS_SIMD_AVX512_VNNI) return dot_f64_avx512(x, y, dim);
#endif
    return dot_f64_scalar(x, y, dim);
}

// ||x - scale * q||_2 and ||scale * q||_2 of one quantized row, in float64 (the quantization residual and the
// dequantized row): the two numbers the exact scan's error bound needs per row. Eight partial sums, so the additions
// are not one long dependency chain.
void residual_norms_tail(const float *x, const int8_t *q, double sc, int32_t begin, int32_t dim, double *r2,
                         double *d2, double *res, double *deq) {
    for (int32_t j = begin; j < dim; ++j) {
        const double dq = sc * static_cast<double>(q[j]);
        const double e = static_cast<double>(x[j]) - dq;
        r2[j % 8] += e * e;
        d2[j % 8] += dq * dq;
    }
    *res = std::sqrt(((r2[0] + r2[4]) + (r2[2] + r2[6])) + ((r2[1] + r2[5]) + (r2[3] + r2[7])));
    *deq = std::sqrt(((d2[0] + d2[4]) + (d2[2] + d2[6])) + ((d2[1] + d2[5]) + (d2[3] + d2[7])));
}

#if defined(__x86_64__)
// residual_norms with partial sum j % 8 in lane j % 8 of one vector: the same operations in the same order, so the
// same bits (no fused multiply-add: the library is built with -ffp-contract=off).
NEXUS_AVX512_TARGET void residual_norms_avx512(const float *x, const int8_t *q, float scale, int32_t dim,
                                               double *res, double *deq) {
    const double sc = static_cast<double>(scale);
    const __m512d scv = _mm512_set1_pd(sc);
    __m512d r2v = _mm512_setzero_pd(), d2v = _mm512_setzero_pd();
    int32_t j = 0;
    for (; j + 8 <= dim; j += 8) {
        const __m512d xv = _mm512_cvtps_pd(_mm256_loadu_ps(x + j));
        const __m512d qv = _mm512_cvtepi32_pd(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(q + j))));
        const __m512d dq = _mm512_mul_pd(scv, qv);
        const __m512d e = _mm512_sub_pd(xv, dq);
        r2v = _mm512_add_pd(r2v, _mm512_mul_pd(e, e));
        d2v = _mm512_add_pd(d2v, _mm512_mul_pd(dq, dq));
    }
    alignas(64) double r2[8], d2[8];
    _mm512_store_pd(r2, r2v);
    _mm512_store_pd(d2, d2v);
    residual_norms_tail(x, q, sc, j, dim, r2, d2, res, deq);
}
#endif

void residual_norms(const float *x, const int8_t *q, float scale, int32_t dim, double *res, double *deq) {
#if defined(__x86_64__)
    const int32_t level = simd_level();
    if (level == NEXUS_SIMD_AVX512 || level == NEXUS_SIMD_AVX512_VNNI)
        return residual_norms_avx512(x, q, scale, dim, res, deq);
#endif
    double r2[8] = {0, 0, 0, 0, 0, 0, 0, 0}, d2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    residual_norms_tail(x, q, static_cast<double>(scale), 0, dim, r2, d2, res, deq);
}

// The largest dequantized-row norm and residual norm over all rows: the exact scan's bound for rows it need not
// test one by one. (Norms not from nexus_slb_row_norms, negative or NaN, give -1: every row gets its own test.)
struct NormMaxima {
    float deq;
    float res;
};

NormMaxima norm_maxima(const float *row_norms, int64_t n) {
    // the norms are >= 0, whose float order is their bits' integer order: an integer max the compiler vectorizes
    uint32_t deq_bits = 0, res_bits = 0;
    for (int64_t i = 0; i < n; ++i) {
        uint32_t d, r;
        std::memcpy(&d, row_norms + 2 * i, 4);
        std::memcpy(&r, row_norms + 2 * i + 1, 4);
        deq_bits = std::max(deq_bits, d);
        res_bits = std::max(res_bits, r);
    }
    NormMaxima m;
    std::memcpy(&m.deq, &deq_bits, 4);
    std::memcpy(&m.res, &res_bits, 4);
    // a set sign bit (a negative norm) is the largest unsigned value; NaN compares false
    if (!(m.deq >= 0.0f)) m.deq = -1.0f;
    if (!(m.res >= 0.0f)) m.res = -1.0f;
    return m;
}

// Exact top-k by float32 dot products (see nexus_slb_topk_exact). With x = x' + e (x' the dequantized row) and
// y = y' + d (the query), x.y - x'.y' = x'.d + e.y' + e.d, so by Cauchy-Schwarz the INT8 score is off by at most
// bound = |x'| |d| + |e| |y'| + |e| |d| (plus the float32 rounding of the INT8 score, covered by a relative slack).
// The INT8 top-k rows are rescored exactly; their lowest exact score L is a floor under the true k-th best, so a row
// whose INT8 score plus bound stays below L cannot be in the top k; every other row is rescored exactly.
void topk_exact_run(const Rows &rows, const float *db_f32, const float *row_norms, const NormMaxima &maxima,
                    const float *query, int32_t k, int64_t *idx_out, float *score_out, int32_t *n_out,
                    int64_t *n_rescored, int32_t level) {
    const int64_t n = rows.n;
    const int32_t dim = rows.dim;
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
        thread_local std::vector<int32_t> words;
        score_rows(rows, make_query(rows, q.data(), words), qs, approx.data(), level);
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
            const double v = dot_f64(db_f32 + i * dim, query, dim, level);
            exact.emplace_back(v, i);
            done[i] = 1;
            floor = std::min(floor, v);
        }
        // A SIMD pass finds the rows above a threshold that the largest bound of any row allows (with the margin
        // that covers the slack below for every row it skips); only those get their own bound.
        const double bound_max = maxima.deq >= 0.0f && maxima.res >= 0.0f
                                     ? maxima.deq * q_res + maxima.res * q_deq + maxima.res * q_res
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
            if (!(a + bound + slack < floor)) exact.emplace_back(dot_f64(db_f32 + i * dim, query, dim, level), i);
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

// n_reps timed top-k scans after n_warmup untimed ones (the benchmark helpers).
void check_timing_args(int32_t n_warmup, int32_t n_reps) {
    if (n_warmup < 0) invalid("n_warmup must be >= 0, got " + std::to_string(n_warmup));
    if (n_reps < 1) invalid("n_reps must be >= 1, got " + std::to_string(n_reps));
}

// body() n_warmup times untimed, then n_reps times, each run's wall time (ns, steady clock) into ns_out.
template <typename Body>
void time_runs(int32_t n_warmup, int32_t n_reps, double *ns_out, Body &&body) {
    for (int32_t r = 0; r < n_warmup; ++r) body();
    for (int32_t r = 0; r < n_reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        body();
        const auto t1 = std::chrono::steady_clock::now();
        ns_out[r] = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    }
}

void time_topk(const Rows &rows, const int8_t *query, float query_scale, int32_t k, int32_t n_warmup, int32_t n_reps,
               double *ns_out) {
    check_timing_args(n_warmup, n_reps);
    require_ptr(ns_out, "ns_out");
    std::vector<int64_t> idx(static_cast<size_t>(k));
    std::vector<float> score(static_cast<size_t>(k));
    int32_t n_got = 0;
    const int32_t level = simd_level();
    time_runs(n_warmup, n_reps, ns_out,
              [&] { topk_run(rows, query, query_scale, k, idx.data(), score.data(), &n_got, level); });
}

#if defined(__x86_64__)
// The ceilings nexus_slb_floor_timed measures. Both return a value the caller keeps, so nothing is optimized away.
NEXUS_VNNI_TARGET int32_t read_bytes_avx512(const uint8_t *p, int64_t bytes) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 256 <= bytes; i += 256) {
        a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(p + i));
        a1 = _mm512_add_epi32(a1, _mm512_loadu_si512(p + i + 64));
        a2 = _mm512_add_epi32(a2, _mm512_loadu_si512(p + i + 128));
        a3 = _mm512_add_epi32(a3, _mm512_loadu_si512(p + i + 192));
    }
    for (; i + 64 <= bytes; i += 64) a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(p + i));
    return _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
}

NEXUS_VNNI_TARGET int32_t dots_only_avx512(const uint8_t *seed, int64_t n_instr) {
    const __m512i x = _mm512_loadu_si512(seed), y = _mm512_set1_epi32(0x01010101);
    __m512i acc[16];
    for (auto &a : acc) a = _mm512_setzero_si512();
    for (int64_t i = 0; i < n_instr; i += 16)
        for (auto &a : acc) a = _mm512_dpbusd_epi32(a, x, y);
    __m512i s = acc[0];
    for (int j = 1; j < 16; ++j) s = _mm512_add_epi32(s, acc[j]);
    return _mm512_reduce_add_epi32(s);
}
#endif

struct FreeDeleter {
    void operator()(uint8_t *p) const { std::free(p); }
};

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

// A prepared SLB (nexus_slb_create): the caller's rows where they lie, their panels, the exact scan's norm maxima.
struct nexus_slb {
    Rows rows{};  // panels NULL: what a scan reads comes from current()
    const float *f32 = nullptr;
    const float *norms = nullptr;
    NormMaxima maxima{-1.0f, -1.0f};
    bool can_pack = false;  // the CPU has AVX-512 VNNI

    // The rows to scan. The first two scans read them row-major: packing costs more than a scan, and a one-shot
    // route scans once per text of its request (one or two), so the panels are made by the third scan, once,
    // whichever thread gets there first.
    // Without memory for them the scans stay row-major (the same answers).
    Rows current() const {
        Rows r = rows;
        r.panels = ready.load(std::memory_order_acquire);
        if (!r.panels && can_pack && scans.fetch_add(1, std::memory_order_relaxed) >= 2) {
            std::call_once(packing, [this] {
#if defined(__x86_64__)
                const size_t bytes = static_cast<size_t>((rows.n + kPanelRows - 1) / kPanelRows * kPanelRows *
                                                         padded_dim(rows.dim));
                uint8_t *p = static_cast<uint8_t *>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
                if (!p) return;
                pack_panels(rows.db, rows.n, rows.dim, p);
                panels.reset(p);
                ready.store(p, std::memory_order_release);
#endif
            });
            r.panels = ready.load(std::memory_order_acquire);
        }
        return r;
    }

  private:
    mutable std::atomic<int64_t> scans{0};
    mutable std::once_flag packing;
    mutable std::unique_ptr<uint8_t, FreeDeleter> panels;
    mutable std::atomic<const uint8_t *> ready{nullptr};
};

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
        topk_run(Rows{db, db_scales, n, dim, nullptr}, query, query_scale, k, idx_out, score_out, n_out, simd_level());
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
        tool_scores_run(Rows{db, db_scales, n, dim, nullptr}, q.data(), qs, tool_offsets, n_tools, floor_k, base, out,
                        simd_level());
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
        topk_exact_run(Rows{db, db_scales, n, dim, nullptr}, db_f32, row_norms, norm_maxima(row_norms, n), query, k,
                       idx_out, score_out, n_out, n_rescored_out, simd_level());
    });
}

int32_t nexus_slb_topk_timed(const int8_t *db, const float *db_scales, int64_t n, int32_t dim, const int8_t *query,
                             float query_scale, int32_t k, int32_t n_warmup, int32_t n_reps, double *ns_out) {
    return guard([&] {
        check_topk_args(db, n, dim, query, query_scale, k);
        time_topk(Rows{db, db_scales, n, dim, nullptr}, query, query_scale, k, n_warmup, n_reps, ns_out);
    });
}

int32_t nexus_slb_create(const int8_t *db, const float *db_scales, const float *db_f32, const float *row_norms,
                         int64_t n, int32_t dim, nexus_slb **out) {
    return guard([&] {
        require_ptr(out, "out");
        *out = nullptr;
        check_dims(n, dim);
        if (n > 0) require_ptr(db, "db");
        if ((db_f32 == nullptr) != (row_norms == nullptr)) invalid("db_f32 and row_norms go together (both or neither)");
        if (db_f32 && n > 0 && !db_scales) invalid("an exact scan needs db_scales");
        auto slb = std::make_unique<nexus_slb>();
        slb->rows = Rows{db, db_scales, n, dim, nullptr};
        slb->f32 = db_f32;
        slb->norms = row_norms;
        slb->maxima = row_norms ? norm_maxima(row_norms, n) : NormMaxima{-1.0f, -1.0f};
#if defined(__x86_64__)
        slb->can_pack = n > 0 && simd_level_runnable(NEXUS_SIMD_AVX512_VNNI);
#endif
        *out = slb.release();
    });
}

void nexus_slb_free(nexus_slb *slb) { delete slb; }

int32_t nexus_slb_scan_topk(const nexus_slb *slb, const int8_t *query, float query_scale, int32_t k, int64_t *idx_out,
                            float *score_out, int32_t *n_out) {
    return guard([&] {
        require_ptr(slb, "slb");
        check_topk_args(slb->rows.db, slb->rows.n, slb->rows.dim, query, query_scale, k);
        require_ptr(idx_out, "idx_out");
        require_ptr(score_out, "score_out");
        require_ptr(n_out, "n_out");
        topk_run(slb->current(), query, query_scale, k, idx_out, score_out, n_out, simd_level());
    });
}

int32_t nexus_slb_scan_topk_exact(const nexus_slb *slb, const float *query, int32_t k, int64_t *idx_out,
                                  float *score_out, int32_t *n_out, int64_t *n_rescored_out) {
    return guard([&] {
        require_ptr(slb, "slb");
        if (!slb->f32 && slb->rows.n > 0) invalid("this SLB was created without its float32 rows: no exact scan");
        require_ptr(query, "query");
        if (k < 1) invalid("k must be >= 1, got " + std::to_string(k));
        require_ptr(idx_out, "idx_out");
        require_ptr(score_out, "score_out");
        require_ptr(n_out, "n_out");
        topk_exact_run(slb->current(), slb->f32, slb->norms, slb->maxima, query, k, idx_out, score_out, n_out,
                       n_rescored_out, simd_level());
    });
}

int32_t nexus_slb_scan_tool_scores(const nexus_slb *slb, const float *query, const int64_t *tool_offsets,
                                   int64_t n_tools, int32_t floor_k, float base, float *out) {
    return guard([&] {
        require_ptr(slb, "slb");
        require_ptr(query, "query");
        require_ptr(out, "out");
        check_offsets(tool_offsets, n_tools, slb->rows.n);
        if (floor_k < 0) invalid("floor_k must be >= 0, got " + std::to_string(floor_k));
        thread_local std::vector<int8_t> q;
        q.resize(static_cast<size_t>(slb->rows.dim));
        const float qs = quantize_row(query, slb->rows.dim, 0, q.data());
        tool_scores_run(slb->current(), q.data(), qs, tool_offsets, n_tools, floor_k, base, out, simd_level());
    });
}

int32_t nexus_slb_scan_request(const nexus_slb *slb, const float *queries, int32_t n_texts, const int64_t *tool_offsets,
                               int64_t n_tools, int32_t floor_k, float base, const nexus_postings *const *tokens,
                               const int64_t *token_offsets, double lex_weight, double *out) {
    return guard([&] {
        require_ptr(slb, "slb");
        require_ptr(queries, "queries");
        require_ptr(out, "out");
        if (n_texts < 1) invalid("n_texts must be >= 1, got " + std::to_string(n_texts));
        check_offsets(tool_offsets, n_tools, slb->rows.n);
        if (floor_k < 0) invalid("floor_k must be >= 0, got " + std::to_string(floor_k));
        const bool with_lex = lex_weight > 0;
        if (with_lex) {
            require_ptr(token_offsets, "token_offsets");
            if (token_offsets[0] != 0) invalid("token_offsets must start at 0");
            for (int32_t t = 0; t < n_texts; ++t)
                if (token_offsets[t + 1] < token_offsets[t]) invalid("token_offsets must be non-decreasing");
            const int64_t n_tok = token_offsets[n_texts];
            if (n_tok > 0) require_ptr(tokens, "tokens");
            for (int64_t j = 0; j < n_tok; ++j) {
                const nexus_postings *p = tokens[j];
                if (!p) continue;  // a token no tool holds
                if (p->count < 0) invalid("a token's count must be >= 0");
                if (p->count > 0 && (!p->docs || !p->terms)) invalid("a token's postings are NULL");
                for (int64_t e = 0; e < p->count; ++e)
                    if (p->docs[e] < 0 || p->docs[e] >= n_tools)
                        invalid("token " + std::to_string(j) + " names tool " + std::to_string(p->docs[e]) +
                                " outside 0.." + std::to_string(n_tools - 1));
            }
        }
        const int32_t dim = slb->rows.dim;
        const int64_t n = slb->rows.n;
        thread_local std::vector<int8_t> q;
        thread_local std::vector<float> rows_a, rows_b, dense;
        thread_local std::vector<double> bm25;
        thread_local std::vector<int32_t> words_a, words_b;
        q.resize(static_cast<size_t>(2 * dim));
        rows_a.resize(static_cast<size_t>(n));
        rows_b.resize(static_cast<size_t>(n));
        dense.resize(static_cast<size_t>(n_tools));
        if (with_lex) bm25.resize(static_cast<size_t>(n_tools));
        const Rows rows = slb->current();
        const int32_t level = simd_level();
        // one text's fused scores into out: dense + (lex_weight * b) / max(b), as scoring.fuse writes it
        const auto fuse = [&](int32_t t, float *row_scores) {
            reduce_tools(row_scores, n, tool_offsets, n_tools, floor_k, base, dense.data(), level);
            double m = 0.0;
            if (with_lex) {
                std::fill(bm25.begin(), bm25.end(), 0.0);
                for (int64_t j = token_offsets[t]; j < token_offsets[t + 1]; ++j) {  // BM25.scores' order of additions
                    const nexus_postings *p = tokens[j];
                    if (p)
                        for (int64_t e = 0; e < p->count; ++e) bm25[p->docs[e]] += p->terms[e];
                }
                m = -INFINITY;
                for (int64_t i = 0; i < n_tools; ++i) m = std::max(m, bm25[i]);
            }
            // the same expressions as scoring.fuse, in loops without branches so that they run in vector lanes
            const float *d = dense.data();
            const double *b = bm25.data();
            if (with_lex && m > 0) {
                if (t == 0)
                    for (int64_t i = 0; i < n_tools; ++i) out[i] = static_cast<double>(d[i]) + (lex_weight * b[i]) / m;
                else
                    for (int64_t i = 0; i < n_tools; ++i)
                        out[i] = out[i] + (static_cast<double>(d[i]) + (lex_weight * b[i]) / m);
            } else {
                const double zero = with_lex ? 0.0 : -0.0;  // with_lex adds 0.0 (a -0.0 score becomes +0.0), as fuse
                if (t == 0)
                    for (int64_t i = 0; i < n_tools; ++i) out[i] = static_cast<double>(d[i]) + zero;
                else
                    for (int64_t i = 0; i < n_tools; ++i) out[i] = out[i] + (static_cast<double>(d[i]) + zero);
            }
        };
        for (int32_t t = 0; t < n_texts; t += 2) {
            const float sa = quantize_row(queries + static_cast<int64_t>(t) * dim, dim, t, q.data());
            const Query qa = make_query(rows, q.data(), words_a);
            if (t + 1 < n_texts) {  // two texts, one pass over the rows
                const float sb = quantize_row(queries + static_cast<int64_t>(t + 1) * dim, dim, t + 1, q.data() + dim);
                const Query qb = make_query(rows, q.data() + dim, words_b);
                score_rows2(rows, qa, sa, qb, sb, rows_a.data(), rows_b.data(), level);
                fuse(t, rows_a.data());
                fuse(t + 1, rows_b.data());
            } else {
                score_rows(rows, qa, sa, rows_a.data(), level);
                fuse(t, rows_a.data());
            }
        }
        if (n_texts > 1)
            for (int64_t i = 0; i < n_tools; ++i) out[i] = out[i] / static_cast<double>(n_texts);
    });
}

int32_t nexus_slb_scan_topk_packed(const nexus_scan_topk_args *a) {
    if (!a) return guard([] { require_ptr(nullptr, "args"); });
    return nexus_slb_scan_topk(a->slb, a->query, a->query_scale, a->k, a->idx_out, a->score_out, a->n_out);
}

int32_t nexus_slb_scan_topk_exact_packed(const nexus_scan_topk_exact_args *a) {
    if (!a) return guard([] { require_ptr(nullptr, "args"); });
    return nexus_slb_scan_topk_exact(a->slb, a->query, a->k, a->idx_out, a->score_out, a->n_out, a->n_rescored_out);
}

int32_t nexus_slb_scan_request_packed(const nexus_scan_request_args *a) {
    if (!a) return guard([] { require_ptr(nullptr, "args"); });
    return nexus_slb_scan_request(a->slb, a->queries, a->n_texts, a->tool_offsets, a->n_tools, a->floor_k, a->base,
                                  a->tokens, a->token_offsets, a->lex_weight, a->out);
}

int32_t nexus_slb_floor_timed(const nexus_slb *slb, int32_t n_warmup, int32_t n_reps, double *read_ns_out,
                              double *dots_ns_out) {
    return guard([&] {
        require_ptr(slb, "slb");
        check_timing_args(n_warmup, n_reps);
        require_ptr(read_ns_out, "read_ns_out");
        require_ptr(dots_ns_out, "dots_ns_out");
        std::fill(read_ns_out, read_ns_out + n_reps, 0.0);
        std::fill(dots_ns_out, dots_ns_out + n_reps, 0.0);
#if defined(__x86_64__)
        if (simd_level() != NEXUS_SIMD_AVX512_VNNI || slb->rows.n == 0) return;
        slb->current();  // as a warm scanner reads the rows (the panels made)
        slb->current();
        const Rows rows = slb->current();
        const uint8_t *bytes = rows.panels ? rows.panels : reinterpret_cast<const uint8_t *>(rows.db);
        const int64_t size = rows.panels ? (rows.n + kPanelRows - 1) / kPanelRows * kPanelRows * padded_dim(rows.dim)
                                         : rows.n * rows.dim;
        if (size < 64) return;
        const int64_t n_instr = (size + 63) / 64;
        volatile uint32_t sink = 0;  // unsigned: the sums wrap, as the vector adds do
        time_runs(n_warmup, n_reps, read_ns_out,
                  [&] { sink = sink + static_cast<uint32_t>(read_bytes_avx512(bytes, size)); });
        time_runs(n_warmup, n_reps, dots_ns_out,
                  [&] { sink = sink + static_cast<uint32_t>(dots_only_avx512(bytes, n_instr)); });
#endif
    });
}

int32_t nexus_slb_scan_topk_timed(const nexus_slb *slb, const int8_t *query, float query_scale, int32_t k,
                                  int32_t n_warmup, int32_t n_reps, double *ns_out) {
    return guard([&] {
        require_ptr(slb, "slb");
        check_topk_args(slb->rows.db, slb->rows.n, slb->rows.dim, query, query_scale, k);
        slb->current();  // as a warm scanner reads the rows (the panels made)
        slb->current();
        time_topk(slb->current(), query, query_scale, k, n_warmup, n_reps, ns_out);
    });
}

}  // extern "C"
