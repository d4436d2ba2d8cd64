// RoPE re-rotation of F16 K rows by a position delta.
//
// Every path computes, per pair (x0, x1) with the same float cos/sin table:
//     out0 = x0*c - x1*s        out1 = x0*s + x1*c
// as separate IEEE float multiplies and adds (the library is built with -ffp-contract=off so nothing is fused).
// The SIMD NORM path evaluates out0 as x0*c + x1*(-s) and out1 as x1*c + x0*s, which IEEE 754 defines to be the
// same values, so scalar and SIMD results are identical bit for bit (test_rope.cpp checks this).
#include <cmath>
#include <cstring>
#include <string>
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
#include "f16.hpp"
#include "kernels.hpp"
#include "simd.hpp"

namespace nexus {

namespace {

struct Table {
    int32_t half = 0;
    std::vector<float> c, s;    // [half]: per pair index
    std::vector<float> ce, se;  // [n_rot]: NORM layout expanded per element, se = (-s, +s, -s, +s, ...)
};

Table make_table(const RopeParams &p) {
    Table t;
    t.half = p.n_rot / 2;
    t.c.resize(t.half);
    t.s.resize(t.half);
    t.ce.resize(p.n_rot);
    t.se.resize(p.n_rot);
    const double base = p.freq_base;
    const double pos = static_cast<double>(p.delta) * static_cast<double>(p.freq_scale);
    for (int32_t i = 0; i < t.half; ++i) {
        const double theta = pos * std::pow(base, -2.0 * i / p.n_rot);
        t.c[i] = static_cast<float>(std::cos(theta));
        t.s[i] = static_cast<float>(std::sin(theta));
        t.ce[2 * i] = t.c[i];
        t.ce[2 * i + 1] = t.c[i];
        t.se[2 * i] = -t.s[i];
        t.se[2 * i + 1] = t.s[i];
    }
    return t;
}

inline void pair_scalar(const uint16_t *in0, const uint16_t *in1, uint16_t *out0, uint16_t *out1, float c, float s) {
    const float x0 = f16_to_f32(*in0);
    const float x1 = f16_to_f32(*in1);
    const float a = x0 * c - x1 * s;
    const float b = x0 * s + x1 * c;
    *out0 = f32_to_f16(a);
    *out1 = f32_to_f16(b);
}

// Rotates dims [from_pair, half) of one head with the scalar formula (the tail of the SIMD paths too).
inline void head_tail(const uint16_t *x, uint16_t *y, const Table &t, int32_t rope_type, int32_t from_pair) {
    if (rope_type == NEXUS_ROPE_NORM) {
        for (int32_t i = from_pair; i < t.half; ++i)
            pair_scalar(x + 2 * i, x + 2 * i + 1, y + 2 * i, y + 2 * i + 1, t.c[i], t.s[i]);
    } else {
        for (int32_t i = from_pair; i < t.half; ++i)
            pair_scalar(x + i, x + i + t.half, y + i, y + i + t.half, t.c[i], t.s[i]);
    }
}

void rows_scalar(const uint16_t *in, uint16_t *out, int64_t n_heads_total, const RopeParams &p, const Table &t) {
    for (int64_t h = 0; h < n_heads_total; ++h) {
        const uint16_t *x = in + h * p.head_dim;
        uint16_t *y = out + h * p.head_dim;
        head_tail(x, y, t, p.rope_type, 0);
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void rows_avx2(const uint16_t *in, uint16_t *out, int64_t n_heads_total,
                                                      const RopeParams &p, const Table &t) {
    const int32_t half = t.half;
    for (int64_t h = 0; h < n_heads_total; ++h) {
        const uint16_t *x = in + h * p.head_dim;
        uint16_t *y = out + h * p.head_dim;
        int32_t done_pairs = 0;
        if (p.rope_type == NEXUS_ROPE_NORM) {
            int32_t j = 0;
            for (; j + 8 <= p.n_rot; j += 8) {
                const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x + j)));
                const __m256 sw = _mm256_permute_ps(v, 0xB1);  // (x1, x0, x3, x2, ...)
                const __m256 r = _mm256_add_ps(_mm256_mul_ps(v, _mm256_loadu_ps(t.ce.data() + j)),
                                               _mm256_mul_ps(sw, _mm256_loadu_ps(t.se.data() + j)));
                _mm_storeu_si128(reinterpret_cast<__m128i *>(y + j),
                                 _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            }
            done_pairs = j / 2;
        } else {
            int32_t i = 0;
            for (; i + 8 <= half; i += 8) {
                const __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x + i)));
                const __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x + i + half)));
                const __m256 c = _mm256_loadu_ps(t.c.data() + i);
                const __m256 s = _mm256_loadu_ps(t.s.data() + i);
                const __m256 a = _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s));
                const __m256 b = _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c));
                _mm_storeu_si128(reinterpret_cast<__m128i *>(y + i),
                                 _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                _mm_storeu_si128(reinterpret_cast<__m128i *>(y + i + half),
                                 _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            }
            done_pairs = i;
        }
        head_tail(x, y, t, p.rope_type, done_pairs);
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) void rows_avx512(const uint16_t *in, uint16_t *out,
                                                                            int64_t n_heads_total,
                                                                            const RopeParams &p, const Table &t) {
    const int32_t half = t.half;
    for (int64_t h = 0; h < n_heads_total; ++h) {
        const uint16_t *x = in + h * p.head_dim;
        uint16_t *y = out + h * p.head_dim;
        int32_t done_pairs = 0;
        if (p.rope_type == NEXUS_ROPE_NORM) {
            int32_t j = 0;
            for (; j + 16 <= p.n_rot; j += 16) {
                const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + j)));
                const __m512 sw = _mm512_permute_ps(v, 0xB1);
                const __m512 r = _mm512_add_ps(_mm512_mul_ps(v, _mm512_loadu_ps(t.ce.data() + j)),
                                               _mm512_mul_ps(sw, _mm512_loadu_ps(t.se.data() + j)));
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(y + j),
                                    _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            }
            done_pairs = j / 2;
        } else {
            int32_t i = 0;
            for (; i + 16 <= half; i += 16) {
                const __m512 x0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + i)));
                const __m512 x1 =
                    _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + i + half)));
                const __m512 c = _mm512_loadu_ps(t.c.data() + i);
                const __m512 s = _mm512_loadu_ps(t.s.data() + i);
                const __m512 a = _mm512_sub_ps(_mm512_mul_ps(x0, c), _mm512_mul_ps(x1, s));
                const __m512 b = _mm512_add_ps(_mm512_mul_ps(x0, s), _mm512_mul_ps(x1, c));
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(y + i),
                                    _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(y + i + half),
                                    _mm512_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            }
            done_pairs = i;
        }
        head_tail(x, y, t, p.rope_type, done_pairs);
    }
}
#endif

