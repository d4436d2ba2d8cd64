// A dense layer with float16 weights: y = x @ W + b, x float32 [m, k], W float16 [k, n] stored in panels of 64
// columns (nexus.h), b float32 [n], y float32 [m, n].
//
// Made for the request encoder: a request is a few dozen tokens, so each layer is a skinny product whose cost is
// reading W. Reading it as float16 halves the bytes of a float32 copy, and the conversion happens in registers.
// Every product is exact in float32 (a float16 value times a float32 value); only the order of the float32 sums
// differs between levels, so results agree with the NumPy reference to float32 rounding, not bit for bit.
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

// GCC 12 reports its own _mm512_undefined_* idiom inside the intrinsic headers (reduce_add) as uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common.hpp"
#include "f16.hpp"
#include "simd.hpp"
#include "threads.hpp"

namespace nexus {

namespace {

constexpr int32_t kPanel = 64;  // columns of W per panel (see nexus_linear_f16)

inline const uint16_t *panel_of(const uint16_t *w, int32_t k, int32_t j) {
    return w + static_cast<int64_t>(j / kPanel) * k * kPanel;
}

// BERT's exact GELU, x * Phi(x), with erf by Abramowitz & Stegun 7.1.26 (absolute error under 1.5e-7, float32's own
// resolution): the same formula as the NumPy encoder's.
constexpr float kA1 = 0.254829592f, kA2 = -0.284496736f, kA3 = 1.421413741f, kA4 = -1.453152027f, kA5 = 1.061405429f;
constexpr float kP = 0.3275911f, kRsqrt2 = 0.7071067811865476f;

inline float gelu_scalar(float x) {
    const float z = std::fabs(x) * kRsqrt2;
    const float t = 1.0f / (1.0f + kP * z);
    const float poly = t * (kA1 + t * (kA2 + t * (kA3 + t * (kA4 + t * kA5))));
    const float erf_abs = 1.0f - poly * std::exp(-z * z);
    return 0.5f * x * (1.0f + std::copysign(erf_abs, x));
}

inline void epilogue_scalar(float *y, int32_t n, const float *b, int32_t act) {
    for (int32_t j = 0; j < n; ++j) {
        const float v = y[j] + (b ? b[j] : 0.0f);
        y[j] = act == NEXUS_ACT_GELU ? gelu_scalar(v) : v;
    }
}

void linear_scalar(const float *x, int64_t m, int32_t k, const uint16_t *w, int32_t n, const float *b, int32_t act,
                   float *y) {
    for (int64_t i = 0; i < m; ++i) {
        float *yi = y + i * n;
        for (int32_t j = 0; j < n; ++j) {
            const uint16_t *col = panel_of(w, k, j) + j % kPanel;
            float acc = 0.0f;
            for (int32_t l = 0; l < k; ++l) acc += x[i * k + l] * f16_to_f32(col[static_cast<int64_t>(l) * kPanel]);
            yi[j] = acc;
        }
        epilogue_scalar(yi, n, b, act);
    }
}

#if defined(__x86_64__)
#define NEXUS_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
#define NEXUS_AVX2_FMA_TARGET __attribute__((target("avx2,fma,f16c")))

// exp(x) for x <= 0 (GELU's exp(-z^2)): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p of degree 7 (relative error
// under 1e-8 before rounding); below -87 the result is 0 or a tiny value, as float32's exp gives.
NEXUS_AVX512_TARGET inline __m512 exp_nonpositive_avx512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

NEXUS_AVX512_TARGET inline __m512 gelu_avx512(__m512 x) {
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    const __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(kRsqrt2));
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_set1_ps(kP), z, _mm512_set1_ps(1.0f)));
    __m512 poly = _mm512_fmadd_ps(t, _mm512_set1_ps(kA5), _mm512_set1_ps(kA4));
    poly = _mm512_fmadd_ps(t, poly, _mm512_set1_ps(kA3));
    poly = _mm512_fmadd_ps(t, poly, _mm512_set1_ps(kA2));
    poly = _mm512_fmadd_ps(t, poly, _mm512_set1_ps(kA1));
    poly = _mm512_mul_ps(t, poly);
    const __m512 e = exp_nonpositive_avx512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(z, z)));
    const __m512 erf_abs = _mm512_fnmadd_ps(poly, e, _mm512_set1_ps(1.0f));
    // erf_abs >= 0: copysign is an or of the sign bit (integer ops: AVX-512F has no float or without DQ)
    const __m512 erf = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(erf_abs), sign));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.0f), erf));
}

