// Bit-exact IEEE 754 binary16 <-> binary32 conversion in portable C++. It must agree bit for bit with the F16C
// instructions (vcvtph2ps / vcvtps2ph with round-to-nearest-even) because the scalar and SIMD RoPE paths are
// required to produce identical output; test_f16.cpp checks every half value and many floats against F16C.
#pragma once

#include <cstdint>
#include <cstring>

namespace nexus {

inline float f16_to_f32(uint16_t h) noexcept {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {
            // subnormal half: normalize so the float gets an implicit leading one
            exp = 113;  // float biased exponent of 2^-14
            while ((mant & 0x400u) == 0) {
                mant <<= 1;
                --exp;
            }
            mant &= 0x3FFu;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        // inf, or NaN: F16C quiets a signalling NaN, so set the quiet bit as the hardware does
        bits = sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

inline uint16_t f32_to_f16(float f) noexcept {
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) {
        if (ax == 0x7F800000u) return sign | 0x7C00u;
        // NaN: keep the top payload bits and force quiet, like vcvtps2ph
        return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
    }
    if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds (to even) past 65504: infinity
    const uint32_t e = ax >> 23;
    if (e < 113) {
        // result is a half subnormal (or zero): value = m * 2^(e-150), in units of 2^-24 that is m >> (126 - e)
        if (e < 102) return sign;  // below half of the smallest subnormal
        const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
        const uint32_t shift = 126 - e;  // 14..24
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return static_cast<uint16_t>(sign | r);
    }
    uint32_t h = ((e - 112) << 10) | ((ax >> 13) & 0x3FFu);
    const uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is the right answer
    return static_cast<uint16_t>(sign | h);
}

}  // namespace nexus