#if defined(__aarch64__)
void rows_neon(const uint16_t *in, uint16_t *out, int64_t n_heads_total, const RopeParams &p, const Table &t) {
    const int32_t half = t.half;
    for (int64_t h = 0; h < n_heads_total; ++h) {
        const uint16_t *x = in + h * p.head_dim;
        uint16_t *y = out + h * p.head_dim;
        int32_t done_pairs = 0;
        if (p.rope_type == NEXUS_ROPE_NORM) {
            int32_t j = 0;
            for (; j + 4 <= p.n_rot; j += 4) {
                const float32x4_t v = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + j)));
                const float32x4_t sw = vrev64q_f32(v);
                const float32x4_t r =
                    vaddq_f32(vmulq_f32(v, vld1q_f32(t.ce.data() + j)), vmulq_f32(sw, vld1q_f32(t.se.data() + j)));
                vst1_u16(y + j, vreinterpret_u16_f16(vcvt_f16_f32(r)));
            }
            done_pairs = j / 2;
        } else {
            int32_t i = 0;
            for (; i + 4 <= half; i += 4) {
                const float32x4_t x0 = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + i)));
                const float32x4_t x1 = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + i + half)));
                const float32x4_t c = vld1q_f32(t.c.data() + i);
                const float32x4_t s = vld1q_f32(t.s.data() + i);
                const float32x4_t a = vsubq_f32(vmulq_f32(x0, c), vmulq_f32(x1, s));
                const float32x4_t b = vaddq_f32(vmulq_f32(x0, s), vmulq_f32(x1, c));
                vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(a)));
                vst1_u16(y + i + half, vreinterpret_u16_f16(vcvt_f16_f32(b)));
            }
            done_pairs = i;
        }
        head_tail(x, y, t, p.rope_type, done_pairs);
    }
}
#endif

}  // namespace