// One tile: MI rows of x times NJ vectors of 16 output columns. Each step of l broadcasts MI values of x and
// converts NJ vectors of W's row l: MI * NJ multiply-adds, no horizontal sums. The last vector may be partial (mask).
template <int MI, int NJ>
NEXUS_AVX512_TARGET void tile_avx512(const float *x, int32_t k, const uint16_t *w, int32_t n, const float *b,
                                     int32_t act, float *y, __mmask16 last) {
    __m512 acc[MI][NJ];
#pragma GCC unroll 6
    for (int i = 0; i < MI; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NJ; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int32_t l = 0; l < k; ++l) {
        const uint16_t *wl = w + static_cast<int64_t>(l) * kPanel;  // zero-padded: whole vectors are safe to load
        // the panel streams from memory on the first rows of x: ask for it 16 rows (2 KB) ahead
        _mm_prefetch(reinterpret_cast<const char *>(wl + 16 * kPanel), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char *>(wl + 16 * kPanel + 32), _MM_HINT_T0);
        __m512 wv[NJ];
#pragma GCC unroll 4
        for (int j = 0; j < NJ; ++j)
            wv[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(wl + 16 * j)));
#pragma GCC unroll 6
        for (int i = 0; i < MI; ++i) {
            const __m512 xv = _mm512_set1_ps(x[i * k + l]);
#pragma GCC unroll 4
            for (int j = 0; j < NJ; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NJ; ++j) {
        const __mmask16 mask = j + 1 < NJ ? static_cast<__mmask16>(0xFFFF) : last;
        const __m512 bv = b ? _mm512_maskz_loadu_ps(mask, b + 16 * j) : _mm512_setzero_ps();
#pragma GCC unroll 6
        for (int i = 0; i < MI; ++i) {
            const __m512 v = _mm512_add_ps(acc[i][j], bv);
            _mm512_mask_storeu_ps(y + i * n + 16 * j, mask, act == NEXUS_ACT_GELU ? gelu_avx512(v) : v);
        }
    }
}

using Tile512 = void (*)(const float *, int32_t, const uint16_t *, int32_t, const float *, int32_t, float *,
                         __mmask16);

#define NEXUS_ROW(f, mi) {f<mi, 1>, f<mi, 2>, f<mi, 3>, f<mi, 4>}
const Tile512 kTiles512[6][4] = {NEXUS_ROW(tile_avx512, 1), NEXUS_ROW(tile_avx512, 2), NEXUS_ROW(tile_avx512, 3),
                                 NEXUS_ROW(tile_avx512, 4), NEXUS_ROW(tile_avx512, 5), NEXUS_ROW(tile_avx512, 6)};

// Panels of 64 columns (outer), rows of x in blocks of 6 (inner): a panel (k x 64 halves, contiguous) is read from
// memory once, as one stream, and stays in cache while every row of x meets it.
void linear_avx512(const float *x, int64_t m, int32_t k, const uint16_t *w, int32_t n, const float *b, int32_t act,
                   float *y) {
    for (int32_t j = 0; j < n; j += 64) {
        const int32_t cols = std::min<int32_t>(64, n - j);
        const int nj = (cols + 15) / 16;
        const int rem = cols - 16 * (nj - 1);
        const __mmask16 last = static_cast<__mmask16>(rem == 16 ? 0xFFFF : (1u << rem) - 1);
        for (int64_t i = 0; i < m; i += 6) {
            const int mi = static_cast<int>(std::min<int64_t>(6, m - i));
            kTiles512[mi - 1][nj - 1](x + i * k, k, panel_of(w, k, j), n, b ? b + j : nullptr, act, y + i * n + j,
                                      last);
        }
    }
}

// AVX2 + FMA + F16C: tiles of 4 rows times 2 vectors of 8 columns; the columns past the last full 8 in scalar.
template <int MI>
NEXUS_AVX2_FMA_TARGET void tile_avx2(const float *x, int32_t k, const uint16_t *w, int32_t n, float *y) {
    __m256 acc[MI][2];
#pragma GCC unroll 4
    for (int i = 0; i < MI; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int32_t l = 0; l < k; ++l) {
        const uint16_t *wl = w + static_cast<int64_t>(l) * kPanel;
        const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(wl)));
        const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(wl + 8)));
