// The portable F16 conversions must match the F16C instructions bit for bit: every half value, and floats around
// every rounding boundary (ties, subnormals, overflow, NaN).
#include <cstring>

#include "check.hpp"
#include "f16.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("f16c"))) static float hw_to_f32(uint16_t h) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
__attribute__((target("f16c"))) static uint16_t hw_to_f16(float f) {
    return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
#endif

static uint32_t bits_of(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}
static float from_bits(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

int main() {
    // hardware-independent anchors
    CHECK(nexus::f16_to_f32(0x3C00) == 1.0f);
    CHECK(nexus::f16_to_f32(0x0001) == 5.9604644775390625e-08f);  // smallest subnormal 2^-24
    CHECK(nexus::f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(nexus::f32_to_f16(65519.99f) == 0x7BFF);
    CHECK(nexus::f32_to_f16(65520.0f) == 0x7C00);
    CHECK(nexus::f32_to_f16(-0.0f) == 0x8000);
    CHECK(nexus::f32_to_f16(2.9802322387695312e-08f) == 0x0000);  // exactly half the smallest subnormal: to even
    CHECK(nexus::f32_to_f16(2.9802326e-08f) == 0x0001);          // just above the tie
    CHECK(nexus::f32_to_f16(1.0f + 1.0f / 2048) == 0x3C00);      // tie between 1 and 1+2^-10: to even
    CHECK(nexus::f32_to_f16(1.0f + 3.0f / 2048) == 0x3C02);      // tie: to even (up)
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const uint16_t hv = static_cast<uint16_t>(h);
        const float f = nexus::f16_to_f32(hv);
        const bool nan = ((hv >> 10) & 0x1F) == 0x1F && (hv & 0x3FF);
        if (!nan) CHECK(nexus::f32_to_f16(f) == hv);  // every non-NaN half round-trips
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("f16c")) {
        int bad = 0;
        for (uint32_t h = 0; h < 0x10000; ++h)
            if (bits_of(nexus::f16_to_f32(static_cast<uint16_t>(h))) != bits_of(hw_to_f32(static_cast<uint16_t>(h))))
                ++bad;
        CHECK(bad == 0);
        // floats: every half value's neighbourhood (ties and off-by-one ulp), plus random bit patterns
        bad = 0;
        for (uint32_t h = 0; h < 0x10000; ++h) {
            const uint32_t b = bits_of(hw_to_f32(static_cast<uint16_t>(h)));
            for (int64_t d = -2; d <= 2; ++d) {
                for (uint32_t mid : {b, b + 0x1000u}) {  // + half a half-ulp in normal range: the tie points
                    const uint32_t x = static_cast<uint32_t>(static_cast<int64_t>(mid) + d);
                    if (nexus::f32_to_f16(from_bits(x)) != hw_to_f16(from_bits(x))) ++bad;
                }
            }
        }
        Rng rng(42);
        for (int i = 0; i < 2000000; ++i) {
            const auto x = static_cast<uint32_t>(rng.next() >> 32);
            if (nexus::f32_to_f16(from_bits(x)) != hw_to_f16(from_bits(x))) ++bad;
        }
        // every f32 in the half-subnormal range at a stride, where rounding is done by shifting
        for (uint32_t x = 0x33000000u; x < 0x38800000u; x += 97) {
            if (nexus::f32_to_f16(from_bits(x)) != hw_to_f16(from_bits(x))) ++bad;
            if (nexus::f32_to_f16(from_bits(x | 0x80000000u)) != hw_to_f16(from_bits(x | 0x80000000u))) ++bad;
        }
        if (bad) std::fprintf(stderr, "f16 mismatches against F16C: %d\n", bad);
        CHECK(bad == 0);
    }
#endif
    return finish("test_f16");
}