void rope_validate(const RopeParams &p) {
    if (p.n_heads < 1 || p.n_heads > 65536) invalid("n_heads must be in 1..65536, got " + std::to_string(p.n_heads));
    if (p.head_dim < 1 || p.head_dim > 65536)
        invalid("head_dim must be in 1..65536, got " + std::to_string(p.head_dim));
    if (p.n_rot < 0 || p.n_rot % 2 != 0 || p.n_rot > p.head_dim)
        invalid("n_rot must be even and in 0..head_dim (" + std::to_string(p.head_dim) + "), got " +
                std::to_string(p.n_rot));
    if (p.rope_type != NEXUS_ROPE_NORM && p.rope_type != NEXUS_ROPE_NEOX)
        invalid("rope_type must be 0 (NORM) or 2 (NEOX), got " + std::to_string(p.rope_type));
    if (!std::isfinite(p.freq_base) || p.freq_base <= 0.0f)
        invalid("freq_base must be finite and > 0, got " + std::to_string(p.freq_base));
    if (!std::isfinite(p.freq_scale) || p.freq_scale <= 0.0f)
        invalid("freq_scale must be finite and > 0, got " + std::to_string(p.freq_scale));
}

void rope_rotate_level(const uint16_t *in, uint16_t *out, int64_t n_rows, const RopeParams &p, int32_t level) {
    const int64_t row = static_cast<int64_t>(p.n_heads) * p.head_dim;
    const int64_t n_heads_total = n_rows * p.n_heads;
    if (n_rows == 0) return;
    if (p.delta == 0 || p.n_rot == 0) {
        // a zero rotation is an exact copy (also of NaN/Inf, which x*1 - y*0 would not preserve)
        if (in != out) std::memmove(out, in, static_cast<size_t>(n_rows * row) * sizeof(uint16_t));
        return;
    }
    const Table t = make_table(p);
    switch (level) {
#if defined(__x86_64__)
        case NEXUS_SIMD_AVX2: rows_avx2(in, out, n_heads_total, p, t); break;
        case NEXUS_SIMD_AVX512:
        case NEXUS_SIMD_AVX512_VNNI: rows_avx512(in, out, n_heads_total, p, t); break;
#endif
#if defined(__aarch64__)
        case NEXUS_SIMD_NEON: rows_neon(in, out, n_heads_total, p, t); break;
#endif
        default: rows_scalar(in, out, n_heads_total, p, t); break;
    }
    if (p.n_rot < p.head_dim && in != out) {
        const int32_t rest = p.head_dim - p.n_rot;
        for (int64_t h = 0; h < n_heads_total; ++h)
            std::memcpy(out + h * p.head_dim + p.n_rot, in + h * p.head_dim + p.n_rot, rest * sizeof(uint16_t));
    }
}

void rope_rotate(const uint16_t *in, uint16_t *out, int64_t n_rows, const RopeParams &p) {
    rope_rotate_level(in, out, n_rows, p, simd_level());
}

}  // namespace nexus

using namespace nexus;

extern "C" int32_t nexus_rope_rotate_f16(const uint16_t *in, uint16_t *out, int64_t n_rows, int32_t n_heads,
                                         int32_t head_dim, int32_t n_rot, int32_t rope_type, float freq_base,
                                         float freq_scale, int64_t delta) {
    return guard([&] {
        const RopeParams p{n_heads, head_dim, n_rot, rope_type, freq_base, freq_scale, delta};
        rope_validate(p);
        if (n_rows < 0) invalid("n_rows must be >= 0, got " + std::to_string(n_rows));
        if (n_rows == 0) return;
        require_ptr(in, "in");
        require_ptr(out, "out");
        const int64_t row = static_cast<int64_t>(n_heads) * head_dim;
        if (n_rows > INT64_MAX / 2 / row) invalid("n_rows * row size overflows");
        const int64_t bytes = n_rows * row * 2;
        const auto a = reinterpret_cast<uintptr_t>(in), b = reinterpret_cast<uintptr_t>(out);
        if (a != b && a < b + static_cast<uintptr_t>(bytes) && b < a + static_cast<uintptr_t>(bytes))
            invalid("in and out overlap without being the same buffer");
        rope_rotate(in, out, n_rows, p);
    });
}