#pragma GCC unroll 4
        for (int i = 0; i < MI; ++i) {
            const __m256 xv = _mm256_broadcast_ss(x + i * k + l);
            acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MI; ++i) {
        _mm256_storeu_ps(y + i * n, acc[i][0]);
        _mm256_storeu_ps(y + i * n + 8, acc[i][1]);
    }
}

using Tile256 = void (*)(const float *, int32_t, const uint16_t *, int32_t, float *);
const Tile256 kTiles256[4] = {tile_avx2<1>, tile_avx2<2>, tile_avx2<3>, tile_avx2<4>};

// The sums first, then bias and activation per row (scalar: this path serves CPUs without AVX-512).
void linear_avx2(const float *x, int64_t m, int32_t k, const uint16_t *w, int32_t n, const float *b, int32_t act,
                 float *y) {
    const int32_t full = n / 16 * 16;
    for (int32_t j = 0; j < full; j += 16)
        for (int64_t i = 0; i < m; i += 4) {
            const int mi = static_cast<int>(std::min<int64_t>(4, m - i));
            kTiles256[mi - 1](x + i * k, k, panel_of(w, k, j) + j % kPanel, n, y + i * n + j);
        }
    for (int64_t i = 0; i < m && full < n; ++i)
        for (int32_t j = full; j < n; ++j) {
            const uint16_t *col = panel_of(w, k, j) + j % kPanel;
            float acc = 0.0f;
            for (int32_t l = 0; l < k; ++l) acc += x[i * k + l] * f16_to_f32(col[static_cast<int64_t>(l) * kPanel]);
            y[i * n + j] = acc;
        }
    for (int64_t i = 0; i < m; ++i) epilogue_scalar(y + i * n, n, b, act);
}

bool has_fma_f16c() noexcept {
    static const bool ok = __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    return ok;
}
#endif

}  // namespace

void linear_f16_level(const float *x, int64_t m, int32_t k, const uint16_t *w, int32_t n, const float *b, int32_t act,
                      float *y, int32_t level) {
#if defined(__x86_64__)
    if (level == NEXUS_SIMD_AVX512 || level == NEXUS_SIMD_AVX512_VNNI) return linear_avx512(x, m, k, w, n, b, act, y);
    if (level == NEXUS_SIMD_AVX2 && has_fma_f16c()) return linear_avx2(x, m, k, w, n, b, act, y);
#endif
    linear_scalar(x, m, k, w, n, b, act, y);
}

void layer_norm(const float *x, const float *residual, int64_t m, int32_t n, const float *gamma, const float *beta,
                float eps, float *y) {
    // two passes in float64 for the mean and variance (a row is a few hundred values: exactness costs nothing)
    for (int64_t i = 0; i < m; ++i) {
        const float *xi = x + i * n;
        const float *ri = residual ? residual + i * n : nullptr;
        float *yi = y + i * n;
        double sum = 0.0;
        for (int32_t j = 0; j < n; ++j) {
            yi[j] = ri ? xi[j] + ri[j] : xi[j];
            sum += yi[j];
        }
        const float mu = static_cast<float>(sum / n);
        double ss = 0.0;
        for (int32_t j = 0; j < n; ++j) {
            const double d = static_cast<double>(yi[j] - mu);
            ss += d * d;
        }
        const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
        for (int32_t j = 0; j < n; ++j) yi[j] = (yi[j] - mu) * inv * gamma[j] + beta[j];
    }
}

// A batch this large (the texts of an index build: a thousand rows and more) is split by rows over threads. Each
// row's sums run in the same order whichever thread makes them, so the result is bit for bit one thread's. A request
// (its texts are a few dozen rows, under 64 rows of MiniLM's widest layer) stays on its one thread, as measured.
constexpr int64_t kThreadMacs = int64_t{1} << 25;
constexpr int64_t kMaxLinearThreads = 8;

void linear_f16_rows(const float *x, int64_t m, int32_t k, const uint16_t *w, int32_t n, const float *b, int32_t act,
                     float *y, int32_t level) {
    const int64_t blocks = (m + 5) / 6;  // rows in blocks of 6, the AVX-512 tile's height
    const int64_t parts = std::min({hardware_threads(), kMaxLinearThreads, blocks, m * k * n / kThreadMacs});
    if (parts <= 1) return linear_f16_level(x, m, k, w, n, b, act, y, level);
    run_on_threads(parts, [&](int64_t p) {
        const int64_t i0 = blocks * p / parts * 6, i1 = std::min(m, blocks * (p + 1) / parts * 6);
        if (i1 > i0) linear_f16_level(x + i0 * k, i1 - i0, k, w, n, b, act, y + i0 * n, level);
    });
}

}  // namespace nexus

using namespace nexus;

extern "C" int32_t nexus_linear_f16(const float *x, int64_t m, int32_t k, const uint16_t *w, int32_t n,
                                    const float *bias, int32_t activation, float *y) {
    return guard([&] {
        if (m < 0) invalid("m must be >= 0, got " + std::to_string(m));
        if (k < 1) invalid("k must be >= 1, got " + std::to_string(k));
        if (n < 1) invalid("n must be >= 1, got " + std::to_string(n));
        if (activation != NEXUS_ACT_NONE && activation != NEXUS_ACT_GELU)
            invalid("activation must be NEXUS_ACT_NONE or NEXUS_ACT_GELU, got " + std::to_string(activation));
        if (m == 0) return;
        require_ptr(x, "x");
        require_ptr(w, "w");
        require_ptr(y, "y");
        linear_f16_rows(x, m, k, w, n, bias, activation, y, simd_level());
    });
}

// Rows in blocks of 64 (at most one panel's lanes) times 64 dims: the block's reads are 64 runs of 128 bytes and its
// writes 64 runs of up to 128 bytes, both within a few cache lines at a time (a plain row-by-row loop writes one
// half per 128-byte stride, which is what NumPy's strided copy does).
extern "C" int32_t nexus_pack_f16_rows(const uint16_t *rows, int64_t n_rows, int32_t k, int64_t col0, int64_t n_cols,
                                       uint16_t *panels) {
    return guard([&] {
        if (n_rows < 0) invalid("n_rows must be >= 0, got " + std::to_string(n_rows));
        if (k < 1) invalid("k must be >= 1, got " + std::to_string(k));
        if (col0 < 0 || n_cols < 1 || col0 + n_rows > n_cols)
            invalid("columns " + std::to_string(col0) + ".." + std::to_string(col0 + n_rows) + " do not fit in " +
                    std::to_string(n_cols));
        if (n_rows == 0) return;
        require_ptr(rows, "rows");
        require_ptr(panels, "panels");
        constexpr int64_t kDims = 64;
        for (int64_t r0 = 0; r0 < n_rows;) {
            const int64_t c0 = col0 + r0;
            const int64_t lanes = std::min<int64_t>(n_rows - r0, kPanel - c0 % kPanel);  // rows in this panel
            uint16_t *panel = panels + (c0 / kPanel) * static_cast<int64_t>(k) * kPanel + c0 % kPanel;
            for (int64_t l0 = 0; l0 < k; l0 += kDims) {
                const int64_t dims = std::min<int64_t>(kDims, k - l0);
                for (int64_t i = 0; i < lanes; ++i) {
                    const uint16_t *src = rows + (r0 + i) * k + l0;
                    uint16_t *dst = panel + l0 * kPanel + i;
                    for (int64_t l = 0; l < dims; ++l) dst[l * kPanel] = src[l];
                }
            }
            r0 += lanes;
        }
    });
}

extern "C" int32_t nexus_layer_norm(const float *x, const float *residual, int64_t m, int32_t n, const float *gamma,
                                    const float *beta, float eps, float *y) {
    return guard([&] {
        if (m < 0) invalid("m must be >= 0, got " + std::to_string(m));
        if (n < 1) invalid("n must be >= 1, got " + std::to_string(n));
        if (!(eps >= 0.0f)) invalid("eps must be >= 0");
        if (m == 0) return;
        require_ptr(x, "x");
        require_ptr(gamma, "gamma");
        require_ptr(beta, "beta");
        require_ptr(y, "y");
        layer_norm(x, residual, m, n, gamma, beta, eps, y);
    });
}
